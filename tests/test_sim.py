"""The simulator: cost model against published constants, DES timing, abort, KV pressure, determinism."""

from __future__ import annotations

import asyncio
import random

import pytest

from april_bench.engines.protocol import GenerateRequest, SamplingParams
from april_bench.engines.sim.cost import CostModel, DecodeCost, _sum_max_linear
from april_bench.engines.sim.cost_curve import CostCurve, MeasuredCost
from april_bench.engines.sim.engine import SimEngine
from april_bench.experiment import ExperimentConfig, run
from april_bench.profiles.hardware import hardware_profile
from april_bench.profiles.models import MODELS
from april_bench.results.records import as_row
from april_bench.rollout.loop import RolloutConfig
from april_bench.vtime import run_virtual

SP = SamplingParams()


def test_model_constants_match_published_figures() -> None:
    # landscape.md §4b: Qwen3-4B 3.63 B non-embedding params, 8.04 GB per decode step, 144 KiB KV/token;
    # R1-Distill-1.5B 1.31 B, 3.09 GB, 28 KiB; Qwen3-8B 6.95 B, 15.14 GB, 144 KiB.
    expected = {
        "qwen3-4b": (3.63, 8.04, 144),
        "r1-distill-qwen-1.5b": (1.31, 3.09, 28),
        "qwen3-8b": (6.95, 15.14, 144),
    }
    for name, (params, step_gb, kv_kib) in expected.items():
        m = MODELS.get(name)
        assert m.non_embedding_params / 1e9 == pytest.approx(params, abs=0.01)
        assert m.decode_weight_bytes / 1e9 == pytest.approx(step_gb, abs=0.01)
        assert m.kv_bytes_per_token / 1024 == kv_kib


def test_closed_form_run_time_equals_the_sum_of_iterations() -> None:
    rng = random.Random(0)
    for _ in range(500):
        p = (rng.uniform(-3, 3), rng.uniform(-1, 1))
        q = (rng.uniform(-3, 3), rng.uniform(-1, 1))
        k = rng.randint(0, 40)
        brute = sum(max(p[0] + p[1] * i, q[0] + q[1] * i) for i in range(k))
        assert _sum_max_linear(p, q, k) == pytest.approx(brute, abs=1e-9)
    cost = CostModel(hardware_profile("h100"), MODELS.get("qwen3-4b"), tp=2)
    total = sum(cost.decode_iteration_time(96, 300_000 + 96 * i) for i in range(250))
    assert cost.decode_run_time(96, 300_000, 250) == pytest.approx(total, rel=1e-12)
    assert cost.iterations_within(96, 300_000, 250, total) == 250
    assert cost.iterations_within(96, 300_000, 250, total * 0.5) < 250


def test_both_cost_models_count_the_steps_a_budget_holds_with_one_bisection() -> None:
    curve = CostCurve(
        engine="x",
        model="tiny",
        hardware="cpu",
        prefill_base_s=0.5,
        prefill_per_token_s=0.01,
        decode_base_s=0.002,
        decode_per_seq_s=0.0003,
        decode_per_context_token_s=1e-6,
    )
    models = [CostModel(hardware_profile("h100"), MODELS.get("qwen3-4b"), tp=2), MeasuredCost(curve)]
    assert CostModel.iterations_within is MeasuredCost.iterations_within is DecodeCost.iterations_within
    for cost in models:
        batch, context, limit = 7, 900.0, 60
        for budget in (
            0.0,
            cost.decode_run_time(batch, context, 1),
            cost.decode_run_time(batch, context, 33) * 1.0001,
        ):
            brute = max(k for k in range(limit + 1) if cost.decode_run_time(batch, context, k) <= budget)
            assert cost.iterations_within(batch, context, limit, budget) == brute
        assert cost.iterations_within(batch, context, limit, float("inf")) == limit
        rate = cost.saturated_tokens_per_s(batch, context)
        assert rate == pytest.approx(batch / cost.decode_iteration_time(batch, batch * context))
        assert cost.saturated_tokens_per_s(0, context) == 0.0


def test_decode_is_memory_bound_small_and_compute_bound_large() -> None:
    cost = CostModel(hardware_profile("h100"), MODELS.get("qwen3-4b"), tp=1)
    # B=1: the weights dominate, so doubling a tiny batch costs almost nothing...
    assert cost.decode_iteration_time(2, 2000) / cost.decode_iteration_time(1, 1000) < 1.05
    # ...while past the ridge (~300 tokens per iteration on H100) time grows ~linearly with B.
    assert cost.decode_iteration_time(4096, 0) / cost.decode_iteration_time(2048, 0) > 1.8


def _engine(**kw: object) -> SimEngine:
    settings = {"hardware": "h100", "model": "qwen3-4b", "num_gpus": 1, "tp_size": 1}
    settings.update(kw)
    return SimEngine.Config(**settings).build()


