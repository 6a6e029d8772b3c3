"""Registry of rollout strategies: APRIL and the baselines, by name."""

from __future__ import annotations

import dataclasses
from typing import Any

from april_bench.registry import Registry
from april_bench.rollout.strategy import RolloutStrategy

__all__ = ["STRATEGIES", "build_strategy"]

STRATEGIES: Registry[type] = Registry("strategy")
STRATEGIES.register(
    "sync", "baselines.sync:SyncStrategy", "launch N groups and wait for all (the paper's baseline)"
)
STRATEGIES.register(
    "oversample-discard",
    "baselines.oversample_discard:OversampleDiscardStrategy",
    "launch N' groups, abort at N, discard the rest (isolates recycling)",
)
STRATEGIES.register(
    "april", "april_impl.april:AprilStrategy", "launch N', abort at N, buffer partials and resume them first"
)


def build_strategy(name: str, **options: Any) -> RolloutStrategy:
    """Build a strategy, passing each option only to strategies whose Config has that field.

    The same options go to every strategy, so arms differ in the strategy alone.
    """
    cls = STRATEGIES.get(name)
    names = {f.name for f in dataclasses.fields(cls.Config)}
    return cls.Config(**{k: v for k, v in options.items() if k in names and v is not None}).build()
