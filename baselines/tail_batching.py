"""Tail batching (RollPacker, arXiv 2509.21009): long prompts deferred to dedicated tail steps.

A *short* step launches N' fresh groups and keeps the first N that finish (race to
completion, as APRIL does); the groups still running at the stop are aborted and
queued.  Once the queue holds N groups (or its oldest has waited
``max_wait_steps`` steps), the next step is a *tail* step: it launches exactly N
queued groups - no speculation, nothing fresh unless the queue is short - and
waits for all of them, so the long prompts run together instead of stretching
every step.  RollPacker re-runs a deferred prompt in full (on-policy), so a tail
step restarts every queued sample by default (``resume_partial=False``); the
discarded tokens are counted as restart waste.  With ``resume_partial=True`` the
tail step continues the partials instead (APRIL-style recycling, off-policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.rollout.strategy import (
    BaseStrategy,
    Candidate,
    Disposition,
    RolloutView,
    StepSummary,
    wave_refill,
)
from april_bench.types import Group, Sample

__all__ = ["TailBatchingStrategy"]


class TailBatchingStrategy(BaseStrategy, Configurable):
    """Short steps race N' fresh groups to N; the stragglers wait for a tail step of their own."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        over_sampling_batch_size: int | None = param(
            None, help="N' of a short step (default: the rollout's --over-sampling-batch-size)"
        )
        max_wait_steps: int = param(
            4,
            help="run a tail step once deferred groups waited this many short steps, even if fewer than N",
        )
        resume_partial: bool = param(
            False,
            help="continue deferred partials in the tail step (default: re-run them in full, on-policy)",
        )

        def __post_init__(self) -> None:
            if self.over_sampling_batch_size is not None and self.over_sampling_batch_size < 1:
                raise ConfigError("over_sampling_batch_size must be >= 1")
            if self.max_wait_steps < 1:
                raise ConfigError(f"max_wait_steps must be >= 1, got {self.max_wait_steps}")

    name = "tail-batching"

    def __init__(self, config: Config) -> None:
        self.config = config
        #: Short steps run since the last tail step (what a resumed run must restore).
        self._steps_since_tail = 0
        #: Whether the current step is a tail step (decided at its first launch).
        self._tail = False

    def launch_count(self, view: RolloutView) -> int:
        if view.launched == 0:
            waited = self._steps_since_tail >= self.config.max_wait_steps
            self._tail = view.buffered >= view.target_groups or (view.buffered > 0 and waited)
        if self._tail:
            return wave_refill(view, view.target_groups)
        wave = self.config.over_sampling_batch_size or view.over_sampling
        return wave_refill(view, max(wave, view.target_groups))

    def select(self, candidates: Sequence[Candidate], count: int, view: RolloutView) -> Sequence[Candidate]:
        if self._tail:  # oldest deferred groups first, topped up with fresh prompts if the queue is short
            return candidates[:count]
        return [c for c in candidates if c.fresh][:count]

    def on_leftover(self, group: Group, view: RolloutView) -> Disposition:
        return Disposition.BUFFER

    def keep_partial(self, sample: Sample, view: RolloutView) -> bool:
        return self.config.resume_partial

    def on_step_end(self, summary: StepSummary) -> None:
        self._steps_since_tail = 0 if self._tail else self._steps_since_tail + 1

    def state(self) -> dict[str, object]:
        return {"steps_since_tail": self._steps_since_tail}

    def restore(self, state: dict[str, object]) -> None:
        value = state.get("steps_since_tail", 0)
        self._steps_since_tail = int(value) if isinstance(value, int) else 0
