"""Over-sample, abort at N, discard the rest.

The same launch rule as APRIL (waves of N' groups), but the groups still in
flight when N are accepted are thrown away instead of recycled.  Against APRIL
it isolates the value of recycling; against sync, the value of over-provisioning.
Its prompts are consumed faster than sync's, and the discarded work is counted
in ``wasted_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.rollout.strategy import BaseStrategy, Disposition, RolloutView, wave_refill
from april_bench.types import Group

__all__ = ["OversampleDiscardStrategy"]


class OversampleDiscardStrategy(BaseStrategy, Configurable):
    """Launch N' groups per wave; keep the first N that finish; drop the rest."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        over_sampling_batch_size: int | None = param(
            None, help="N' for this arm (default: the rollout's --over-sampling-batch-size)"
        )

        def __post_init__(self) -> None:
            if self.over_sampling_batch_size is not None and self.over_sampling_batch_size < 1:
                raise ConfigError("over_sampling_batch_size must be >= 1")

    name = "oversample-discard"

    def __init__(self, config: Config) -> None:
        self.config = config

    def launch_count(self, view: RolloutView) -> int:
        wave = self.config.over_sampling_batch_size or view.over_sampling
        return wave_refill(view, max(wave, view.target_groups))

    def on_leftover(self, group: Group, view: RolloutView) -> Disposition:
        return Disposition.DROP
