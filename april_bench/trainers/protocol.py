"""The trainer protocol: update the policy on a batch, then hand the engine new weights."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, runtime_checkable

from april_bench.types import Group

__all__ = [
    "CheckpointWriter",
    "ClosableTrainer",
    "TrainResult",
    "Trainer",
    "TrainerLost",
    "TrainerState",
    "has_state",
]


class TrainerLost(RuntimeError):
    """The trainer's process is gone (a Ray trainer actor died): the run cannot go on, but every
    completed step is saved, so it ends as interrupted and ``run --resume`` continues it with a new
    trainer from the last checkpoint holding the trainer's state (``--checkpoint-every``)."""


@dataclass(slots=True)
class TrainResult:
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Trainer(Protocol):
    async def train(self, batch: Sequence[Group], *, step: int, policy_version: int) -> TrainResult:
        """One policy update on ``batch`` (the groups accepted at ``policy_version``)."""
        ...

    def weights(self) -> Any:
        """The policy's weights as an in-process state dict (``None`` in simulation)."""
        ...


@runtime_checkable
class CheckpointWriter(Protocol):
    """Optional: a trainer that can write its policy as a Hugging Face checkpoint directory
    (what an engine in another process loads its weights from)."""

    def save(self, path: str) -> str:
        """Write the policy to ``path`` atomically and return the directory."""
        ...


@runtime_checkable
class TrainerState(Protocol):
    """Optional: a trainer whose state (weights, optimizer moments) a resumed run restores.
    Trainers without it are stateless (the simulated trainer)."""

    def save_state(self, path: str) -> None:
        """Write everything the next step depends on to ``path`` (one file)."""
        ...

    def load_state(self, path: str) -> None:
        """Continue from :meth:`save_state`."""
        ...


def has_state(trainer: object) -> TypeGuard[TrainerState]:
    """Whether ``trainer`` has :class:`TrainerState`'s methods *now*.  Not ``isinstance``: a runtime
    protocol's check goes through ``ABCMeta``, which caches a class's first positive answer, so a class
    that gains or loses the methods later (a test's patch, a wrapper) would keep the stale answer."""
    return all(callable(getattr(trainer, name, None)) for name in ("save_state", "load_state"))


@runtime_checkable
class ClosableTrainer(Protocol):
    """Optional: a trainer holding processes or devices that the session releases when it ends."""

    def close(self) -> None:
        """Release them (idempotent)."""
        ...
