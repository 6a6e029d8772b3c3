"""The SGLang adapter behind the replica router, over launched fake SGLang server processes: a
server killed (SIGKILL) or hung (SIGSTOP) at a seeded token count loses no request."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from april_bench.engines.protocol import Completion, EngineInfo, FaultEvent, GenerateRequest, SamplingParams
from april_bench.engines.replicas import FaultOptions, ReplicaRouter
from april_bench.engines.server.process import ServerProcess
from april_bench.engines.sglang import SGLangEngine


def _requests(prefix: str, lengths: list[int]) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            request_id=f"{prefix}{i}",
            input_len=4,
            max_new_tokens=n,
            sampling=SamplingParams(temperature=0.0),
            input_ids=(1 + i, 2, 3, 4),
        )
        for i, n in enumerate(lengths)
    ]


Run = tuple[list[Completion], list[Completion], list[FaultEvent]]


async def _chaos_run(tmp_path: Path, mode: str) -> Run:
    engines: list[SGLangEngine] = []

    async def make(i: int) -> SGLangEngine:
        engine = SGLangEngine.Config(
            model_path="fake-model",
            launch_module="april_bench.engines.sglang.fake_server",
            engine_args={"decode_step_s": 0.01},
            log_file=str(tmp_path / f"server-{i}-{len(engines)}.log"),
            launch_timeout_s=120,
        ).build()
        await engine.start()
        engines.append(engine)
        return engine

    # the first completion (8 tokens) fires the fault; the other requests are still decoding
    faults = FaultOptions(
        health_interval_s=0.5, health_timeout_s=10, chaos_seed=0, chaos_window_tokens=1, chaos_mode=mode
    )
    info = EngineInfo(name="sglang-pool", simulated=True, produces_tokens=True, virtual_time=False)
    router = ReplicaRouter(make=make, replicas=2, policy="round_robin", faults=faults, info=info)
    events: list[FaultEvent] = []
    router.watch_faults(events.append)
    await router.start()
    try:
        first = [c async for c in router.generate(_requests("a", [8, 300, 300, 300, 300, 300]))]
        while not all(router.alive):  # the restarted server comes back with the weights it had
            await asyncio.sleep(0.1)
        second = [c async for c in router.generate(_requests("b", [20] * 6))]
    finally:
        await router.close()
    for engine in engines:  # every server process ended, the killed or frozen one included
        assert isinstance(engine.server, ServerProcess) and engine.server.process is None
    return first, second, events


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["kill", "hang"])
def test_a_dead_sglang_server_loses_no_request(mode: str, tmp_path: Path) -> None:
    first, second, events = asyncio.run(_chaos_run(tmp_path, mode))
    # every request answered once, in full: the dead server's ones were re-run on the survivor
    assert Counter(c.request_id for c in first) == Counter(f"a{i}" for i in range(6))
    assert sorted(c.num_tokens for c in first) == [8, 300, 300, 300, 300, 300]
    kinds = [e.kind for e in events]
    assert kinds[:3] == ["fault_injected", "replica_failed", "requests_requeued"]
    assert "replica_restarted" in kinds
    failed = events[1]
    assert failed.requests and failed.requests >= 2
    # the 300-token requests outlive the fault: the victim's ones finished on the survivor
    assert all(c.replica != failed.replica for c in first if c.request_id != "a0")
    if mode == "hang":
        assert "no answer within 10 s (hung)" in str(failed.detail)
    requeued = events[2]
    assert requeued.tokens == 4 * (requeued.requests or 0)  # each re-prefilled its 4 input tokens
    assert Counter(c.request_id for c in second) == Counter(f"b{i}" for i in range(6))
    assert {c.replica for c in second} == {0, 1}  # the restarted server serves again
