"""Straggler-aware group size (SAGC, arXiv 2606.02218): APRIL whose samples per prompt adapt online.

A group completes at the longest of its n responses, so the more samples a prompt gets, the more
groups a single long response holds back.  SAGC bounds that straggler rate by changing n, where
APRIL (and ``adaptive``) keep n fixed.  Here a *straggler* is a launched group still unfinished when
the step stops (N groups accepted), and the rate is their share of the step's launched groups.
After each step: a rate above ``max_straggler_rate`` shrinks n by ``factor``; a rate under half of
it grows n back by ``factor``; n stays within ``[min_samples, max_samples]`` (default: the run's
``--n-samples-per-prompt``, where it starts).  A buffered group keeps the size it was launched
with.  The control law (multiplicative, with that hysteresis) is ours: the rule is SAGC's idea,
not its published controller.

What it trades: fewer samples per prompt finish sooner, but a GRPO/DAPO group baseline is
estimated from fewer responses, and with DAPO's filter a small group has all-equal rewards more
often, so more groups are rejected (counted in the step rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from april_bench.config import ConfigError, param
from april_bench.rollout.strategy import Disposition, RolloutView, StepSummary
from april_bench.types import Group
from april_impl.april import AprilStrategy

__all__ = ["StragglerAwareGroupStrategy", "next_group_size"]


def next_group_size(current: int, rate: float, high: int, config: StragglerAwareGroupStrategy.Config) -> int:
    """Samples per prompt for the next step, from this step's straggler rate."""
    if rate > config.max_straggler_rate:
        proposed = math.floor(current / config.factor)
    elif rate < config.max_straggler_rate / 2:
        proposed = math.ceil(current * config.factor)
    else:
        proposed = current
    return min(high, max(config.min_samples, proposed))


class StragglerAwareGroupStrategy(AprilStrategy):
    """APRIL with the group size re-chosen each step from the share of groups the stop cut off."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(AprilStrategy.Config):
        max_straggler_rate: float = param(
            0.25, help="shrink n when more than this share of launched groups is unfinished at the stop"
        )
        min_samples: int = param(2, help="fewest samples per prompt (a group baseline needs 2)")
        max_samples: int | None = param(
            None, help="most samples per prompt (default: --n-samples-per-prompt)"
        )
        factor: float = param(1.5, help="multiply or divide n by this per step")

        def __post_init__(self) -> None:
            AprilStrategy.Config.__post_init__(self)
            if not 0.0 < self.max_straggler_rate < 1.0:
                raise ConfigError(f"max_straggler_rate must be in (0, 1), got {self.max_straggler_rate}")
            if self.min_samples < 1 or (self.max_samples is not None and self.max_samples < self.min_samples):
                raise ConfigError(
                    f"need 1 <= min_samples <= max_samples, got {self.min_samples} and {self.max_samples}"
                )
            if self.factor <= 1.0:
                raise ConfigError(f"factor must be > 1, got {self.factor}")

    name = "sagc"

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.sagc = config
        #: Samples per prompt now (``None`` until the first launch sets it from the run's n).
        self.samples: int | None = None
        self._high = 0
        self._stragglers = 0

    def group_shape(self, n: int, view: RolloutView) -> tuple[int, int]:
        self._high = max(self.sagc.min_samples, self.sagc.max_samples or n)
        if self.samples is None:
            self.samples = min(self._high, max(self.sagc.min_samples, n))
        return self.samples, self.samples

    def on_leftover(self, group: Group, view: RolloutView) -> Disposition:
        if not group.is_finished:
            self._stragglers += 1
        return super().on_leftover(group, view)

    def on_step_end(self, summary: StepSummary) -> None:
        if self.samples is not None and summary.launched_groups:
            rate = self._stragglers / summary.launched_groups
            self.samples = next_group_size(self.samples, rate, self._high, self.sagc)
        self._stragglers = 0

    def state(self) -> dict[str, object]:
        return {"samples": self.samples}

    def restore(self, state: dict[str, object]) -> None:
        value = state.get("samples")
        self.samples = value if isinstance(value, int) else None
