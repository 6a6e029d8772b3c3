"""Tidy records: one row per request segment, sample fate, step, evaluation, engine metric, trace sample.

Every table and metric in april-bench is a pure function of these rows
(:mod:`april_bench.results.summary`), and the rows are written as JSON Lines
next to the run's config and provenance, so a reader can recompute anything.
Times are seconds on the arm's clock (virtual for the simulator), measured
from the start of the arm.

:data:`TABLES` names every table and its record type: adding a table is one
line there; the recorder (:mod:`april_bench.results.recorder`), the run directory and ``report``
take it from there.  This module is a fact: it imports nothing of the package but other records.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from april_bench.telemetry.records import TelemetryRecord

__all__ = [
    "TABLES",
    "EngineMetricRecord",
    "EvalRecord",
    "EventRecord",
    "Fate",
    "IterationRecord",
    "RequestRecord",
    "SampleRecord",
    "StepRecord",
    "TraceRecord",
    "as_row",
]


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
    #: Which repetition of the arm (``--repeats``); 0 for a single run.
    repeat: int = 0


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
    repeat: int = 0
    #: A multi-turn episode's tokens appended by its environment (in ``response_len``, not generated).
    observation_tokens: int = 0
    #: A multi-turn episode: turns, environment calls and seconds, the steps its requests ran in, and
    #: the environment state it ended (or was buffered) with; ``None`` for a plain sample.
    episode: dict[str, Any] | None = None


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
    repeat: int = 0
    #: A warm-up step (``--warmup-steps``): run and recorded, left out of the paired gain statistics.
    warmup: bool = False
    #: The engine's own work during this step's rollout (``None``: the engine does not count it;
    #: :class:`april_bench.engines.protocol.EngineWork`): forward passes, of them decode steps, the
    #: tokens those decode steps sampled (/ decode_iterations = mean batch occupancy), input tokens
    #: prefilled, and of them those of resumed requests (prompt + partial response, computed again).
    engine_iterations: int | None = None
    decode_iterations: int | None = None
    decode_tokens: int | None = None
    prefill_tokens: int | None = None
    reprefill_tokens: int | None = None
    #: True when the counts depend only on the requests and seeds (april-bench's engines); False
    #: when the engine's schedule depends on timing (vLLM).
    work_deterministic: bool | None = None
    #: Multi-turn episodes (docs/agents.md): environment calls answered in this step, the loop-clock
    #: seconds they took (summed over calls, so overlapping calls count each), and the observation
    #: tokens they appended (prefilled by the next turn, never generated or trained).
    env_calls: int = 0
    env_time_s: float = 0.0
    observation_tokens: int = 0
    #: Environment calls cancelled at the stop (``env_calls_at_stop=cancel``; made again on resume).
    env_cancelled: int = 0
    #: ``--colocate``: seconds the engine took to release its memory before training and to take it
    #: back after (sleep + wake-up; the weight push after it is ``weight_sync_time_s``); 0 otherwise.
    switch_time_s: float = 0.0


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
    #: Per evaluation set: ``{name: {"accuracy", "stderr", "problems"}}``.
    by_dataset: dict[str, dict[str, float]] = field(default_factory=dict)
    repeat: int = 0
    #: The arm whose evaluation of the same starting policy this row repeats (evaluated once per run:
    #: same weights, engine and seeds give the same numbers); ``None``: evaluated in this arm.
    reused_from: str | None = None


@dataclass(slots=True)
class EngineMetricRecord:
    """One snapshot of an engine's own counters and gauges (the ``EngineMetrics`` capability),
    taken at a step boundary: ``phase`` is ``rollout_end`` (before the weight update) or ``step_end``."""

    arm: str
    step: int
    phase: str
    t: float
    metrics: dict[str, float]
    repeat: int = 0


@dataclass(slots=True)
class IterationRecord:
    """One engine scheduler round during a step's rollout (engines with the ``iterations``
    capability: hf), a bounded sample of them: when a step has more than
    ``ITERATION_ROWS_PER_STEP`` rounds, every ``sampled_every``-th is kept (each row stands for that
    many).  ``t`` on the arm's clock (the requests' clock); ``kind``: ``prefill`` or ``decode``;
    ``batch``: requests in the forward (a prefill: running after it); ``tokens``: tokens it computed;
    ``context``: KV tokens the batch held (a decode); ``steps``: decode steps the round read (the
    static path pipelines them), ``step_ms``: its wall time per step (per round for a prefill);
    ``cpu_s``: the scheduler thread's CPU time."""

    arm: str
    step: int
    t: float
    kind: str
    batch: int
    tokens: int
    context: int
    steps: int
    step_ms: float
    cpu_s: float
    sampled_every: int = 1
    repeat: int = 0


