"""Engine capabilities are declared once, in ``EngineInfo.capabilities``, and read from there.

The conformance suite checks the engines it starts (fake, hf, vLLM, SGLang); this file checks the
engines it does not: the simulator, the replica pools and their replicas, which declare their own
capabilities rather than those of the engine they wrap."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

from april_bench.engines import ENGINES
from april_bench.engines.fake import FakeEngine
from april_bench.engines.fake_pool import InProcessReplica
from april_bench.engines.protocol import (
    ACCOUNTING,
    CAPABILITIES,
    FAULTS,
    HEALTH,
    KILL,
    PLACEMENT,
    SATURATION,
    SLEEP,
    STATE,
    Engine,
    EngineInfo,
    EngineSettings,
)
from april_bench.engines.ray_pool import RayReplica


def _implemented(engine: object) -> set[str]:
    return {c.name for c in CAPABILITIES if isinstance(engine, c.protocol)}


def _declared(engine: Engine) -> set[str]:
    return {c.name for c in engine.info.capabilities}


def test_the_simulator_and_the_pools_declare_exactly_what_they_implement() -> None:
    settings = EngineSettings(model="qwen3-4b", hardware="cpu", max_context_len=256)
    for name in ("sim", "fake", "fake-pool", "ray-fake"):
        engine = ENGINES.get(name).build(settings, {})
        assert _declared(engine) == _implemented(engine), name
    sim = {"faults", "histogram", "state", "saturation", "versions"}
    assert _declared(ENGINES.get("sim").build(settings, {})) == sim
    assert _declared(ENGINES.get("ray-fake").build(settings, {})) == {"faults", "placement", "state", "sleep"}


def test_a_replica_declares_its_own_capabilities_not_its_engines() -> None:
    # The fake engine has a no-tail rate and no health probe; the replica that wraps it has a probe,
    # can be killed, and has none of the rate.
    inner = FakeEngine.Config().build()
    replica = InProcessReplica(inner)
    assert SATURATION in inner.info.capabilities and HEALTH not in inner.info.capabilities
    assert replica.info.capabilities == frozenset({ACCOUNTING, HEALTH, KILL, STATE})
    assert _declared(replica) == _implemented(replica)


class _Call:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def remote(self, *args: Any) -> Any:
        if self.answer is None:
            await asyncio.Event().wait()  # a poll that never returns
        return self.answer


class _Actor:
    """What RayReplica.start asks of its actor: the engine's info, then polls."""

    def __init__(self, info: EngineInfo) -> None:
        self.start = _Call(info)
        self.poll = _Call(None)


def test_a_ray_replica_declares_a_probe_and_a_kill_not_its_engines_capabilities() -> None:
    info = FakeEngine.Config().build().info  # what the actor's engine reports
    replica = RayReplica(_Actor(info), 0)

    async def main() -> None:
        await replica.start()
        assert replica._pump is not None
        replica._pump.cancel()

    asyncio.run(main())
    assert replica.info.capabilities == frozenset({HEALTH, KILL, SLEEP})  # its engine sleeps: so does it
    assert _declared(replica) == _implemented(replica)
    assert replica.info.name == info.name


def test_what_is_not_declared_is_not_used_even_when_the_method_is_there() -> None:
    # Declaration, not probing: an engine with a work() it does not declare counts no work.
    engine = FakeEngine.Config().build()
    assert ACCOUNTING.of(engine) is engine
    engine._info = EngineInfo(name="fake", simulated=True, produces_tokens=True, virtual_time=True)
    assert ACCOUNTING.of(engine) is None and STATE.of(engine) is None
    assert hasattr(engine, "work")


def test_capabilities_travel_with_the_info() -> None:
    # A Ray replica's info comes back from its actor by pickle.
    info = EngineInfo(
        name="x",
        simulated=True,
        produces_tokens=True,
        virtual_time=True,
        capabilities=frozenset({FAULTS, PLACEMENT, STATE}),
    )
    again = pickle.loads(pickle.dumps(info))
    assert again == info and FAULTS in again.capabilities
    assert {c.name for c in CAPABILITIES} == {
        "saturation",
        "metrics",
        "state",
        "accounting",
        "health",
        "faults",
        "placement",
        "kill",
        "iterations",
        "versions",
        "histogram",
        "sleep",
    }
