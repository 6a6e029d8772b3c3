"""``ablate``: the grid it builds, the table it writes, and its bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import sim_flags

from april_bench.cli import main
from april_bench.cli.ablate import grid_arms

SIM = sim_flags(over_sampling_batch_size=None)


def test_the_grid_varies_one_knob_at_a_time_around_the_first_values() -> None:
    arms = grid_arms(
        ["sync", "april", "segment"],
        target_groups=4,
        ratios=[2.0, 1.0],
        spans=[None, 1],
        segments=[1024, 512],
        max_response_len=2048,
    )
    assert [a.label for a in arms] == [
        "sync",
        "april[over_sampling_batch_size=8]",
        "april[over_sampling_batch_size=4]",
        "april[over_sampling_batch_size=8,max_version_span=1]",
        "segment[over_sampling_batch_size=8,segment_len=1024]",
        "segment[over_sampling_batch_size=4,segment_len=1024]",
        # span 1 with segments of 1024 holds a 2048-token response; segments of 512 with span 1 cannot
        "segment[over_sampling_batch_size=8,max_version_span=1,segment_len=1024]",
        "segment[over_sampling_batch_size=8,segment_len=512]",
    ]
    assert [a.bounded for a in arms[:2]] == [False, True]


def test_ablate_runs_every_arm_in_one_run_and_writes_the_table(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ablation"
    argv = [
        "ablate",
        *SIM,
        "--strategies",
        "sync,april",
        "--ratios",
        "1,2",
        "--spans",
        "none",
        "--drivers",
        "none",
    ]
    assert main([*argv, "--out", str(out)]) == 0
    result = json.loads((out / "ablation.json").read_text())
    assert result["result_kind"] == "simulated" and result["baseline"] == "sync"
    rows = {r["arm"]: r for r in result["rows"]}
    assert list(rows) == ["sync", "april[over_sampling_batch_size=4]", "april[over_sampling_batch_size=8]"]
    # the same prompts and seeds: APRIL with N' = N is the sync schedule, so its gains are exactly zero
    same = rows["april[over_sampling_batch_size=4]"]
    assert (same["throughput_gain"], same["useful_gain"], same["off_policy_token_ratio"]) == (0.0, 0.0, 0.0)
    assert rows["april[over_sampling_batch_size=8]"]["n_prime_over_n"] == 2.0
    table = (out / "ablation.md").read_text()
    assert "SIMULATED" in table and "n/a (simulated)" in table
    assert table in capsys.readouterr().out
    assert (out / "as-is" / "status.json").exists()  # an ordinary run directory per off-policy mode


def test_the_grid_runs_the_async_drivers_on_the_sync_and_april_rollouts() -> None:
    arms = grid_arms(
        ["sync", "april", "segment"],
        target_groups=4,
        ratios=[2.0],
        spans=[None],
        segments=[1024],
        max_response_len=2048,
        drivers=[{"driver": "one-step-off"}, {"driver": "stale", "max_staleness": 2}],
    )
    assert [(a.label, a.driver_name) for a in arms] == [
        ("sync", "sync"),
        ("sync[driver=one-step-off]", "one-step-off"),
        ("sync[driver=stale,max_staleness=2]", "stale (eta=2)"),
        ("april[over_sampling_batch_size=8]", "sync"),
        ("april[over_sampling_batch_size=8,driver=one-step-off]", "one-step-off"),
        ("april[over_sampling_batch_size=8,driver=stale,max_staleness=2]", "stale (eta=2)"),
        ("segment[over_sampling_batch_size=8,segment_len=1024]", "sync"),
    ]


def test_ablate_with_async_drivers_conserves_every_arm(tmp_path: Path) -> None:
    from april_bench.results.store import check_run, load_run

    out = tmp_path / "ablation"
    argv = ["ablate", *SIM, "--strategies", "sync,april", "--ratios", "2", "--spans", "none"]
    assert main([*argv, "--out", str(out)]) == 0
    rows = {r["arm"]: r for r in json.loads((out / "ablation.json").read_text())["rows"]}
    assert {r["driver"] for r in rows.values()} == {
        "sync",
        "one-step-off",
        "stale (eta=1)",
        "stale (eta=2)",
        "lookahead (k=2)",
    }
    assert rows["april[over_sampling_batch_size=8,driver=stale,max_staleness=1]"]["max_staleness"] <= 1
    assert check_run(load_run(out / "as-is")) == []
    assert "| stale (eta=2) |" in (out / "ablation.md").read_text()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--drivers", "stale"], "expected one-step-off, stale:ETA or lookahead:K"),
        (["--drivers", "lookahead:0"], "expected one-step-off, stale:ETA or lookahead:K"),
        (["--ratios", "0.5"], "N'/N ratios must be >= 1"),
        (["--spans", "x"], "expected whole numbers or none"),
        (["--off-policy-modes", "bogus"], "is not one of as-is, mask, tis"),
        (["--strategies", "nope"], "nope"),
    ],
)
def test_bad_ablation_input_is_one_line(flags: list[str], message: str, tmp_path: Path, capsys) -> None:
    assert main(["ablate", *SIM, *flags, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_measured_table_shows_accuracy_and_says_measured() -> None:
    from april_bench.cli.ablate import render_ablation

    row = {
        "arm": "april[over_sampling_batch_size=8]",
        "strategy": "april",
        "off_policy_mode": "mask",
        "n_prime_over_n": 2.0,
        "max_version_span_bound": None,
        "segment_len": None,
        "throughput_gain": 0.25,
        "useful_gain": 0.5,
        "end_to_end_gain": 0.125,
        "off_policy_token_ratio": 0.4,
        "max_version_span": 2,
        "wasted_tokens": 0,
        "rollout_time_per_step_s": 3.25,
        "accuracy": 0.5,
        "accuracy_improvement": 0.02,
    }
    result = {
        "result_kind": "measured",
        "hardware": "cpu",
        "algorithm": "grpo",
        "dataset": "synthetic",
        "model": "tiny",
        "steps": 2,
        "baseline": "sync",
        "rows": [
            row,
            {
                **row,
                "arm": "sync",
                "strategy": "sync",
                "n_prime_over_n": None,
                "max_version_span_bound": "-",
                "accuracy": None,
            },
        ],
    }
    lines = render_ablation(result).splitlines()
    assert "MEASURED" in lines[0] and "gains against sync" in lines[0]
    assert lines[4] == (
        "| mask | april[over_sampling_batch_size=8] | sync | 2 | none | - | +25.0% | +50.0% | +12.5% | 40% "
        "| 2 | - | 3.2 | n/a | 0.500 (+2.0%) | measured |"
    )
    assert "| n/a (no eval) | measured |" in lines[5] and "| sync | sync | - | - | - |" in lines[5]
