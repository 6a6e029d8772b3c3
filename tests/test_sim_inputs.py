"""Simulator inputs: trace replay, sourced constants, native engine arguments."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from april_bench.config import ConfigError
from april_bench.engines.sim.engine import SimEngine
from april_bench.experiment import ExperimentConfig, run
from april_bench.profiles.hardware import HARDWARE, measure_host
from april_bench.rollout.loop import RolloutConfig
from april_bench.sim.lengths import TraceLengths
from april_bench.sim.workload import SimWorkload
from april_bench.types import Prompt


def test_every_gpu_constant_names_its_source() -> None:
    numeric = [
        f.name
        for f in dataclasses.fields(HARDWARE.get("h100"))
        if f.name not in ("name", "vendor", "sources", "gpus_per_node", "overlap")
    ]
    for name in HARDWARE:
        profile = HARDWARE.get(name)
        missing = [f for f in numeric if not profile.sources.get(f)]
        assert not missing, f"{name}: no source for {missing}"


def test_host_profile_is_measured() -> None:
    cpu = measure_host(seconds=0.05)
    assert cpu.memory_bw > 1e8 and cpu.bf16_flops > 1e8
    assert "measured" in cpu.sources["memory_bw"]


def test_trace_replay_groups_by_prompt_and_cycles(tmp_path: Path) -> None:
    trace = tmp_path / "lengths.jsonl"
    rows = [
        {"prompt_id": "a", "length": 100, "reward": 1},
        {"prompt_id": "a", "length": 300, "reward": 0},
        {"prompt_id": "b", "length": 50, "reward": 1},
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    lengths = TraceLengths(trace, group_size=2)
    assert lengths.has_rewards
    first = lengths.draw(0, 2)
    assert [round(2.718281828459045**x) for x in first.log_lengths] == [100, 300]
    assert first.correct == (True, False)
    assert [round(2.718281828459045**x) for x in lengths.draw(1, 2).log_lengths] == [50, 50]
    assert lengths.draw(2, 2) == first  # prompt uid 2 replays trace group 0 again

    workload = SimWorkload.Config(length_trace=trace).build(n_samples_per_prompt=2)
    prompt = Prompt(uid=0, source_id="x", length=10)
    assert workload.replay_len(prompt, 1, start_step=50) == 300  # no drift when replaying


def test_trace_replay_from_csv_without_rewards_refuses_dynamic_sampling(tmp_path: Path) -> None:
    trace = tmp_path / "lengths.csv"
    trace.write_text("length\n10\n20\n30\n40\n")
    config = ExperimentConfig(
        algorithm="dapo",
        engine="sim",
        steps=1,
        workload_args={"length_trace": str(trace)},
        rollout=RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=2, over_sampling_batch_size=2),
    )
    with pytest.raises(ConfigError, match="add a 'reward' column"):
        run(config, progress=False)
    lengths = TraceLengths(trace, group_size=2)
    assert [round(2.718281828459045**x) for x in lengths.draw(1, 2).log_lengths] == [30, 40]


def test_bad_trace_files_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        TraceLengths(tmp_path / "missing.jsonl", 2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"len": 3}\n')
    with pytest.raises(ConfigError, match="line 1: no 'length' field"):
        TraceLengths(bad, 2)


def test_engine_arguments_pass_through_under_their_sglang_names() -> None:
    engine = SimEngine.Config(
        hardware="h100", max_running_requests=7, chunked_prefill_size=1024, tp_size=4
    ).build()
    assert engine.settings.max_running == 7 and engine.settings.chunk_tokens == 1024
    assert engine.num_replicas == 2
    with pytest.raises(ConfigError, match="multiple of tp_size"):
        SimEngine.Config(hardware="h100", num_gpus=6, tp_size=4)
    with pytest.raises(ConfigError, match="does not fit"):
        SimEngine.Config(hardware="h100", model="qwen3-8b", tp_size=1, mem_fraction_static=0.1).build()
