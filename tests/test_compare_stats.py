"""Paired gain statistics, latency percentiles, and the ``compare`` regression gate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import sim_flags, table_rows

from april_bench.cli import main
from april_bench.results.compare import Rule, parse_rule
from april_bench.results.stats import bootstrap_median, latency_percentiles, paired_gains


def _step(arm: str, step: int, gen: int, rollout: float, *, repeat: int = 0, warmup: bool = False) -> dict:
    return {
        "arm": arm,
        "step": step,
        "repeat": repeat,
        "warmup": warmup,
        "generated_tokens": gen,
        "trained_tokens": gen // 2,
        "rollout_time_s": rollout,
        "step_time_s": rollout + 1.0,
    }


def test_paired_gains_pair_each_block_with_the_baselines_same_block() -> None:
    steps = []
    for block, (sync_t, april_t) in enumerate([(10.0, 5.0), (20.0, 8.0), (10.0, 8.0)]):
        for offset in range(2):  # two steps per block
            steps.append(_step("sync", 2 * block + offset, 100, sync_t / 2))
            steps.append(_step("april", 2 * block + offset, 100, april_t / 2))
    stats = paired_gains(steps, baseline="sync", block_steps=2)["april"]["throughput"]
    # per-block ratios: 10/5, 20/8, 10/8 -> gains +100%, +150%, +25%; the median is +100%
    assert stats["pairs"] == 3 and stats["median"] == pytest.approx(1.0)
    low, high = stats["ci"]
    assert 0.25 <= low <= 1.0 <= high <= 1.5
    assert paired_gains(steps, baseline="sync", block_steps=2)["sync"]["throughput"]["median"] == 0.0


def test_warm_up_steps_and_unpaired_blocks_are_left_out() -> None:
    steps = [
        _step("sync", 0, 100, 100.0, warmup=True),  # a cold start: left out
        _step("april", 0, 100, 1.0, warmup=True),
        _step("sync", 1, 100, 10.0),
        _step("april", 1, 100, 5.0),
        _step("april", 2, 100, 5.0, repeat=1),  # no sync block to pair with
    ]
    stats = paired_gains(steps, baseline="sync", block_steps=1)["april"]["throughput"]
    assert stats == {
        "median": pytest.approx(1.0),
        "ci": [pytest.approx(1.0)] * 2,
        "half_width": 0.0,
        "pairs": 1,
    }


def test_bootstrap_is_a_pure_function_of_its_input() -> None:
    values = [0.1, 0.5, 0.2, 0.9, 0.3, 0.4, 0.35]
    assert bootstrap_median(values, seed=3) == bootstrap_median(values, seed=3)
    median, low, high = bootstrap_median(values)
    assert median == 0.35 and low is not None and high is not None and low <= median <= high
    assert bootstrap_median([]) == (None, None, None)


def test_latency_percentiles_from_request_rows() -> None:
    rows = [
        {
            "arm": "a",
            "finish_reason": "stop",
            "t_submit": 0.0,
            "t_first_token": 1.0,
            "t_done": 11.0,
            "output_len": 11,
        },
        {
            "arm": "a",
            "finish_reason": "stop",
            "t_submit": 0.0,
            "t_first_token": 3.0,
            "t_done": 5.0,
            "output_len": 3,
        },
        {
            "arm": "a",
            "finish_reason": "abort",
            "t_submit": 0.0,
            "t_first_token": 1.0,
            "t_done": 99.0,
            "output_len": 9,
        },
    ]
    lat = latency_percentiles(rows)["a"]
    assert lat["requests"] == 2  # the aborted request is not a latency
    assert lat["ttft_s"]["p50"] == 2.0 and lat["e2e_s"]["p50"] == 8.0
    assert lat["tpot_s"]["p50"] == 1.0  # 10 s / 10 tokens and 2 s / 2 tokens


def test_fail_rules_parse_and_name_the_fix() -> None:
    assert parse_rule("median:5%") == Rule("median", 0.05)
    assert parse_rule("total:0") == Rule("total", 0.0)
    assert parse_rule("median:ci") == Rule("median", None)
    from april_bench.config import ConfigError

    with pytest.raises(ConfigError, match="write VIEW:TOLERANCE"):
        parse_rule("p50:5")


SIM = sim_flags(steps=4, block_steps=1)


def test_compare_passes_an_unchanged_run_and_fails_an_injected_10_percent_regression(
    tmp_path: Path, capsys
) -> None:
    base, new = tmp_path / "base", tmp_path / "new"
    assert main(["run", *SIM, "--out", str(base)]) == 0
    assert main(["run", *SIM, "--out", str(new)]) == 0
    capsys.readouterr()
    assert main(["compare", str(base), str(new)]) == 0  # the simulator is deterministic: equal gains
    assert "0 regression(s)" in capsys.readouterr().out
    regressed = tmp_path / "regressed"
    shutil.copytree(new, regressed)
    steps = table_rows(regressed, "steps")
    for s in steps:  # APRIL's rollouts take 10% longer for the same tokens: its gain falls
        if s["arm"] == "april":
            s["rollout_time_s"] *= 1.10
    (regressed / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    assert main(["compare", str(base), str(regressed), "--gains", "throughput"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "april" in out
    assert main(["compare", str(base), str(regressed), "--gains", "throughput", "--fail", "median:50%"]) == 0


def test_compare_json_is_only_json_and_a_config_difference_names_its_field(tmp_path: Path, capsys) -> None:
    base, new = tmp_path / "base", tmp_path / "new"
    assert main(["run", *SIM, "--out", str(base)]) == 0
    assert main(["run", *SIM, "--rollout-arg", "temperature=0.5", "--out", str(new)]) == 0
    config = json.loads((base / "config.json").read_text())
    config["rollout"].pop("top_p")  # an older run without a field the newer one holds ...
    (base / "config.json").write_text(json.dumps(config))
    config = json.loads((new / "config.json").read_text())
    config["rollout"]["top_p"] = None  # ... at None: the same setting, not a difference
    (new / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["compare", str(base), str(new), "--json"]) == 0
    captured = capsys.readouterr()
    verdicts = json.loads(captured.out)  # the whole of stdout parses: pipeable to jq
    assert verdicts["regressions"] == 0 and verdicts["rows"]
    assert "rollout.temperature: 0.8 vs 0.5" in captured.err
    assert "top_p" not in captured.err


def test_config_differences_walk_nested_fields() -> None:
    from april_bench.results.compare import config_differences

    a = {"rollout": {"n": 1, "x": None}, "steps": 2, "strategies": ["sync"]}
    b = {"rollout": {"n": 2}, "steps": 2, "strategies": ("sync",)}
    assert config_differences(a, b, ("rollout", "steps", "strategies")) == ["rollout.n: 1 vs 2"]
