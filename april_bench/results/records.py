"""Tidy records: one row per request segment, per sample fate, per step.

Every table and metric in april-bench is a pure function of these rows
(:mod:`april_bench.results.summary`), and the rows are written as JSON Lines
next to the run's config and provenance, so a reader can recompute anything.
Times are seconds on the arm's clock (virtual for the simulator), measured
from the start of the arm.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from april_bench.types import Group

__all__ = ["EvalRecord", "Fate", "RequestRecord", "RunRecorder", "SampleRecord", "StepRecord"]


class Fate(enum.StrEnum):
    """What finally happened to a sample.  Every launched prompt ends in exactly one fate."""

    TRAINED = "trained"
    DROPPED = "dropped"
    BUFFERED = "buffered"  # still in the carry-over buffer when the run ended


@dataclass(slots=True)
class RequestRecord:
    """One engine request: a fresh start or a resume of a partial response."""

    arm: str
    step: int
    request_id: str
    group_uid: int
    sample_index: int
    prompt_len: int
    #: Response tokens the sample already had when this request was sent (0 = fresh start).
    prefix_len: int
    max_new_tokens: int
    output_len: int
    finish_reason: str
    policy_version: int
    t_submit: float
    t_first_token: float | None
    t_done: float
    replica: int
    num_retractions: int


@dataclass(slots=True)
class SampleRecord:
    """The fate of one sample: trained, dropped (with why), or left in the buffer."""

    arm: str
    step: int
    group_uid: int
    sample_index: int
    fate: str
    reason: str
    prompt_len: int
    response_len: int
    status: str
    reward: float | None
    start_step: int | None
    abort_count: int
    #: Per-token policy versions, run-length encoded: [[version, n_tokens], ...].
    version_runs: list[list[int]]
    #: Policy version the sample was trained at (``None`` unless trained).
    train_version: int | None
    off_policy_tokens: int
    #: Tokens this sample generated and threw away when a cap restarted it.
    discarded_tokens: int


@dataclass(slots=True)
class StepRecord:
    """One training step of one arm."""

    arm: str
    step: int
    policy_version: int
    t_start: float
    rollout_time_s: float
    train_time_s: float
    weight_sync_time_s: float
    step_time_s: float
    #: Time from the N-th accepted group to the end of the abort drain.
    drain_time_s: float
    launched_groups: int
    new_prompts: int
    resumed_groups: int
    accepted_groups: int
    rejected_groups: int
    rejected_tokens: int
    dropped_groups: int
    dropped_tokens: int
    buffered_groups: int
    buffered_tokens: int
    partial_samples: int
    restarted_samples: int
    restart_tokens: int
    requests: int
    aborted_requests: int
    abort_rounds: int
    generated_tokens: int
    trained_tokens: int
    off_policy_tokens: int
    peak_concurrency: int
    mean_context: float
    saturated_tokens_per_s: float | None
    #: Real CPU seconds the rollout loop and strategy spent on their own bookkeeping.
    bookkeeping_s: float
    #: Held-out accuracy after this step's update, when it was evaluated.
    accuracy: float | None = None
    #: The trainer's metrics for this step (loss, entropy, grad norm, ...; empty in simulation).
    train_metrics: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class EvalRecord:
    """One held-out evaluation of an arm's policy, on the arm's training clock (evaluation time excluded)."""

    arm: str
    #: Training steps completed before this evaluation (0 = the starting policy).
    step: int
    policy_version: int
    train_time_s: float
    accuracy: float
    #: Standard error of the accuracy over evaluation problems.
    accuracy_stderr: float
    n: int
    mean_response_len: float
    eval_time_s: float
    #: Per evaluation set (math runs): ``{name: {"accuracy", "stderr", "problems"}}``; empty otherwise.
    by_dataset: dict[str, dict[str, float]] = field(default_factory=dict)


def as_row(record: Any) -> dict[str, Any]:
    """A record as a plain dict (enums to values)."""
    row = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    for key, value in row.items():
        if isinstance(value, enum.Enum):
            row[key] = value.value
    return row


class RunRecorder:
    """Collects the rows of one run, for every arm, in memory."""

    def __init__(self) -> None:
        self.requests: list[RequestRecord] = []
        self.samples: list[SampleRecord] = []
        self.steps: list[StepRecord] = []
        self.evals: list[EvalRecord] = []

    def sample_fates(
        self,
        arm: str,
        groups: list[Group],
        *,
        step: int,
        fate: Fate,
        reason: str,
        train_version: int | None = None,
    ) -> None:
        """Record one fate row per sample of ``groups``."""
        for group in groups:
            for s in group.samples:
                runs = s.version_runs()
                off = sum(n for v, n in runs if train_version is not None and v < train_version)
                self.samples.append(
                    SampleRecord(
                        arm=arm,
                        step=step,
                        group_uid=group.uid,
                        sample_index=s.index,
                        fate=fate.value,
                        reason=reason,
                        prompt_len=s.prompt.length,
                        response_len=s.response_len,
                        status=s.status.value,
                        reward=s.reward,
                        start_step=s.start_step,
                        abort_count=s.abort_count,
                        version_runs=[[v, n] for v, n in runs],
                        train_version=train_version,
                        off_policy_tokens=off,
                        discarded_tokens=s.discarded_tokens,
                    )
                )
