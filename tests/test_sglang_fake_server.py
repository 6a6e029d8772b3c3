"""The fake SGLang server answers like SGLang 0.5.23 in the cases the APRIL reference was bitten by.

Each test talks plain HTTP to an in-process fake server on loopback, on a real event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2
import pytest

from april_bench.engines.sglang import FakeSGLangServer
from april_bench.engines.sglang.fake_requests import fake_sglang_token
from april_bench.engines.sglang.fake_server import parse_args


def run(test: Callable[..., Awaitable[None]], **settings: Any) -> None:
    """Run ``test(client, server)`` against a fresh fake server (10 s cap)."""

    async def main() -> None:
        async with _serve(**settings) as (client, server):
            await asyncio.wait_for(test(client, server), 10)

    asyncio.run(main())


@contextlib.asynccontextmanager
async def _serve(**settings: Any) -> AsyncIterator[tuple[httpx2.AsyncClient, FakeSGLangServer]]:
    server = FakeSGLangServer.Config(**settings).build()
    await server.start()
    try:
        async with httpx2.AsyncClient(base_url=server.url, trust_env=False, timeout=10) as client:
            yield client, server
    finally:
        await server.stop()


def generate(
    client: httpx2.AsyncClient, rid: str, ids: list[int], max_new: int, **sp: Any
) -> asyncio.Task[Any]:
    body = {
        "input_ids": ids,
        "rid": rid,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": max_new, **sp},
    }
    return asyncio.ensure_future(client.post("/generate", json=body))


async def until(client: httpx2.AsyncClient, running: int, waiting: int = 0) -> None:
    """Poll ``/v1/loads`` until the server reports these counts."""
    while True:
        load = (await client.get("/v1/loads")).json()["loads"][0]
        if (load["num_running_reqs"], load["num_waiting_reqs"]) == (running, waiting):
            return
        await asyncio.sleep(0.005)


def tokens(first: int, seed: int, start: int, n: int, **kw: Any) -> list[int]:
    kw = {"vocab_size": 32000, "eos_token_id": 2, "eos_probability": 0.0} | kw
    return [fake_sglang_token(first, seed, start + i, **kw)[0] for i in range(n)]


def test_a_finished_request_returns_ids_logprob_triples_and_length_reason() -> None:
    async def test(client, server) -> None:
        out = (await generate(client, "r1", [7, 8, 9], 6, sampling_seed=4)).json()
        assert out["output_ids"] == tokens(7, 4, 3, 6)
        meta = out["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": 6}
        assert [t[1] for t in meta["output_token_logprobs"]] == out["output_ids"]
        assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] == 3
        assert meta["weight_version"] == "default" and meta["num_retractions"] == 0

    run(test)


def test_a_stop_id_ends_the_request_on_that_token_with_matched() -> None:
    async def test(client, server) -> None:
        stop = tokens(7, 0, 3, 5)[2]
        out = (await generate(client, "r1", [7, 8, 9], 5, stop_token_ids=[stop])).json()
        assert out["output_ids"] == tokens(7, 0, 3, 3)
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        ignored = (await generate(client, "r2", [7, 8, 9], 5, stop_token_ids=[stop], ignore_eos=True)).json()
        assert len(ignored["output_ids"]) == 5  # ignore_eos disables stop ids too, as in SGLang

    run(test)


def test_a_resumed_request_continues_the_same_tokens_and_seeds_matter_only_when_sampling() -> None:
    async def test(client, server) -> None:
        whole = (await generate(client, "a", [5, 1], 10, sampling_seed=3)).json()["output_ids"]
        resumed = (await generate(client, "b", [5, 1, *whole[:4]], 6, sampling_seed=3)).json()["output_ids"]
        assert resumed == whole[4:]
        other = (await generate(client, "c", [5, 1], 10, sampling_seed=4)).json()["output_ids"]
        assert other != whole
        greedy = [
            (await generate(client, f"g{s}", [5, 1], 4, temperature=0.0, sampling_seed=s)).json()[
                "output_ids"
            ]
            for s in (3, 4)
        ]
        assert greedy[0] == greedy[1]

    run(test)


def test_abort_of_a_waiting_request_returns_nothing_and_of_a_running_one_its_partial() -> None:
    async def test(client, server) -> None:
        running = generate(client, "run", [1, 2], 1000)
        await until(client, 1)
        waiting = generate(client, "wait", [3, 4], 1000)
        await until(client, 1, 1)
        await asyncio.sleep(0.1)
        assert (await client.post("/abort_request", json={"rid": "", "abort_all": True})).status_code == 200
        w = (await waiting).json()
        assert w["output_ids"] == [] and w["meta_info"]["completion_tokens"] == 0
        assert w["meta_info"]["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
        assert w["meta_info"]["output_token_logprobs"] == []
        r = (await running).json()
        assert r["meta_info"]["finish_reason"]["type"] == "abort"
        assert r["meta_info"]["finish_reason"]["message"] == "Aborted"
        assert 5 < len(r["output_ids"]) < 1000  # ~10 steps of 10 ms, plus the step after the abort
        assert r["output_ids"] == tokens(1, 0, 2, len(r["output_ids"]))

    run(test, max_running_requests=1)


def test_the_step_after_an_abort_still_decodes_and_the_abort_wins_over_the_length_limit() -> None:
    # One 200 ms step: the abort arrives while the only token is being decoded.  SGLang applies the
    # pending abort before the length check, so the request says abort with its one (last) token.
    async def test(client, server) -> None:
        task = generate(client, "r", [1, 2], 1)
        await until(client, 1)
        await client.post("/abort_request", json={"rid": "r"})
        out = (await task).json()
        assert out["output_ids"] == tokens(1, 0, 2, 1)
        assert out["meta_info"]["finish_reason"]["type"] == "abort"

    run(test, decode_step_s=0.2)


def test_a_request_arriving_after_abort_all_runs_until_aborted_again() -> None:
    # 150 ms of transit: the abort-all reaches the scheduler first and cannot touch the request.
    # Aborting it again by rid does nothing either (SGLang sends one abort per rid); abort-all does.
    async def test(client, server) -> None:
        task = generate(client, "late", [1, 2], 1000)
        while "late" not in server.scheduler.states:  # received, not yet in the scheduler
            await asyncio.sleep(0.001)
        await client.post("/abort_request", json={"abort_all": True})
        await client.post("/abort_request", json={"rid": "late"})  # arrives in transit: marks it sent
        await until(client, 1)
        await asyncio.sleep(0.05)
        await client.post("/abort_request", json={"rid": "late"})
        await asyncio.sleep(0.05)
        assert not task.done()
        await client.post("/abort_request", json={"abort_all": True})
        out = (await task).json()
        assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) > 5

    run(test, http_latency_s=0.15)


def test_abort_by_rid_is_a_prefix_match_and_an_empty_rid_is_ignored() -> None:
    async def test(client, server) -> None:
        tasks = {rid: generate(client, rid, [1, 2], 1000) for rid in ("r-1", "r-10", "r-2")}
        await until(client, 3)
        await client.post("/abort_request", json={"rid": ""})
        await client.post("/abort_request", json={"rid": "r-1"})
        done = {(await tasks[rid]).json()["meta_info"]["finish_reason"]["type"] for rid in ("r-1", "r-10")}
        assert done == {"abort"} and not tasks["r-2"].done()
        await client.post("/abort_request", json={"abort_all": True})
        await tasks["r-2"]

    run(test)


def test_a_retracted_request_aborted_in_the_queue_returns_only_its_last_flushed_tokens() -> None:
    # Non-streaming outputs reach SGLang's tokenizer every force_stream_interval tokens (here 4).
    # A request retracted with 6+ tokens and aborted while queued returns the first 4 (or 8, ...).
    async def test(client, server) -> None:
        task = generate(client, "r", [1, 2], 1000)
        await until(client, 1)
        while (await client.get("/v1/loads")).json()["loads"][0]["num_used_tokens"] < 2 + 6:
            await asyncio.sleep(0.005)
        await client.post("/pause_generation", json={"mode": "retract"})
        load = (await client.get("/v1/loads")).json()["loads"][0]
        assert (load["num_running_reqs"], load["num_waiting_reqs"], load["queues"]["retracted"]) == (0, 1, 1)
        await client.post("/abort_request", json={"abort_all": True})
        out = (await task).json()
        n = len(out["output_ids"])
        assert n >= 4 and n % 4 == 0
        assert out["output_ids"] == tokens(1, 0, 2, n)
        assert out["meta_info"]["finish_reason"]["message"] == "Abort in waiting queue"
        await client.post("/continue_generation", json={})

    run(test, force_stream_interval=4)


def test_a_full_kv_pool_retracts_requests_which_later_finish_with_their_count() -> None:
    # 3 requests of 2 + 30 tokens in a 70-token pool: they cannot all grow, so some are retracted,
    # re-queued, and finish later with num_retractions > 0 and the same tokens as without retraction.
    async def test(client, server) -> None:
        outs = [(await t).json() for t in [generate(client, f"r{i}", [i + 1, 9], 30) for i in range(3)]]
        assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
        for i, out in enumerate(outs):
            assert out["output_ids"] == tokens(i + 1, 0, 2, 30)

    run(test, max_total_tokens=70, decode_step_s=0.001)


def test_weight_update_waits_for_running_requests_and_holds_new_ones_then_bumps_the_version(tmp_path) -> None:
    async def test(client, server) -> None:
        old = generate(client, "old", [1, 2], 20)
        await until(client, 1)
        update = asyncio.ensure_future(
            client.post(
                "/update_weights_from_disk", json={"model_path": str(tmp_path), "weight_version": "1"}
            )
        )
        await asyncio.sleep(0.02)
        new = generate(client, "new", [3, 4], 3)
        await asyncio.sleep(0.02)
        assert not update.done()  # the writer waits for "old"
        first = (await old).json()
        assert first["meta_info"]["weight_version"] == "default" and len(first["output_ids"]) == 20
        result = await update
        assert result.status_code == 200 and result.json()["success"] is True
        assert (await new).json()["meta_info"]["weight_version"] == "1"  # held until the update finished
        info = (await client.get("/model_info")).json()
        assert (info["weight_version"], info["model_path"]) == ("1", str(tmp_path))
        bad = await client.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "missing")})
        assert bad.status_code == 400 and bad.json()["success"] is False

    run(test)


def test_a_version_change_mid_request_shows_as_weight_version_spans() -> None:
    async def test(client, server) -> None:
        task = generate(client, "r", [1, 2], 30)
        while (await client.get("/v1/loads")).json()["loads"][0]["num_used_tokens"] < 2 + 5:
            await asyncio.sleep(0.005)
        body = {"new_version": "7", "abort_all_requests": False}
        assert (await client.post("/update_weight_version", json=body)).json()["new_version"] == "7"
        meta = (await task).json()["meta_info"]
        spans = meta["weight_versions"]
        assert [s["version"] for s in spans] == ["default", "7"] and meta["weight_version"] == "7"
        assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == 30

    run(test)


def test_flush_cache_is_refused_while_requests_run() -> None:
    async def test(client, server) -> None:
        task = generate(client, "r", [1, 2], 1000)
        await until(client, 1)
        assert (await client.post("/flush_cache")).status_code == 400
        await client.post("/abort_request", json={"abort_all": True})
        await task
        assert (await client.post("/flush_cache")).status_code == 200

    run(test)


def test_invalid_requests_get_sglangs_400_errors() -> None:
    async def test(client, server) -> None:
        long = (await generate(client, "x", [1] * 10, 10)).json()
        assert "maximum context length of 16 tokens" in long["error"]["message"]
        running = generate(client, "dup", [1, 2], 14)
        await until(client, 1)
        dup = await generate(client, "dup", [1, 2], 5)
        assert (
            dup.status_code == 400 and "Duplicate request ID detected: dup" in dup.json()["error"]["message"]
        )
        await client.post("/abort_request", json={"abort_all": True})
        await running
        assert (await client.get("/metrics")).status_code == 404  # only with --enable-metrics
        assert (await client.get("/nope")).status_code == 404

    run(test, context_length=16, decode_step_s=0.05)


def test_a_client_that_disconnects_has_its_request_aborted() -> None:
    async def test(client, server) -> None:
        async with httpx2.AsyncClient(base_url=server.url, trust_env=False) as other:
            task = generate(other, "r", [1, 2], 1000)
            await until(client, 1)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await until(client, 0)

    run(test)


def test_health_answers_503_while_the_model_loads_and_metrics_count_tokens() -> None:
    async def test(client, server) -> None:
        assert (await client.get("/health")).status_code == 503
        await asyncio.sleep(0.25)
        assert (await client.get("/health")).status_code == 200
        await generate(client, "r", [1, 2], 3)
        text = (await client.get("/metrics")).text
        assert 'sglang:generation_tokens_total{model_name="fake-model"' in text
        assert "} 3.0" in text.split("sglang:generation_tokens_total")[2]

    run(test, startup_s=0.2, enable_metrics=True)


def test_the_command_line_takes_sglangs_flags() -> None:
    sglang_flags = ["--model-path", "m", "--port", "31000", "--skip-tokenizer-init", "--tp-size", "2"]
    config = parse_args(
        [*sglang_flags, "--max-running-requests", "8", "--enable-metrics", "--decode-step-s", "0.02"]
    )
    assert (config.model_path, config.port, config.max_running_requests) == ("m", 31000, 8)
    assert config.enable_metrics is True and config.decode_step_s == 0.02
    with pytest.raises(SystemExit):
        parse_args(["--no-such-flag", "1"])
