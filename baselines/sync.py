"""The synchronous baseline (the paper's baseline and slime's default).

Launch N groups of n and wait for all of them.  With DAPO dynamic sampling a
rejection leaves accepted + in flight < N, so another wave of N groups goes out
(slime refills in waves of ``over_sampling_batch_size``, which equals N in the
scripted baseline); once N groups are accepted the rest are aborted and
discarded.  Nothing is ever carried over.
"""

from __future__ import annotations

from dataclasses import dataclass

from april_bench.config import BaseConfig, Configurable
from april_bench.rollout.strategy import BaseStrategy, Disposition, RolloutView, wave_refill
from april_bench.types import Group

__all__ = ["SyncStrategy"]


class SyncStrategy(BaseStrategy, Configurable):
    """Launch exactly N groups; wait for all; discard leftovers of refills."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        pass

    name = "sync"

    def __init__(self, config: Config) -> None:
        self.config = config

    def launch_count(self, view: RolloutView) -> int:
        return wave_refill(view, view.target_groups)

    def on_leftover(self, group: Group, view: RolloutView) -> Disposition:
        return Disposition.DROP
