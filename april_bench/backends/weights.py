"""The seam between trainer and engine: how new weights reach the engine after each step.

In-process engines take a state dict; engines in another process (a vLLM or
SGLang server) load a checkpoint directory the trainer writes; simulated
engines only move their policy version.  Engine workers that can join a weight
group (:class:`~april_bench.collective.WeightReceivers`: the Ray pool's replicas)
receive a broadcast from the trainer's rank 0 (:class:`~april_bench.collective.WeightSource`)
or from this process (any other trainer), with the state dict through Ray's
object store kept as the fallback.  :func:`choose_weight_sync` picks the first
form both sides support, or says what is missing.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Protocol

from april_bench.collective import (
    WeightGroup,
    WeightReceivers,
    WeightSource,
    header,
    host_address,
    weight_wire,
)
from april_bench.config import ConfigError
from april_bench.engines.protocol import Engine, WeightUpdate
from april_bench.trainers.protocol import CheckpointWriter, Trainer

__all__ = [
    "CheckpointSync",
    "CollectiveSync",
    "InProcessSync",
    "VersionOnlySync",
    "WeightSync",
    "choose_weight_sync",
]


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


class CollectiveSync:
    """A broadcast over a weight group of the trainer's sender (rank 0, or this process for a
    trainer without ranks of its own) and the engine's workers.  The group is formed at the first
    push and again after a worker was replaced; a push that fails (a worker lost mid-broadcast) goes
    by ``fallback`` instead (the object store), and the next one forms the group again."""

    kind = "collective"

    def __init__(self, fallback: WeightSync, *, backend: str = "gloo") -> None:
        self.fallback = fallback
        self.backend = backend
        self._source: WeightSource | None = None
        self._header: dict[str, list[Any]] | None = None  # the policy's names, dtypes, shapes (fixed)
        #: Pushes that went by the fallback, and why (the run's provenance can say so).
        self.fallbacks: list[str] = []

    async def push(self, trainer: Trainer, engine: Engine, version: int) -> None:
        assert isinstance(engine, WeightReceivers)
        try:
            if self._source is None or not engine.weight_group_current():
                await self._form(trainer, engine)
            assert self._source is not None
            if weight_wire(engine) == "per_tensor":  # SGLang's: the receivers are told the header first
                if self._header is None:
                    self._header = await self._source.weight_header()
                await _both(self._source.send_weights(True), engine.receive_weights(version, self._header))
            else:
                await _both(self._source.send_weights(), engine.receive_weights(version))
        except Exception as exc:  # a lost worker or sender: this update by the fallback
            self.fallbacks.append(f"version {version}: {type(exc).__name__}: {exc}")
            print(
                f"warning: weights over the process group failed ({exc}); using the object store",
                file=sys.stderr,
            )
            self._leave()
            await self.fallback.push(trainer, engine, version)

    async def _form(self, trainer: Trainer, engine: WeightReceivers) -> None:
        self._leave()
        source = trainer if isinstance(trainer, WeightSource) else DriverSource(trainer)
        address = await source.weight_group_address()
        world = 1 + engine.weight_receivers()
        try:
            await _both(
                source.join_weight_group(address, world, self.backend),
                engine.join_weight_group(address, 1, world, self.backend),
            )
        except Exception:
            source.leave_weight_group()
            raise
        self._source = source

    def _leave(self) -> None:
        if self._source is not None:
            source, self._source = self._source, None
            source.leave_weight_group()


async def _both(sender: Awaitable[None], receivers: Awaitable[None]) -> None:
    """Await the sending and the receiving side to the end, both (a side that failed leaves the other
    blocked in the group until its timeout, ``collective.GROUP_TIMEOUT_S``: the fallback must not start
    before it returns, or the sender's rank would be busy); then raise one error naming the side."""
    outcomes: list[object] = list(await asyncio.gather(sender, receivers, return_exceptions=True))
    sent, received = outcomes
    failures = [
        f"{side}: {type(exc).__name__}: {exc}"
        for side, exc in (("engine receivers", received), ("sender", sent))
        if isinstance(exc, BaseException)
    ]
    if failures:
        raise RuntimeError(f"weight group failed ({'; '.join(failures)})")


class DriverSource:
    """This process sends a trainer's weights (``trainer.weights()``: a one-process trainer, or one
    whose ranks gather their shards here)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._group: Any = None

    async def weight_group_address(self) -> str:
        return host_address()

    async def join_weight_group(self, address: str, world: int, backend: str) -> None:
        self._group = await asyncio.to_thread(WeightGroup, address, 0, world, backend=backend)

    async def send_weights(self, per_tensor: bool = False) -> None:
        state = self.trainer.weights()
        await asyncio.to_thread(self._group.send_each if per_tensor else self._group.send, state)

    async def weight_header(self) -> dict[str, list[Any]]:
        return header(self.trainer.weights())

    def leave_weight_group(self) -> None:
        if self._group is not None:
            self._group.close()
        self._group = None


def choose_weight_sync(engine: Engine, trainer: Trainer, scratch: Path) -> WeightSync:
    """The first weight form the engine accepts that the trainer can produce."""
    formats = engine.info.weight_formats
    # ``has_weights``: a trainer whose weights() is a gather (FSDP, Megatron, an actor) says so, rather
    # than gathering the whole policy here only to see it is not None
    if not getattr(trainer, "has_weights", False) and trainer.weights() is None:  # simulated
        if "none" not in formats:
            raise ConfigError(
                f"engine {engine.info.name!r} needs real weights; use a real trainer (--trainer torch)"
            )
        return VersionOnlySync()
    if "state_dict" in formats:
        if isinstance(engine, WeightReceivers) and engine.weight_receivers() > 0:
            return CollectiveSync(InProcessSync())
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
