"""The seam between trainer and engine: how new weights reach the engine after each step.

In-process engines take a state dict; engines in another process (a vLLM or
SGLang server) load a checkpoint directory the trainer writes; simulated
engines only move their policy version.  :func:`choose_weight_sync` picks the
first form both sides support, or says what is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from april_bench.config import ConfigError
from april_bench.engines.protocol import Engine, WeightUpdate
from april_bench.trainers.protocol import CheckpointWriter, Trainer

__all__ = ["CheckpointSync", "InProcessSync", "VersionOnlySync", "WeightSync", "choose_weight_sync"]


class WeightSync(Protocol):
    """Pushes the trainer's current weights to the engine, stamped ``version``."""

    kind: str

    async def push(self, trainer: Trainer, engine: Engine, version: int) -> None: ...


class InProcessSync:
    kind = "state_dict"

    async def push(self, trainer: Trainer, engine: Engine, version: int) -> None:
        await engine.update_weights(WeightUpdate(version=version, weights=trainer.weights()))


class VersionOnlySync:
    kind = "none"

    async def push(self, trainer: Trainer, engine: Engine, version: int) -> None:
        await engine.update_weights(WeightUpdate(version=version))


class CheckpointSync:
    """The trainer writes ``<directory>/policy`` (replaced every step); the engine loads it."""

    kind = "path"

    def __init__(self, directory: Path) -> None:
        self.path = directory / "policy"

    async def push(self, trainer: Trainer, engine: Engine, version: int) -> None:
        assert isinstance(trainer, CheckpointWriter)
        written = trainer.save(str(self.path))
        await engine.update_weights(WeightUpdate(version=version, path=written))


def choose_weight_sync(engine: Engine, trainer: Trainer, scratch: Path) -> WeightSync:
    """The first weight form the engine accepts that the trainer can produce."""
    formats = engine.info.weight_formats
    if trainer.weights() is None:  # a simulated trainer: nothing to send but the version
        if "none" not in formats:
            raise ConfigError(
                f"engine {engine.info.name!r} needs real weights; use a real trainer (--trainer torch)"
            )
        return VersionOnlySync()
    if "state_dict" in formats:
        return InProcessSync()
    if "path" in formats:
        if not isinstance(trainer, CheckpointWriter):
            raise ConfigError(
                f"engine {engine.info.name!r} loads weights from a checkpoint directory, and this trainer "
                "cannot write one; choose a trainer with save() (--trainer torch)"
            )
        return CheckpointSync(scratch)
    raise ConfigError(
        f"engine {engine.info.name!r} accepts weights as {', '.join(formats)}: no trainer can send those"
    )
