"""The trainer protocol: update the policy on a batch, then hand the engine new weights."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from april_bench.types import Group

__all__ = ["TrainResult", "Trainer"]


@dataclass(slots=True)
class TrainResult:
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Trainer(Protocol):
    async def train(self, batch: Sequence[Group], *, step: int, policy_version: int) -> TrainResult:
        """One policy update on ``batch`` (the groups accepted at ``policy_version``)."""
        ...

    def weights(self) -> Any:
        """What the engine's ``update_weights`` needs (a state dict, a path; ``None`` in simulation)."""
        ...
