"""``--length-oracle``: profiles named, loaded and drawn (keyed by seed, prompt and sample, never by
order); forced lengths generated exactly by the engines (fake, the SGLang adapter over its fake server,
and the hf engine, in its own decode loop); a resumed partial continuing to its original target;
rewards drawn with the length; the run labelled forced-length."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from sglang_fake import sglang_fake_engine

from april_bench.config import ConfigError
from april_bench.engines.protocol import WeightUpdate
from april_bench.results.recorder import RunRecorder
from april_bench.rollout.loop import RolloutConfig
from april_bench.sim.length_oracle import DEFAULT_CAP, LengthOracle, parse_profile
from april_bench.tasks.forced import ForcedLengths
from april_bench.types import SampleStatus
from april_bench.workload import ScriptedWorkload
from april_impl import AprilStrategy


def oracle(spec: str = "deepscaler", *, seed: int = 0, n: int = 4, cap: int = 64) -> LengthOracle:
    return LengthOracle(spec, seed=seed, n_samples_per_prompt=n, max_response_len=cap)


# ----------------------------------------------------------------------------- profiles
def test_a_profile_names_a_data_set_a_model_and_options_or_a_trace(tmp_path: Path) -> None:
    spec = parse_profile("deepscaler@r1-distill-qwen-1.5b[cap=8192, solve_rate=0.4]")
    assert (spec.dataset, spec.model, spec.options) == (
        "deepscaler",
        "r1-distill-qwen-1.5b",
        {"cap": 8192.0, "solve_rate": 0.4},
    )
    assert parse_profile("deepscaler").model == "qwen3-4b"  # the paper's model
    assert parse_profile("synthetic").model == "tiny"  # the embedded task's
    trace = tmp_path / "lens.jsonl"
    trace.write_text('{"uid": 0, "length": 5, "reward": 1}\n')
    assert parse_profile(f"{trace}[scale=2]").trace == trace


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("deepscalr", "not a length profile; choose a data set"),
        ("deepscaler@gpt5", "unknown model"),
        ("deepscaler[tempo=3]", "unknown option 'tempo=3'"),
        ("deepscaler[cap=abc]", "cap= needs a number"),
        ("deepscaler[cap=0]", "must be a finite positive number"),
        ("deepscaler[[", "write DATASET[@MODEL]"),
        ("missing/lens.jsonl", "no length-trace file"),
    ],
)
def test_a_bad_profile_is_one_line_naming_the_fix(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"(?s).*") as info:
        parse_profile(text)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_draws_are_keyed_by_seed_prompt_and_sample_not_by_order() -> None:
    forward, backward = oracle(), oracle()
    keys = [(uid, i) for uid in (0, 3, 255, 256, 700, 70_000) for i in range(4)]
    first = {k: (forward.length(*k), forward.correct(*k)) for k in keys}
    second = {k: (backward.length(*k), backward.correct(*k)) for k in reversed(keys)}
    assert first == second
    other_seed = oracle(seed=1)
    assert [other_seed.length(*k) for k in keys] != [first[k][0] for k in keys]
    # a start step does not move a length: drift is 0 unless asked for
    assert all(forward.length(*k, start_step=50) == first[k][0] for k in keys)


def test_a_math_profile_keeps_its_shape_at_any_response_limit() -> None:
    """Scaled by max_response_len / 16,384: the same share of responses reaches the limit."""
    small, large = oracle(cap=64), oracle(cap=4096)
    assert small.scale == 64 / DEFAULT_CAP and small.cap == DEFAULT_CAP
    keys = [(uid, i) for uid in range(400) for i in range(4)]
    over_small = sum(small.length(*k) >= 64 for k in keys) / len(keys)
    over_large = sum(large.length(*k) >= 4096 for k in keys) / len(keys)
    assert abs(over_small - over_large) < 0.01
    assert 0.1 < over_large < 0.6  # a long tail truncated at the limit, as the paper's model has
    assert oracle("synthetic").scale == 1.0  # the embedded task's lengths are absolute
    assert oracle("deepscaler[scale=1]").scale == 1.0


def test_the_reward_comes_with_the_length_from_the_profile_correctness_model() -> None:
    o = oracle("deepscaler[scale=1]", cap=64)  # token counts as drawn (the limit does not matter here)
    keys = [(uid, i) for uid in range(2000) for i in range(4)]
    right = [o.correct(*k) for k in keys]
    share = sum(right) / len(right)
    assert abs(share - o.describe()["parameters"]["solve_rate"]) < 0.04
    log_right = [math.log(o.length(*k)) for k, r in zip(keys, right, strict=True) if r]
    log_wrong = [math.log(o.length(*k)) for k, r in zip(keys, right, strict=True) if not r]
    ratio = math.exp(sum(log_wrong) / len(log_wrong) - sum(log_right) / len(log_right))
    factor = o.describe()["parameters"]["incorrect_factor"]
    assert factor * 0.8 < ratio < factor * 1.25  # wrong answers are the profile's factor longer


def test_a_trace_profile_replays_its_rows_and_rewards(tmp_path: Path) -> None:
    trace = tmp_path / "lens.jsonl"
    rows = [{"uid": 0, "length": 5, "reward": 1}, {"uid": 0, "length": 9, "reward": 0}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    o = oracle(str(trace), n=2)
    assert [o.length(0, 0), o.length(0, 1)] == [5, 9]
    assert [o.correct(0, 0), o.correct(0, 1)] == [True, False]
    doubled = oracle(f"{trace}[scale=2]", n=2)
    assert [doubled.length(0, 0), doubled.length(0, 1)] == [10, 18]


# ----------------------------------------------------------------------------- engines
def _forced(spec: str, n: int = 2, cap: int = 40) -> tuple[ForcedLengths, LengthOracle]:
    o = oracle(spec, n=n, cap=cap)
    return ForcedLengths(ScriptedWorkload(lambda uid, i: 1), o), o


def _check_samples(samples: list, o: LengthOracle, cap: int) -> None:
    assert samples
    for s in samples:
        if not s.status.is_finished:
            assert s.response_len < min(o.length(s.prompt.uid, s.index), cap)
            continue
        target = o.length(s.prompt.uid, s.index)
        assert s.response_len == min(target, cap)
        assert s.status is (SampleStatus.COMPLETED if target <= cap else SampleStatus.TRUNCATED)
        right = o.correct(s.prompt.uid, s.index)
        assert s.reward == (1.0 if right and target <= cap else 0.0)


def test_april_on_the_fake_engine_resumes_each_partial_to_its_original_target() -> None:
    from helpers import fake_arm

    o = oracle("deepscaler[cap=4000]", n=2, cap=40)  # a long tail: about a fifth past the limit
    strategy = AprilStrategy.Config(over_sampling_batch_size=4).build()
    outcomes, _, loop = fake_arm(
        strategy, lambda uid, i: o.length(uid, i), steps=4, reward=lambda uid, i: 0.0, max_response_len=40
    )
    forced = ForcedLengths(ScriptedWorkload(lambda uid, i: 1), o)
    trained = [s for out in outcomes for g in out.batch for s in g.samples]
    resumed = [s for s in trained if len(s.segments) > 1]
    assert resumed  # APRIL aborted and resumed some
    for s in trained:
        s.reward = forced.reward(s)
    _check_samples(trained, o, 40)
    _check_samples([s for g in loop.buffer for s in g.samples], o, 40)


def test_the_sglang_adapter_generates_the_forced_lengths_with_eos_ignored() -> None:
    """Over the fake SGLang server, whose EOS comes with probability 0.3 per token: the adapter sends
    ignore_eos and max_new_tokens = the draw, so every response ends at its drawn length anyway."""
    forced, o = _forced("deepscaler[cap=2000]", cap=40)
    config = RolloutConfig(
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        over_sampling_batch_size=4,
        max_response_len=40,
        replay_lengths=True,
        reabort_interval_s=0.05,
    )
    strategy = AprilStrategy.Config(over_sampling_batch_size=4).build()
    recorder = RunRecorder()

    async def main() -> list:
        engine = await sglang_fake_engine(eos_probability=0.3, eos_token_id=2)
        try:
            loop = config.build(
                arm="april", engine=engine, strategy=strategy, workload=forced,
                prompts=forced.prompt_stream(), recorder=recorder,
            )  # fmt: skip
            trained = []
            for step in range(3):
                trained += (await asyncio.wait_for(loop.run_step(step, step), 60)).batch
                await engine.update_weights(WeightUpdate(step + 1))
            return [s for g in trained for s in g.samples]
        finally:
            await engine.close()

    samples = asyncio.run(main())
    _check_samples(samples, o, 40)
    assert any(s.status is SampleStatus.TRUNCATED for s in samples)


@pytest.mark.slow
def test_run_on_the_hf_engine_generates_the_profiles_lengths(tmp_path: Path) -> None:
    """`run --engine hf --length-oracle deepscaler` on this CPU: every trained response is as long as
    the profile drew (truncated at the limit), rewards are the draw's, and the run says forced-length in
    its config, provenance and tables."""
    from april_bench.cli import main

    out = tmp_path / "run"
    from helpers import embedded_flags

    argv = embedded_flags(
        engine="hf",
        dataset="synthetic",
        model="tiny",
        length_oracle="deepscaler",
        steps=2,
        n_samples_per_prompt=2,
        eval_every=100,
        warmstart_arg="steps=2",
        block_steps=1,
        out=out,
    )
    code = main(["run", *argv])
    assert code == 0
    o = oracle("deepscaler", n=2, cap=48)
    from april_bench.results.store import load_run

    samples = load_run(out).rows("samples")
    trained = [s for s in samples if s["fate"] == "trained"]
    assert trained
    for s in trained:
        target = o.length(s["group_uid"], s["sample_index"])
        assert s["response_len"] == min(target, 48), s
        right = o.correct(s["group_uid"], s["sample_index"])
        assert s["reward"] == (1.0 if right and target <= 48 else 0.0)
    assert json.loads((out / "config.json").read_text())["length_oracle"] == "deepscaler"
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["forced_lengths"]["profile"] == "deepscaler"
    assert provenance["machine"]["cpu_facts"]["vector_flags"] is not None
    assert "FORCED LENGTHS" in (out / "table.md").read_text()