@dataclass(slots=True)
class EventRecord:
    """A moment in an arm's life on the run's wall clock (``t``: seconds since the run started,
    ``time.monotonic`` based; virtual seconds for a simulated run), the clock telemetry samples use.
    ``kind``: ``arm_start``, ``rollout_start``, ``rollout_stop`` (N groups in: the abort begins),
    ``rollout_end``, ``train_start``, ``train_end``, ``weight_sync_start``, ``weight_sync_end``,
    ``eval_start``, ``eval_end``, ``arm_end``; ``--colocate`` adds ``engine_sleep_start``,
    ``engine_sleep_end``, ``engine_wake_start``, ``engine_wake_end``; a replica pool adds
    ``replica_placed`` (``detail``: the Ray node) and, handling failures, ``fault_injected``,
    ``replica_failed``, ``requests_requeued`` (``tokens``: re-prefilled), ``replica_restarted``,
    ``replica_restart_failed``, ``replica_lost_all`` (:mod:`april_bench.engines.replicas`), with the
    replica, the requests and tokens concerned and a reason in ``detail``."""

    arm: str
    step: int
    kind: str
    t: float
    repeat: int = 0
    replica: int | None = None
    requests: int | None = None
    tokens: int | None = None
    detail: str | None = None


@dataclass(slots=True)
class TraceRecord:
    """One finished sample as the run's *trace* (``docs/whatif.md``): what ``whatif`` replays.

    Written for every sample that finished generating (completed or truncated), whatever its fate
    (trained, rejected by the filter, discarded as surplus, buffered at the end), so the trace keeps
    the groups, the rewards the filter saw and the order of steps.  ``prompt_id`` is the group's uid in
    this arm; a group is the rows sharing ``(step, prompt_id)``."""

    arm: str
    step: int
    prompt_id: str
    sample_index: int
    prompt_tokens: int
    response_tokens: int
    #: ``stop`` (the response ended by itself) or ``truncated`` (it hit the response limit).
    finish: str
    reward: float | None
    repeat: int = 0


#: Every table of a run, in the order they are written, with its record type.
TABLES: Mapping[str, type] = {
    "requests": RequestRecord,
    "samples": SampleRecord,
    "steps": StepRecord,
    "evals": EvalRecord,
    "engine_metrics": EngineMetricRecord,
    "events": EventRecord,
    "telemetry": TelemetryRecord,
    "trace": TraceRecord,
    "iterations": IterationRecord,
}


def as_row(record: Any) -> dict[str, Any]:
    """A record as a plain dict (enums to values); a dict row is returned as a copy."""
    if isinstance(record, dict):
        return dict(record)
    fields = _FIELDS.get(type(record))
    if fields is None:  # once per record type: dataclasses.fields() was a tenth of a simulated run
        names = tuple(f.name for f in dataclasses.fields(record))
        fields = _FIELDS[type(record)] = (names, _getter(names))
    names, values = fields
    row = dict(zip(names, values(record), strict=True))  # a record per request: the hot path
    for key, value in row.items():
        if isinstance(value, enum.Enum):
            row[key] = value.value
    return row


#: Per record type: its field names in declaration order (the order of a row's keys), and a getter
#: of their values as a tuple.
_FIELDS: dict[type, tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]] = {}


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The values of ``names`` of a record, as a tuple (``attrgetter`` returns a lone value bare)."""
    if len(names) >= 2:
        return operator.attrgetter(*names)
    return lambda record: tuple(getattr(record, name) for name in names)
