"""Adaptive over-provisioning: APRIL whose N' follows the observed completion distribution.

APRIL's fixed N' (about 2N) is a guess: too small and the step still waits for the
tail, too large and most launched work becomes off-policy partials.  This arm
starts from N' and after each step looks at when its N accepted groups finished
(seconds from the step start).  If the last one came much later than the median
(``t_N > grow_above x t_median``) the tail still dominates the step, so N' grows
by ``factor``; if the last one came close behind the median
(``t_N < shrink_below x t_median``), or most accepted groups were already
finished when the step began, the over-provisioning buys little, so N' shrinks
by ``factor``.  N' stays within ``[min_ratio x N, max_ratio x N]``.
The rule only reads the step summary, so it behaves the same on every engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from april_bench.config import ConfigError, param
from april_bench.rollout.strategy import RolloutView, StepSummary, wave_refill
from april_impl.april import AprilStrategy

__all__ = ["AdaptiveAprilStrategy", "next_over_sampling"]


def next_over_sampling(
    current: int, target: int, completion_times_s: tuple[float, ...], config: AdaptiveAprilStrategy.Config
) -> int:
    """N' for the next step, from this step's N' and its accepted groups' completion times."""
    times = sorted(completion_times_s)
    if len(times) < 2:
        return current
    median, last = times[(len(times) - 1) // 2], times[-1]
    if median <= 1e-3 * last or last < config.shrink_below * median:
        # most accepted groups were already finished when launched (buffered surplus), or the last came
        # right behind the median: the over-provisioning is more than the tail needs
        proposed = math.floor(current / config.factor)
    elif last > config.grow_above * median:
        proposed = math.ceil(current * config.factor)
    else:
        proposed = current
    low = max(target, math.ceil(config.min_ratio * target))
    high = max(low, math.floor(config.max_ratio * target))
    return min(high, max(low, proposed))


class AdaptiveAprilStrategy(AprilStrategy):
    """APRIL with N' re-chosen each step from how spread out the step's completions were."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(AprilStrategy.Config):
        min_ratio: float = param(1.0, help="lowest N'/N")
        max_ratio: float = param(4.0, help="highest N'/N")
        grow_above: float = param(
            2.0, help="grow N' when the N-th completion is later than this x the median"
        )
        shrink_below: float = param(
            1.25, help="shrink N' when the N-th completion is earlier than this x the median"
        )
        factor: float = param(1.25, help="multiply or divide N' by this per step")

        def __post_init__(self) -> None:
            AprilStrategy.Config.__post_init__(self)
            if not 1.0 <= self.min_ratio <= self.max_ratio:
                raise ConfigError(
                    f"need 1 <= min_ratio <= max_ratio, got {self.min_ratio} and {self.max_ratio}"
                )
            if not 1.0 <= self.shrink_below <= self.grow_above:
                raise ConfigError(
                    f"need 1 <= shrink_below <= grow_above, got {self.shrink_below} and {self.grow_above}"
                )
            if self.factor <= 1.0:
                raise ConfigError(f"factor must be > 1, got {self.factor}")

    name = "adaptive"

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.adaptive = config
        #: N' now (``None`` until the first step sets it from the config or the rollout).
        self.over_sampling: int | None = None
        self._target = 0

    def launch_count(self, view: RolloutView) -> int:
        if self.over_sampling is None:
            self.over_sampling = max(
                self.config.over_sampling_batch_size or view.over_sampling, view.target_groups
            )
        self._target = view.target_groups
        return wave_refill(view, self.over_sampling)

    def on_step_end(self, summary: StepSummary) -> None:
        if self.over_sampling is not None:
            self.over_sampling = next_over_sampling(
                self.over_sampling, self._target, summary.completion_times_s, self.adaptive
            )

    def state(self) -> dict[str, object]:
        return {"over_sampling": self.over_sampling}

    def restore(self, state: dict[str, object]) -> None:
        value = state.get("over_sampling")
        self.over_sampling = value if isinstance(value, int) else None