def test_one_request_takes_its_prefill_plus_its_decode_run() -> None:
    engine = _engine()

    async def main() -> tuple[float, int, str]:
        await engine.start()
        req = GenerateRequest("a", input_len=100, max_new_tokens=1000, sampling=SP, replay_len=50)
        (c,) = [c async for c in engine.generate([req])]
        await engine.close()
        return c.t_done, c.num_tokens, c.finish_reason.value

    t_done, tokens, reason = run_virtual(main())
    prefill = engine.cost.prefill_time([(0, 100)])
    decode = engine.cost.decode_run_time(1, 101, 49)  # the prefill sampled token 1 of 50
    assert (tokens, reason) == (50, "stop")
    assert t_done == pytest.approx(prefill + decode, rel=1e-12)


def test_length_limit_truncates() -> None:
    engine = _engine()

    async def main() -> tuple[int, str]:
        await engine.start()
        req = GenerateRequest("a", input_len=10, max_new_tokens=30, sampling=SP, replay_len=500)
        (c,) = [c async for c in engine.generate([req])]
        await engine.close()
        return c.num_tokens, c.finish_reason.value

    assert run_virtual(main()) == (30, "length")


def test_abort_returns_partial_tokens_after_one_more_decode_step() -> None:
    engine = _engine()
    at = 0.5

    async def main() -> list[tuple[int, str, float]]:
        await engine.start()
        reqs = [
            GenerateRequest(f"r{i}", input_len=100, max_new_tokens=10_000, sampling=SP, replay_len=10_000)
            for i in range(2)
        ]
        stream = engine.generate(reqs)
        await asyncio.sleep(at)
        await engine.abort()
        out = [(c.num_tokens, c.finish_reason.value, c.t_done) async for c in stream]
        await engine.close()
        return out

    out = run_virtual(main())
    cost = engine.cost
    prefill = cost.prefill_time([(0, 100), (0, 100)])
    done = cost.iterations_within(2, 202, 10_000, at - prefill)
    boundary = done + 1  # the iteration in progress completes, then one more runs
    tokens = 1 + boundary + 1
    t = prefill + cost.decode_run_time(2, 202, boundary + 1)
    assert out == [(tokens, "abort", pytest.approx(t)), (tokens, "abort", pytest.approx(t))]


def test_tight_kv_pool_retracts_and_still_finishes_every_request() -> None:
    # ~3,300 tokens of KV for requests that grow to 1,100 tokens each: admission over-commits as the
    # new-token ratio decays, so decode runs out of pool and retracts.
    engine = _engine(mem_fraction_static=0.1, max_running_requests=8)
    assert engine.settings.kv_capacity < 4000

    async def main() -> list[tuple[int, str, int]]:
        await engine.start()
        reqs = [
            GenerateRequest(f"r{i}", input_len=100, max_new_tokens=1000, sampling=SP, replay_len=1000)
            for i in range(6)
        ]
        out = [(c.num_tokens, c.finish_reason.value, c.num_retractions) async for c in engine.generate(reqs)]
        load = await engine.load()
        await engine.close()
        assert load.idle and load.kv_tokens_used == 0
        return out

    out = run_virtual(main())
    assert sorted(t for t, _, _ in out) == [1000] * 6
    assert {r for _, r, _ in out} == {"stop"}
    assert sum(n for _, _, n in out) > 0


def _small(**kw: object) -> ExperimentConfig:
    rollout = RolloutConfig(
        rollout_batch_size=8, n_samples_per_prompt=4, over_sampling_batch_size=16, max_response_len=4096
    )
    settings: dict[str, object] = {"hardware": "h100", "steps": 4, "rollout": rollout, "engine": "sim"}
    settings.update(kw)
    return ExperimentConfig(**settings)  # type: ignore[arg-type]


def _requests_and_summary(config: ExperimentConfig) -> tuple[list[dict], dict]:
    rec = run(config, progress=False).recorder
    requests = [as_row(r) for r in rec["requests"]]
    summary = rec.summary()
    return requests, summary


def test_simulation_is_deterministic_under_a_seed() -> None:
    first, _ = _requests_and_summary(_small(seed=3))
    second, _ = _requests_and_summary(_small(seed=3))
    other, _ = _requests_and_summary(_small(seed=4))
    assert first == second
    assert first != other


def test_every_prompt_and_token_is_accounted_for_in_every_arm() -> None:
    _, summary = _requests_and_summary(_small(algorithm="dapo", steps=5))
    for arm, m in summary.items():
        assert m["prompts"]["inconsistent"] == 0, arm
        assert (
            m["prompts"]["launched"]
            == m["prompts"]["trained"] + m["prompts"]["dropped"] + m["prompts"]["buffered"]
        )
        assert (
            m["generated_tokens"] == m["trained_tokens"] + m["wasted_tokens"] + m["buffered_tokens_at_end"]
        ), arm
    assert summary["sync"]["off_policy_token_ratio"] == 0
    assert summary["april"]["off_policy_token_ratio"] > 0


