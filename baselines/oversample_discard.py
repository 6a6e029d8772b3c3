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
from april_bench.rollout.strategy import Disposition, RolloutView, wave_refill
from april_bench.types import Group, Sample

__all__ = ["OversampleDiscardStrategy"]


class OversampleDiscardStrategy(Configurable):
    """Launch N' groups per wave; keep the first N that finish; drop the rest."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        over_sampling_batch_size: int = param(64, help="N': groups launched per wave")

        def __post_init__(self) -> None:
            if self.over_sampling_batch_size < 1:
                raise ConfigError("--over-sampling-batch-size must be >= 1")

    name = "oversample-discard"

    def __init__(self, config: Config) -> None:
        self.config = config

    def launch_count(self, view: RolloutView) -> int:
        return wave_refill(view, max(self.config.over_sampling_batch_size, view.target_groups))

    def on_leftover(self, group: Group, view: RolloutView) -> Disposition:
        return Disposition.DROP

    def keep_partial(self, sample: Sample, view: RolloutView) -> bool:
        return True  # never asked: nothing is buffered
