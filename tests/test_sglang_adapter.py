"""The sglang engine adapter against the fake SGLang server (and against a real one where installed).

Claims shared with the engine conformance suite run on both factories (``engine_kind``); claims
that need the fake's exact tokens or timing run on the fake only.  Everything runs on a real event
loop over loopback HTTP.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import pytest
from sglang_fake import sglang_fake_engine, sglang_real_engine

from april_bench.engines.protocol import (
    Completion,
    Engine,
    EngineError,
    GenerateRequest,
    SamplingParams,
    WeightUpdate,
)
from april_bench.engines.server.process import ServerProcess, group_alive
from april_bench.engines.sglang import FakeSGLangServer, SGLangEngine
from april_bench.engines.sglang.fake_requests import fake_sglang_token
from april_bench.results.recorder import RunRecorder
from april_bench.rollout.loop import RolloutConfig
from april_bench.seeding import sample_seed
from april_bench.types import FinishReason
from april_bench.workload import ScriptedWorkload
from april_impl import AprilStrategy

FACTORIES = {"fake": sglang_fake_engine, "real": sglang_real_engine}
engine_kind = pytest.mark.parametrize(
    "kind", ["fake", pytest.param("real", marks=[pytest.mark.sglang, pytest.mark.gpu, pytest.mark.slow])]
)


def run(
    body: Callable[[SGLangEngine], Awaitable[None]], kind: str = "fake", timeout: float = 30, **settings: Any
) -> None:
    """Start an engine from the ``kind`` factory, run ``body(engine)``, always close it."""

    async def main() -> None:
        engine = await FACTORIES[kind](**settings)
        try:
            await asyncio.wait_for(body(engine), timeout if kind == "fake" else 600)
        finally:
            await engine.close()

    asyncio.run(main())


def request(
    rid: str, first: int, max_new: int, *, seed: int | None = None, replay: int | None = None, **sp: Any
):
    ids = (first, 11, 12)
    return GenerateRequest(
        rid, len(ids), max_new, SamplingParams(seed=seed, **sp), input_ids=ids, replay_len=replay
    )


def tokens(first: int, seed: int, start: int, n: int) -> tuple[int, ...]:
    kw = {"vocab_size": 32000, "eos_token_id": 2, "eos_probability": 0.0}
    return tuple(fake_sglang_token(first, seed, start + i, **kw)[0] for i in range(n))


async def collect(engine: Engine, requests: list[GenerateRequest]) -> dict[str, Completion]:
    return {c.request_id: c async for c in engine.generate(requests)}


async def until_load(engine: SGLangEngine, running: int, waiting: int = 0) -> None:
    while True:
        load = await engine.load()
        if (load.running, load.waiting) == (running, waiting):
            return
        await asyncio.sleep(0.005)


# ----------------------------------------------------------------------------- generation
def test_the_engine_is_an_engine_and_describes_the_server() -> None:
    async def body(engine: SGLangEngine) -> None:
        assert isinstance(engine, Engine)
        info = engine.info
        assert (info.name, info.simulated, info.produces_tokens, info.virtual_time) == (
            "sglang",
            True,
            True,
            False,
        )
        assert info.version == "0.5.23 (april-bench fake)" and info.weight_formats == ("path", "none")

    run(body)


def test_tokens_follow_the_input_ids_and_the_seed() -> None:
    async def body(engine: SGLangEngine) -> None:
        out = await collect(
            engine, [request("a", 5, 6, seed=1), request("b", 5, 6, seed=2), request("c", 6, 6, seed=1)]
        )
        assert out["a"].output_ids == tokens(5, 1, 3, 6)
        assert out["b"].output_ids == tokens(5, 2, 3, 6) != out["a"].output_ids
        assert out["c"].output_ids == tokens(6, 1, 3, 6)
        assert len(out["a"].logprobs or ()) == 6 and out["a"].policy_version == 0

    run(body)


@engine_kind
def test_budgets_and_replayed_lengths_are_honoured(kind: str) -> None:
    async def body(engine: SGLangEngine) -> None:
        out = await collect(
            engine,
            [request("full", 5, 7, replay=99), request("replay", 5, 7, replay=4), request("free", 5, 7)],
        )
        assert (out["full"].num_tokens, out["full"].finish_reason) == (7, FinishReason.LENGTH)
        assert (out["replay"].num_tokens, out["replay"].finish_reason) == (4, FinishReason.STOP)
        assert out["free"].num_tokens <= 7 and out["free"].finish_reason in (
            FinishReason.STOP,
            FinishReason.LENGTH,
        )
        for c in out.values():
            assert len(c.output_ids or ()) == len(c.logprobs or ()) == c.num_tokens

    run(body, kind)


@engine_kind
def test_abort_returns_a_running_requests_partial_and_nothing_for_a_waiting_one(kind: str) -> None:
    async def body(engine: SGLangEngine) -> None:
        stream = engine.generate(
            [request("run", 5, 2000, replay=2000), request("wait", 6, 2000, replay=2000)]
        )
        await until_load(engine, 1, 1)
        await asyncio.sleep(0.1)
        await engine.abort(None)
        out = {c.request_id: c async for c in stream}
        assert (out["wait"].num_tokens, out["wait"].finish_reason) == (0, FinishReason.ABORT)
        assert 0 < out["run"].num_tokens < 2000 and out["run"].finish_reason is FinishReason.ABORT
        assert len(out["run"].logprobs or ()) == out["run"].num_tokens
        assert (await engine.load()).idle

    run(body, kind, max_running_requests=1)


def test_abort_by_id_leaves_an_id_it_prefixes_running() -> None:
    # SGLang aborts by rid prefix; the adapter's unique rid suffix keeps "r-1" from hitting "r-10".
    async def body(engine: SGLangEngine) -> None:
        stream = engine.generate([request("r-1", 5, 2000), request("r-10", 6, 2000)])
        await until_load(engine, 2)
        await engine.abort(["r-1"])
        first = await anext(aiter(stream))
        assert first.request_id == "r-1" and first.finish_reason is FinishReason.ABORT
        assert (await engine.load()).running == 1
        await engine.abort(None)
        assert (await anext(aiter(stream))).request_id == "r-10"

    run(body)


def test_an_abort_in_the_final_step_is_reported_as_the_finish_it_was() -> None:
    # One 200 ms step: the abort lands while the request decodes its last allowed token (or a stop
    # id).  SGLang says "abort"; resuming would run past the end, so the adapter reports the finish.
    async def body(engine: SGLangEngine) -> None:
        stop = tokens(5, 0, 3, 1)[0]
        out = {}
        for req in (request("last", 7, 1), request("stop", 5, 9, seed=0, stop_token_ids=(stop,))):
            stream = engine.generate([req])
            await until_load(engine, 1)
            await engine.abort(None)
            out[req.request_id] = await anext(aiter(stream))
        assert (out["last"].num_tokens, out["last"].finish_reason) == (1, FinishReason.LENGTH)
        assert (out["stop"].output_ids, out["stop"].finish_reason) == ((stop,), FinishReason.STOP)

    run(body, decode_step_s=0.2)


def test_a_request_landing_after_an_abort_is_caught_by_the_next_abort_all() -> None:
    async def body(engine: SGLangEngine) -> None:
        stream = engine.generate([request("late", 5, 2000)])
        await asyncio.sleep(0.03)
        await engine.abort(None)  # the request is still in transit (150 ms)
        await until_load(engine, 1)
        await engine.abort(None)
        late = await anext(aiter(stream))
        assert late.finish_reason is FinishReason.ABORT and late.num_tokens > 0

    run(body, http_latency_s=0.15)


def test_a_rejected_request_fails_the_stream_with_the_servers_message() -> None:
    async def body(engine: SGLangEngine) -> None:
        with pytest.raises(EngineError, match=r"sglang rejected a: .*maximum context length of 8 tokens"):
            await collect(engine, [request("a", 5, 20)])

    run(body, context_length=8)


# ----------------------------------------------------------------------------- rollouts
@engine_kind
def test_april_over_the_adapter_loses_and_doubles_nothing_across_abort_and_resume(kind: str) -> None:
    # APRIL, N=2 groups of 2, N'=4, three steps; every 4th prompt wants 100 tokens (limit 40), so
    # those are aborted and resumed from their token ids under a newer policy version each step.
    length = lambda uid, i: 100 if uid % 4 == 0 else 6 + 2 * i + uid % 3  # noqa: E731
    config = RolloutConfig(
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        over_sampling_batch_size=4,
        max_response_len=40,
        replay_lengths=True,
        reabort_interval_s=0.05,
        seed=3,
    )
    workload = ScriptedWorkload(length)
    recorder = RunRecorder()
    strategy = AprilStrategy.Config(over_sampling_batch_size=4).build()

    async def body(engine: SGLangEngine) -> None:
        loop = config.build(
            arm="april", engine=engine, strategy=strategy, workload=workload,
            prompts=workload.prompt_stream(), recorder=recorder,
        )  # fmt: skip
        trained = []
        for step in range(3):
            outcome = await loop.run_step(step, step)
            r = outcome.record
            assert (
                r.launched_groups
                == r.accepted_groups + r.rejected_groups + r.buffered_groups + r.dropped_groups
            )
            trained += outcome.batch
            await engine.update_weights(WeightUpdate(step + 1))
        assert (await engine.load()).idle
        ids = [r.request_id for r in recorder["requests"]]
        assert len(ids) == len(set(ids))  # every request returned exactly once
        samples = [s for g in [*trained, *loop.buffer] for s in g.samples]
        assert any(len(s.segments) > 1 for s in samples)  # something was resumed
        for s in samples:
            assert s.response_len == sum(seg.num_tokens for seg in s.segments) <= 40
            assert all(seg.policy_version == seg.step for seg in s.segments)
            if engine.info.simulated:  # the fake's tokens are known: resume continues them exactly
                seed = sample_seed(3, s.prompt.uid, s.index)
                assert tuple(s.response_ids()) == tokens(s.prompt.uid, seed, 4, s.response_len)

    run(body, kind, timeout=60)


# ----------------------------------------------------------------------------- weights
def test_every_token_after_a_weight_update_carries_the_new_version(tmp_path) -> None:
    async def body(engine: SGLangEngine) -> None:
        before = await collect(engine, [request("a", 5, 3)])
        await engine.update_weights(WeightUpdate(1, path=str(tmp_path)))
        after_path = await collect(engine, [request("b", 5, 3)])
        await engine.update_weights(WeightUpdate(2))
        after_version = await collect(engine, [request("c", 5, 3)])
        assert [
            before["a"].policy_version,
            after_path["b"].policy_version,
            after_version["c"].policy_version,
        ] == [0, 1, 2]
        with pytest.raises(EngineError, match="not a state dict"):
            await engine.update_weights(WeightUpdate(3, weights={"w": 0}))
        with pytest.raises(EngineError, match="is not a checkpoint directory"):
            await engine.update_weights(WeightUpdate(3, path=str(tmp_path / "missing")))
        stream = engine.generate([request("d", 5, 2000)])
        with pytest.raises(EngineError, match="abort and drain first"):
            await engine.update_weights(WeightUpdate(3))
        await until_load(engine, 1)  # aborting before it lands would miss it (a late arrival)
        await engine.abort(None)
        await collect_stream(stream)

    run(body)


async def collect_stream(stream: Any) -> list[Completion]:
    return [c async for c in stream]


def test_a_weight_version_set_by_another_client_is_refused() -> None:
    async def body(engine: SGLangEngine) -> None:
        async with httpx2.AsyncClient(base_url=engine.url, trust_env=False) as other:
            await other.post("/update_weight_version", json={"new_version": "nightly"})
        with pytest.raises(EngineError, match="another client updated the weights"):
            await collect(engine, [request("a", 5, 3)])

    run(body)


# ----------------------------------------------------------------------------- metrics
def test_load_and_metrics_report_the_servers_queues_and_counters() -> None:
    async def body(engine: SGLangEngine) -> None:
        stream = engine.generate([request("a", 5, 2000), request("b", 6, 2000)])
        await until_load(engine, 1, 1)
        snapshot = engine.metrics()
        assert (snapshot["running"], snapshot["waiting"], snapshot["requests"]) == (1.0, 1.0, 2.0)
        await engine.abort(None)
        await collect_stream(stream)
        metrics = await engine.refresh_metrics()
        assert metrics["aborted_requests"] == 2.0 and metrics["running"] == 0.0
        assert metrics["sglang:generation_tokens_total"] == metrics["generation_tokens"] > 0

    run(body, max_running_requests=1, enable_metrics=True)


# ----------------------------------------------------------------------------- processes
def _fake_launch(tmp_path, **engine_args: Any) -> SGLangEngine:
    return SGLangEngine.Config(
        model_path="fake-model",
        launch_module="april_bench.engines.sglang.fake_server",
        engine_args={"decode_step_s": 0.005, **engine_args},
        log_file=str(tmp_path / "server.log"),
        launch_timeout_s=60,
    ).build()


def test_a_launched_server_is_waited_for_and_leaves_no_process_behind(tmp_path) -> None:
    engine = _fake_launch(tmp_path, startup_s=0.3)
    assert isinstance(engine.server, ServerProcess)

    async def main() -> None:
        await engine.start()
        pid = engine.server.pid
        assert pid is not None and group_alive(pid)
        assert engine.info.simulated and engine.info.model == "fake-model"
        done = await collect(engine, [request("a", 5, 4)])
        assert done["a"].output_ids == tokens(5, 0, 3, 4)
        stream = engine.generate([request("b", 5, 30000)])
        await until_load(engine, 1)
        await engine.close()  # with a request in flight
        with pytest.raises(EngineError, match="closed with b in flight"):
            await anext(aiter(stream))
        assert not group_alive(pid)
        await engine.close()  # idempotent

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_server_that_fails_to_launch_is_one_clear_error(tmp_path) -> None:
    engine = _fake_launch(tmp_path, no_such_flag=1)

    async def main() -> None:
        with pytest.raises(EngineError, match=r"exited with code 2 while starting: .*unrecognized arguments"):
            await engine.start()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert engine.server is not None and getattr(engine.server, "process", None) is None


def test_a_server_killed_by_a_signal_is_not_left_as_a_zombie_group(tmp_path) -> None:
    engine = _fake_launch(tmp_path)

    async def main() -> None:
        await engine.start()
        assert isinstance(engine.server, ServerProcess) and engine.server.pid is not None
        pid = engine.server.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineError, match="sglang /generate for a failed"):
            await collect(engine, [request("a", 5, 4)])
        await engine.close()
        assert not group_alive(pid)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_an_attached_engine_leaves_the_server_running() -> None:
    async def main() -> None:
        server = FakeSGLangServer.Config(decode_step_s=0.005).build()
        await server.start()
        try:
            engine = SGLangEngine.Config(url=server.url).build()
            await engine.start()
            assert engine.server is None
            assert (await collect(engine, [request("a", 5, 3)]))["a"].num_tokens == 3
            await engine.close()
            async with httpx2.AsyncClient(base_url=server.url, trust_env=False) as client:
                assert (await client.get("/health")).status_code == 200
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


# ----------------------------------------------------------------------------- weights over a group
def test_weights_over_a_gloo_group_reach_the_fake_server_tensor_by_tensor() -> None:
    """``/init_weights_update_group`` then ``/update_weights_from_distributed``: the fake joins the
    sender's gloo group as rank ``rank_offset`` and receives every tensor of the header exactly (one
    broadcast each, SGLang's wire); later completions carry the update's version."""
    import torch

    from april_bench.collective import WeightGroup, header, host_address

    state = {
        "model.b": torch.arange(6, dtype=torch.float32).view(2, 3),
        "model.a": torch.tensor([7, -1, 3]),
        "lm_head.weight": torch.full((2, 2), 0.5, dtype=torch.bfloat16),
    }

    async def body(engine: SGLangEngine) -> None:
        with pytest.raises(EngineError, match="needs their header"):
            await engine.receive_weights(1)
        assert engine.weight_workers() == 1 and engine.weight_wire() == "per_tensor"
        address = host_address()
        sender, _ = await asyncio.gather(
            asyncio.to_thread(WeightGroup, address, 0, 2, timeout_s=20),
            engine.join_weight_group(address, 1, 2, "gloo"),
        )
        for version in (3, 4):
            sent = {k: v * version for k, v in state.items()}
            await asyncio.gather(
                asyncio.to_thread(sender.send_each, sent), engine.receive_weights(version, header(sent))
            )
            fake = engine.server
            assert isinstance(fake, FakeSGLangServer)
            assert list(fake.received) == sorted(state)
            for name, tensor in sent.items():
                got = fake.received[name]
                assert got.dtype == tensor.dtype and torch.equal(got, tensor), name
            out = await collect(engine, [request("after", 5, 3, seed=1)])
            assert out["after"].policy_version == version
        async with httpx2.AsyncClient(base_url=engine.url, trust_env=False) as other:
            rows = (
                await other.post("/get_weights_by_name", json={"name": "model.a", "truncate_size": 2})
            ).json()
            assert rows == [28, -4]
            bad = await other.post(
                "/update_weights_from_distributed", json={**header(state), "group_name": "x"}
            )
            assert bad.status_code == 400 and "no weight update group" in bad.text
        sender.close()

    run(body, eos_token_id=2)