def _gain(**workload: object) -> float:
    # Concurrency matched: each of the 4 replicas runs at most the 8 requests sync launches per
    # replica, so the only difference left between the arms is what happens in the tail.
    _, summary = _requests_and_summary(
        _small(
            strategies=("sync", "april"),
            steps=6,
            engine_args={"max_running_requests": 8},
            workload_args=workload,
        )
    )
    return summary["april"]["throughput_gain"]


def test_no_tail_means_no_gain_and_the_gain_grows_with_the_tail() -> None:
    # A 300-token median keeps the 4,096 cap out of the way: a tail censored at the cap is a
    # pile of equal lengths, which is a *lighter* tail.
    flat = {"response_median": 300, "prompt_sigma": 0.0, "within_sigma": 0.0, "incorrect_factor": 1.0}
    assert abs(_gain(**flat)) < 0.02
    mild = _gain(response_median=300, prompt_sigma=0.3, within_sigma=0.2, incorrect_factor=1.0)
    heavy = _gain(response_median=300, prompt_sigma=0.8, within_sigma=0.6, incorrect_factor=3.0)
    assert 0.02 < mild < heavy


# Regressions found in review -------------------------------------------------------------------------


def _replica(**settings: object):
    from april_bench.engines.sim.replica import ReplicaSettings, SimReplica

    cost = CostModel(hardware_profile("h100"), MODELS.get("qwen3-4b"), tp=1)
    base = {
        "kv_capacity": 20_000,
        "max_running": 64,
        "chunk_tokens": 8192,
        "schedule_conservativeness": 1.0,
        "replan_iterations": 64,
    }
    base.update(settings)
    return SimReplica(0, cost, ReplicaSettings(**base), [0]), cost  # type: ignore[arg-type]


def test_admission_reserves_for_max_new_tokens_not_the_hidden_length() -> None:
    # SGLang cannot know that these responses stop after 100 tokens: with 16,384 max_new_tokens it
    # reserves 100 + 4,096 tokens per request, so a 20,000-token pool admits 4 at first, not 16.
    from april_bench.engines.stream import CompletionStream

    async def main() -> int:
        replica, _ = _replica()
        task = asyncio.ensure_future(replica.run())
        for i in range(16):
            req = GenerateRequest(f"r{i}", input_len=100, max_new_tokens=16384, sampling=SP, replay_len=100)
            replica.submit(req, CompletionStream(1))
        while not replica.running:
            await asyncio.sleep(1e-4)
        task.cancel()
        return len(replica.running)

    assert run_virtual(main()) == 20_000 // (100 + 4096)


def test_requests_in_an_extend_batch_count_as_running() -> None:
    engine = _engine()

    async def main() -> tuple[int, int, bool]:
        await engine.start()
        stream = engine.generate(
            [GenerateRequest("a", input_len=8000, max_new_tokens=100, sampling=SP, replay_len=100)]
        )
        await asyncio.sleep(0.005)  # inside the 8,000-token prefill
        load = await engine.load()
        await engine.abort()
        [c async for c in stream]
        await engine.close()
        return load.running, load.waiting, load.idle

    assert run_virtual(main()) == (1, 0, False)


def test_an_aborted_request_that_gets_retracted_returns_instead_of_running_again() -> None:
    from april_bench.engines.stream import CompletionStream

    it_time = CostModel(hardware_profile("h100"), MODELS.get("qwen3-4b"), tp=1).decode_iteration_time(4, 100)
    for seed in range(200):
        delay = it_time * random.Random(seed).uniform(1, 40)

        async def main(delay: float = delay) -> list[tuple[int, float]]:
            replica, _ = _replica(
                kv_capacity=120, max_running=8, chunk_tokens=256, schedule_conservativeness=0.1
            )
            task = asyncio.ensure_future(replica.run())
            streams = []
            for i in range(6):
                stream = CompletionStream(1)
                replica.submit(GenerateRequest(f"r{i}", 8, 60, SP, replay_len=60), stream)
                streams.append(stream)
            await asyncio.sleep(delay)
            t_abort = asyncio.get_running_loop().time()
            replica.request_abort(None)
            out = [(c.num_retractions, c.t_done - t_abort) for s in streams async for c in s]
            assert replica.kv_used == 0
            task.cancel()
            return out

        # every request is back within two decode steps of the abort, retracted or not
        assert all(dt <= 3 * it_time for _, dt in run_virtual(main())), seed
