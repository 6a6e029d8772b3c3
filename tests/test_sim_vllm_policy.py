"""The simulator's vLLM scheduling policy (a cost curve measured on vLLM): waiting prefills ride in the
running requests' decode step (one iteration, as vLLM's stat logger counts it), admission needs only the
prompt's KV, and a step that finds no free KV preempts the latest admitted request, which goes first in
line and re-prefills prompt and output.  Exact schedules, on a virtual clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

from april_bench.engines.protocol import GenerateRequest, SamplingParams
from april_bench.engines.sim import CostCurve
from april_bench.engines.sim.engine import SimEngine
from april_bench.vtime import run_virtual


def _engine(tmp_path: Path, engine: str, kv: int = 100_000) -> SimEngine:
    curve = CostCurve(
        engine=engine,
        model="tiny",
        hardware="cpu",
        prefill_base_s=1.0,
        prefill_per_token_s=0.0,
        decode_base_s=1.0,
        decode_per_seq_s=0.0,
        decode_per_context_token_s=0.0,
        max_running=64,
        kv_capacity_tokens=kv,
        chunk_tokens=4096,
        abort_extra_steps=0,
    )
    path = tmp_path / f"{engine}.json"
    curve.save(path)
    return SimEngine.Config(hardware="cpu", model="tiny", cost_curve=str(path)).build()


def _request(rid: str, prompt: int, length: int) -> GenerateRequest:
    return GenerateRequest(
        rid, input_len=prompt, max_new_tokens=64, sampling=SamplingParams(), replay_len=length
    )


def _run(engine: SimEngine, late_after_s: float | None = None) -> dict[str, object]:
    async def main() -> dict[str, object]:
        await engine.start()
        try:
            done = {}
            first = engine.generate([_request("a", 4, 10)])
            if late_after_s is not None:
                await asyncio.sleep(late_after_s)
                second = engine.generate([_request("b", 4, 3)])
                done.update({c.request_id: c async for c in second})
            done.update({c.request_id: c async for c in first})
            return done
        finally:
            await engine.close()

    return run_virtual(main())


def test_a_late_prefill_rides_in_the_decode_step_under_vllm_and_not_under_sglang(tmp_path: Path) -> None:
    vllm, sglang = _engine(tmp_path, "vllm"), _engine(tmp_path, "hf")
    _run(vllm, late_after_s=3.5)
    _run(sglang, late_after_s=3.5)
    # a: 1 prefill + 9 decode steps; b's prefill is one more forward under SGLang, none under vLLM
    assert vllm.simulated_work().engine_iterations == 10
    assert sglang.simulated_work().engine_iterations == 11
    work = vllm.simulated_work()
    assert work.decode_iterations == work.engine_iterations  # vLLM counts every step as one
    assert work.decode_tokens == 10 + 3  # every sampled token, first ones included
    histogram = vllm.decode_histogram()
    assert sum(histogram.values()) == 10 and histogram.get(2)  # steps where a and b both sampled


def test_a_full_pool_preempts_the_latest_admitted_request_first(tmp_path: Path) -> None:
    engine = _engine(tmp_path, "vllm", kv=30)

    async def main() -> dict[str, object]:
        await engine.start()
        try:
            stream = engine.generate([_request("a", 4, 20), _request("b", 4, 20)])
            return {c.request_id: c async for c in stream}
        finally:
            await engine.close()

    done = run_virtual(main())
    assert engine.preemptions() >= 1
    assert done["b"].num_retractions >= 1 and done["a"].num_retractions == 0  # b came in last
    assert done["a"].num_tokens == done["b"].num_tokens == 20
    assert engine.simulated_work().prefill_tokens > 8  # b re-prefilled its prompt and its output
