"""``fake-pool``: in-process fake engines behind the replica router, on the virtual clock.

Routing, failure detection, re-queueing and restarts (:mod:`april_bench.engines.replicas`) exactly
repeatable in seconds: each replica is a :class:`~april_bench.engines.fake.FakeEngine` wrapped in
:class:`InProcessReplica`, which fault injection can kill (its streams and calls fail, as an
engine's own error does) or hang (nothing it does returns: only the health timeout finds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.protocol import (
    ACCOUNTING,
    FAULTS,
    HEALTH,
    KILL,
    STATE,
    Completion,
    Engine,
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineSettings,
    EngineWork,
    GenerateRequest,
    WeightUpdate,
)
from april_bench.engines.replicas import FaultOptions, ReplicaRouter, RouterFront
from april_bench.engines.routing import ROUTER_POLICIES
from april_bench.engines.stream import CompletionStream
from april_bench.registry import Spec

__all__ = ["FakeReplicaPool", "InProcessReplica", "build_pool", "check_pool"]


class InProcessReplica:
    """An in-process engine as a replica fault injection can kill or hang: killed, its streams raise
    and its calls fail (what an engine's own error does); hung, nothing it does returns."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._streams: list[CompletionStream] = []
        self._relays: set[asyncio.Task[None]] = set()
        self._dead: EngineError | None = None
        self._hung = False

    @property
    def info(self) -> EngineInfo:
        """The engine's info, with the replica's own capabilities: it answers health probes, can be
        killed, has a state, and counts work when its engine does."""
        info = self.engine.info
        counts = info.capabilities & {ACCOUNTING}
        return dataclasses.replace(info, capabilities=frozenset({HEALTH, KILL, STATE, *counts}))

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self._gate()
        await self.engine.close()

    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        if self._dead is not None:
            raise self._dead
        stream = CompletionStream(len(requests))
        self._streams.append(stream)
        inner = self.engine.generate(requests)
        task = asyncio.ensure_future(self._relay(inner, stream))
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)
        return stream

    async def _relay(self, inner: AsyncIterator[Completion], stream: CompletionStream) -> None:
        try:
            async for completion in inner:
                if self._dead is not None or self._hung:
                    return
                stream.deliver(completion)
        except Exception as exc:
            stream.fail(exc)
        finally:
            with contextlib.suppress(ValueError):
                self._streams.remove(stream)

    async def _gate(self) -> None:
        if self._hung:
            await asyncio.get_running_loop().create_future()  # never answers
        if self._dead is not None:
            raise self._dead

    async def health(self) -> None:
        await self._gate()

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        await self._gate()
        await self.engine.abort(request_ids)

    async def load(self) -> EngineLoad:
        await self._gate()
        return await self.engine.load()

    async def update_weights(self, update: WeightUpdate) -> None:
        await self._gate()
        await self.engine.update_weights(update)

    def work(self) -> EngineWork:
        counted = ACCOUNTING.of(self.engine)
        assert counted is not None
        return counted.work()

    def export_state(self) -> dict[str, Any]:
        engine = STATE.of(self.engine)
        return engine.export_state() if engine else {}

    def restore_state(self, state: dict[str, Any]) -> None:
        if engine := STATE.of(self.engine):
            engine.restore_state(state)

    async def kill(self) -> None:
        self._hung = False
        self._dead = EngineError("replica killed (fault injection)")
        for stream in self._streams:
            stream.fail(self._dead)
        with contextlib.suppress(Exception):
            await self.engine.abort(None)  # its timers stop; what it returns goes nowhere

    async def hang(self) -> None:
        self._hung = True


class FakeReplicaPool(RouterFront, Configurable):
    """``fake-pool``: ``replicas`` in-process fake engines behind the replica router, on the virtual
    clock: routing, failure detection, re-queueing and restarts, exactly repeatable."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        replicas: int = param(2, help="fake engine replicas")
        router_policy: str = param("cache_aware", help=f"request routing: {', '.join(ROUTER_POLICIES)}")
        faults: FaultOptions = param(help="failure handling and chaos", default_factory=FaultOptions)
        engine_args: Mapping[str, Any] = param(help="options of each fake engine", default_factory=dict)

        def __post_init__(self) -> None:
            if self.replicas < 1:
                raise ConfigError(f"--engine-arg replicas must be >= 1, got {self.replicas}")
            if self.router_policy not in ROUTER_POLICIES:
                raise ConfigError(f"--engine-arg router_policy must be one of {', '.join(ROUTER_POLICIES)}")

    def __init__(self, config: Config, *, settings: EngineSettings, fake: Spec) -> None:
        fake.check(settings, config.engine_args)  # options checked before anything starts
        self.config = config

        async def make(i: int) -> Engine:
            replica = InProcessReplica(fake.build(settings, config.engine_args))
            await replica.start()
            return replica

        info = EngineInfo(
            name="fake-pool",
            simulated=True,
            produces_tokens=True,
            virtual_time=True,
            replicas=config.replicas,
            capabilities=frozenset({ACCOUNTING, FAULTS, STATE}),
        )
        self._router = ReplicaRouter(
            make=make, replicas=config.replicas, policy=config.router_policy, faults=config.faults, info=info
        )

    async def start(self) -> None:
        await self._router.start()

    async def close(self) -> None:
        await self._router.close()

    def work(self) -> EngineWork:
        """The replicas' work summed (:class:`~april_bench.engines.protocol.EngineAccounting`): the
        re-prefill of re-queued requests shows in the step rows' ``reprefill_tokens``."""
        work = self._router.work()
        assert work is not None  # fake engines count their work
        return work

    def export_state(self) -> dict[str, Any]:
        return self._router.export_state()

    def restore_state(self, state: dict[str, Any]) -> None:
        self._router.restore_state(state)


def build_pool(
    config: FakeReplicaPool.Config, settings: EngineSettings, *, parts: Sequence[Spec]
) -> FakeReplicaPool:
    """The pool of ``parts[0]`` (the fake engine's registry entry) replicas."""
    pool: FakeReplicaPool = config.build(settings=settings, fake=parts[0])
    return pool


def check_pool(config: FakeReplicaPool.Config, settings: EngineSettings, *, parts: Sequence[Spec]) -> None:
    """The replicas' own options, checked by the fake engine's entry."""
    parts[0].check(settings, config.engine_args)
