"""The answers to the long tail published since APRIL, as arms beside it: exact schedules on the fake
engine (one token per second per request; N=2 groups of n=2, N'=4, 64 tokens, prompts of 4 tokens),
derived by hand from each arm's rule, and the simulator's prices for what they need (weight versions,
speculative decoding).  The lookahead driver's schedules are in tests/test_async_driver.py.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from helpers import fake_arm, sim_flags

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.engines import ENGINES
from april_bench.engines.fake import FakeEngine
from april_bench.engines.protocol import EngineError, GenerateRequest, SamplingParams, WeightUpdate
from april_bench.engines.sim.engine import SimEngine
from april_bench.engines.sim.speculative import SpeculativeCost, expected_tokens
from april_bench.vtime import run_virtual
from april_impl import (
    AprilStrategy,
    ConsistentStrategy,
    ResponseOversampleStrategy,
    StragglerAwareGroupStrategy,
)
from april_impl.sagc import next_group_size


def long_every_fourth(uid: int, index: int) -> int:
    return 100 if uid % 4 == 0 else 10


def _work(outcomes):  # (prefill tokens, re-prefill tokens) per step
    return [(o.record.prefill_tokens, o.record.reprefill_tokens) for o in outcomes]


# ----------------------------------------------------------------------------- consistent (DORA)


def test_consistent_finishes_every_partial_on_the_version_that_began_it_without_a_re_prefill() -> None:
    april_out, april_rec, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4).build(), long_every_fourth, steps=4
    )
    out, rec, loop = fake_arm(
        ConsistentStrategy.Config(over_sampling_batch_size=4).build(), long_every_fourth, steps=4
    )
    # The same schedule as APRIL's (test_schedules.py): the same steps, tokens and groups ...
    assert [(o.record.rollout_time_s, o.record.generated_tokens, [g.uid for g in o.batch]) for o in out] == [
        (o.record.rollout_time_s, o.record.generated_tokens, [g.uid for g in o.batch]) for o in april_out
    ]
    # ... but uid 0, sample 0 is sent four times on version 0, the one it started on
    sends = [
        (r.prefix_len, r.max_new_tokens, r.output_len, r.finish_reason, r.policy_version)
        for r in rec["requests"]
        if r.group_uid == 0 and r.sample_index == 0
    ]
    assert sends == [
        (0, 64, 11, "abort", 0),
        (11, 53, 11, "abort", 0),
        (22, 42, 11, "abort", 0),
        (33, 31, 31, "length", 0),
    ]
    trained0 = next(s for s in rec["samples"] if s.group_uid == 0 and s.fate == "trained")
    assert trained0.version_runs == [[0, 64]] and trained0.off_policy_tokens == 64  # one version, all old
    april0 = next(s for s in april_rec["samples"] if s.group_uid == 0 and s.fate == "trained")
    assert april0.version_runs == [[0, 11], [1, 11], [2, 11], [3, 31]]
    # Prefill per step: fresh groups 4 x 4 prompt tokens each step after the first; APRIL re-prefills
    # each resumed partial (uid 0 with 11, 22, 33 tokens, uid 4 with 11, 22: two samples each), consistent
    # computes only its last input token (its KV, from its own version, is kept).
    assert _work(april_out) == [(32, 0), (46, 30), (98, 82), (142, 126)]
    assert _work(out) == [(32, 0), (18, 2), (20, 4), (20, 4)]
    # The engine holds the versions the buffered partials began on: uid 4 (step 1) and uid 8 (step 3).
    assert [g.uid for g in loop.buffer] == [4, 8]
    engine = loop.engine
    assert isinstance(engine, FakeEngine) and engine.version == 4 and engine.held_versions() == (1, 3)


def test_a_partial_whose_weights_are_gone_restarts_instead_of_failing(monkeypatch) -> None:
    # A resumed hf run has only the trainer's latest weights: the engine holds no old version, so a
    # buffered partial pinned to one restarts from its prompt (counted) instead of failing the step.
    monkeypatch.setattr(FakeEngine, "retain_versions", lambda self, versions: None)  # keeps none
    out, _, _ = fake_arm(
        ConsistentStrategy.Config(over_sampling_batch_size=4).build(), long_every_fourth, steps=2
    )
    # step 1: uid 0's two partials (11 tokens each, from version 0) restart; uid 3 was finished
    assert [(o.record.restarted_samples, o.record.restart_tokens) for o in out] == [(0, 0), (2, 22)]


def test_an_engine_refuses_a_version_it_does_not_hold() -> None:
    engine = FakeEngine.Config().build()

    def request(version: int) -> GenerateRequest:
        return GenerateRequest(
            "r", 2, 4, SamplingParams(), input_ids=(1, 2), replay_len=3, policy_version=version
        )

    async def body() -> None:
        await engine.start()
        engine.retain_versions([0])
        await engine.update_weights(WeightUpdate(1))
        await engine.update_weights(WeightUpdate(2))  # 0 kept (retained); 1 was not asked for: freed
        assert engine.held_versions() == (0,)
        async for c in engine.generate([request(0)]):
            assert (c.policy_version, c.version_runs) == (0, None)
        with pytest.raises(EngineError, match="weight version 1 is not held"):
            engine.generate([request(1)])
        engine.retain_versions([])
        assert engine.held_versions() == ()

    run_virtual(body())


def test_consistent_is_refused_up_front_on_an_engine_with_one_weight_version(capsys) -> None:
    assert main(["validate", "--engine", "sglang-fake", "--strategies", "sync,consistent"]) == 2
    err = capsys.readouterr().err
    assert "two weight versions in one engine" in err and "lora_path" in err and "Traceback" not in err
    assert "LoRARequest" in ENGINES.get("vllm").versions_missing
    assert [n for n in ("sim", "hf", "fake") if ENGINES.get(n).holds_versions] == ["sim", "hf", "fake"]


def _sim(**args) -> SimEngine:
    return SimEngine.Config(hardware="h100", model="qwen3-4b", **args).build()


def test_the_simulator_prices_two_versions_as_two_forwards_and_a_weight_copy_of_memory() -> None:
    def request(rid: str, version: int | None) -> GenerateRequest:
        return GenerateRequest(
            rid, 100, 64, SamplingParams(), replay_len=50, routing_key="k", policy_version=version
        )

    async def finish(versions: list[int | None]) -> tuple[float, SimEngine]:
        engine = _sim(tp_size=8)  # one replica: both requests on it
        await engine.start()
        engine.retain_versions([0])
        await engine.update_weights(WeightUpdate(1))
        start = asyncio.get_running_loop().time()
        done = [c async for c in engine.generate([request(f"r{i}", v) for i, v in enumerate(versions)])]
        await engine.close()
        assert {c.policy_version for c in done} == {0 if v == 0 else 1 for v in versions}
        return max(c.t_done for c in done) - start, engine

    one, engine = run_virtual(finish([None, None]))
    two, _ = run_virtual(finish([0, None]))
    cost = engine.cost
    # one extend batch and 49 decode iterations of batch 2; with two versions each is two forwards
    assert one == pytest.approx(
        cost.prefill_time([(0, 100), (0, 100)]) + cost.decode_run_time(2, 202, 49), rel=1e-12
    )
    assert two == pytest.approx(
        2 * cost.prefill_time([(0, 100)]) + 2 * cost.decode_run_time(1, 101, 49), rel=1e-12
    )
    assert two > one
    # memory: each old version held takes one copy of the weights out of the KV pool
    copy = -(-2 * engine.model.total_params // engine.model.kv_bytes_per_token)
    assert engine.held_versions() == (0,)
    assert engine.replicas[0].kv_capacity == engine.settings.kv_capacity - copy
    engine.retain_versions([])
    assert engine.replicas[0].kv_capacity == engine.settings.kv_capacity


# ----------------------------------------------------------------------------- SAGC


def test_sagc_shrinks_the_group_while_the_stop_cuts_off_too_many_groups() -> None:
    strategy = StragglerAwareGroupStrategy.Config(over_sampling_batch_size=4, max_straggler_rate=0.2).build()
    out, _, _ = fake_arm(strategy, long_every_fourth, steps=4, n_samples_per_prompt=4)
    # Step 0 (n = 4): 0..3 launched; 1, 2 accepted at t=10; 0 is cut off (1 straggler of 4 launched:
    #   0.25 > 0.2), 3 is finished surplus: n -> floor(4 / 1.5) = 2.  3 x 4 x 10 + 4 x 11 tokens.
    # Step 1: 3 (buffered, finished) at once, 5 (n = 2) at t=10; 0 and 4 cut off (0.5): n stays at the
    #   floor of 2.  0 gains 4 x 11, 4 2 x 11, 5 2 x 10 tokens.
    # Step 2: 6 and 7 at t=10; 0 and 4 cut off again.  Step 3: 9 at t=10, 0 reaches 64 at t=31.
    assert [
        (o.record.rollout_time_s, o.record.generated_tokens, [(g.uid, len(g.samples)) for g in o.batch])
        for o in out
    ] == [
        (11.0, 164, [(1, 4), (2, 4)]),
        (11.0, 86, [(3, 4), (5, 2)]),
        (11.0, 106, [(6, 2), (7, 2)]),
        (32.0, 272, [(9, 2), (0, 4)]),
    ]
    assert strategy.state() == {"samples": 2}


def test_sagc_grows_back_when_few_groups_are_cut_off() -> None:
    cfg = StragglerAwareGroupStrategy.Config(max_straggler_rate=0.4, min_samples=2, factor=1.5)
    assert next_group_size(8, 0.5, 8, cfg) == 5  # above the bound: divide
    assert next_group_size(5, 0.3, 8, cfg) == 5  # between half the bound and the bound: keep
    assert next_group_size(5, 0.1, 8, cfg) == 8  # under half: multiply, capped at the most
    assert next_group_size(2, 0.9, 8, cfg) == 2  # never under min_samples
    with pytest.raises(ConfigError, match="min_samples <= max_samples"):
        StragglerAwareGroupStrategy.Config(min_samples=4, max_samples=2)


# ----------------------------------------------------------------------------- RollPacker's responses


def test_response_oversample_keeps_the_first_n_responses_and_drops_the_rest() -> None:
    def second_is_long(uid: int, index: int) -> int:
        return 40 if index == 1 else 10

    april, _, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=2).build(),
        second_is_long,
        steps=2,
        over_sampling_batch_size=2,
    )
    out, rec, _ = fake_arm(
        ResponseOversampleStrategy.Config(over_sampling_batch_size=2).build(),
        second_is_long,
        steps=2,
        over_sampling_batch_size=2,
    )
    # APRIL (N' = N = 2) waits 40 s for every group's long response.  Here each group launches
    # ceil(1.5 x 2) = 3 responses; 0 and 2 finish at t=10 and complete it; 1 is aborted then and
    # returns at t=11 with the token in flight (11 tokens, dropped).
    assert [(o.record.rollout_time_s, o.record.generated_tokens) for o in april] == [(40.0, 100), (40.0, 100)]
    assert [(o.record.rollout_time_s, o.record.generated_tokens) for o in out] == [(11.0, 62), (11.0, 62)]
    assert [[(g.uid, [s.index for s in g.samples]) for g in o.batch] for o in out] == [
        [(0, [0, 2]), (1, [0, 2])],
        [(2, [0, 2]), (3, [0, 2])],
    ]
    surplus = [
        (s.group_uid, s.sample_index, s.response_len)
        for s in rec["samples"]
        if s.reason == "response_surplus"
    ]
    assert surplus == [(0, 1, 11), (1, 1, 11), (2, 1, 11), (3, 1, 11)]
    m = rec.summary(baseline="response-oversample")["response-oversample"]
    assert (m["generated_tokens"], m["trained_tokens"], m["wasted_tokens"]) == (124, 80, 44)
    # a dropped response is not its prompt's fate: each prompt is trained, once
    assert m["prompts"] == {"launched": 4, "trained": 4, "dropped": 0, "buffered": 0, "inconsistent": 0}


def test_extra_responses_draw_from_the_same_prompt_without_moving_the_first_n() -> None:
    from april_bench.sim.lengths import LognormalLengths

    lengths = LognormalLengths(
        median=1000,
        prompt_sigma=0.5,
        within_sigma=0.3,
        incorrect_factor=2,
        solve_a=1,
        solve_b=1,
        drift_per_step=0,
        seed=3,
    )
    before = lengths.draw(7, 4)
    extra = [lengths.extra(7, 4, i) for i in (4, 5)]
    assert lengths.draw(7, 4) == before and extra == [lengths.extra(7, 4, i) for i in (4, 5)]
    assert extra[0] != extra[1]
    # without within-prompt spread every response of a prompt is its right or wrong length: the
    # extra ones too (they share the prompt's effect), so all take at most two values, log 2 apart
    flat = LognormalLengths(
        median=1000,
        prompt_sigma=0.5,
        within_sigma=0,
        incorrect_factor=2,
        solve_a=1,
        solve_b=1,
        drift_per_step=0,
        seed=3,
    )
    values = {round(v, 9) for v in flat.draw(7, 4).log_lengths} | {
        round(flat.extra(7, 4, i)[0], 9) for i in range(4, 12)
    }
    assert len(values) <= 2 and (
        len(values) == 1 or round(max(values) - min(values), 9) == round(math.log(2), 9)
    )


# ----------------------------------------------------------------------------- speculative decoding


def test_speculative_expected_tokens_is_leviathans_formula() -> None:
    assert expected_tokens(0.6, 4) == pytest.approx((1 - 0.6**5) / 0.4)
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0


def test_speculation_pays_at_a_small_batch_only_and_costs_memory() -> None:
    plain, spec = _sim(), _sim(speculative="qwen3-0.6b")
    assert isinstance(spec.cost, SpeculativeCost)
    # memory-bound, one request at 2,000 tokens: cheaper per token; 256 requests: the engine declines
    assert spec.cost.decode_iteration_time(1, 2000) < plain.cost.decode_iteration_time(1, 2000)
    assert spec.cost.decode_iteration_time(256, 256 * 2000) == plain.cost.decode_iteration_time(
        256, 256 * 2000
    )
    capped = _sim(speculative="qwen3-0.6b", speculative_max_batch=1)
    assert capped.cost.decode_iteration_time(2, 4000) == plain.cost.decode_iteration_time(2, 4000)
    assert spec.settings.kv_capacity < plain.settings.kv_capacity  # the drafter's weights and KV
    with pytest.raises(ConfigError, match="speculative_acceptance"):
        _sim(speculative="qwen3-0.6b", speculative_acceptance=1.5)


@pytest.mark.slow
def test_speculation_is_an_engine_option_every_arm_runs_with(tmp_path) -> None:
    import json

    def run(name: str, *extra: str) -> dict:
        argv = sim_flags(algo="grpo", steps=2, n_samples_per_prompt=None, max_response_len=4096)
        argv += ["--strategies", "sync,april,consistent", "--out", str(tmp_path / name), *extra]
        assert main(["run", *argv]) == 0
        return json.loads((tmp_path / name / "summary.json").read_text())["arms"]

    plain = run("plain")
    spec = run("spec", "--engine-arg", "speculative=qwen3-0.6b", "--engine-arg", "speculative_max_batch=8")
    # lossless: sync generates the same tokens (every response to its end), faster (its tail has few
    # requests running).  APRIL's family stops at other instants, so it generates other amounts; the
    # drafter's weights and KV also shrink the pool, so it need not gain (docs/simulator.md).
    assert spec["sync"]["generated_tokens"] == plain["sync"]["generated_tokens"]
    assert spec["sync"]["rollout_time_s"] < plain["sync"]["rollout_time_s"]
    for arm in ("april", "consistent"):
        assert spec[arm]["generated_tokens"] != plain[arm]["generated_tokens"], arm
