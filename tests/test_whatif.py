"""``whatif``: a trace replayed under the zoo on the simulator, groups and rewards kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import table_rows
from trace_fixtures import slime_dump, verl_dump

from april_bench.cli import main
from april_bench.cli.whatif import example_trace
from april_bench.config import ConfigError
from april_bench.trace.format import TraceHeader, TraceRow, read_trace, write_trace
from april_bench.whatif import WhatIf, run_whatif

SHORT, LONG, LIMIT = 400, 6000, 8192
GROUPS, N, STEPS = 8, 4, 4


def _trace(path: Path, *, clustered: bool) -> Path:
    """Per step, GROUPS x N samples of which N are long: all in one prompt (clustered), or one in each of N
    prompts (shuffled).  The lengths of every step are the same multiset either way."""
    rows = []
    for step in range(STEPS):
        for g in range(GROUPS):
            for j in range(N):
                long = g == 0 if clustered else (j == 0 and g < N)
                rows.append(
                    TraceRow(step, f"s{step}p{g}", j, 120, LONG if long else SHORT + 10 * j, "stop", 1.0)
                )
    header = TraceHeader(source="test", evidence="per-sample", token_counts="exact", max_response_len=LIMIT)
    write_trace(path, header, rows)
    return path


def _gains(tmp_path: Path, name: str, trace: Path) -> dict[str, dict[str, float]]:
    setup = WhatIf(hardware="h100", model="qwen3-4b", strategies=("sync", "april"), drivers=())
    result = run_whatif(trace, setup, tmp_path / name)
    return {row["strategy"]: row for row in result["rows"]}


def test_group_structure_is_kept_long_samples_in_one_prompt_gain_more_than_spread(tmp_path: Path) -> None:
    clustered = _gains(tmp_path, "clustered", _trace(tmp_path / "c.jsonl", clustered=True))
    spread = _gains(tmp_path, "spread", _trace(tmp_path / "s.jsonl", clustered=False))
    # Sync waits for the longest sample either way.  APRIL sets aside the slow groups and trains fast
    # ones: one slow group per step is cheap to set aside, N slow groups (the same lengths spread over
    # N prompts) leave fewer fast groups and more partial work to resume, so its step is slower.
    assert clustered["april"]["generated_gain"] > spread["april"]["generated_gain"] + 1.0
    assert clustered["april"]["useful_gain"] > spread["april"]["useful_gain"] + 1.0
    assert clustered["april"]["step_time_per_step_s"] < 0.9 * spread["april"]["step_time_per_step_s"]
    assert clustered["sync"]["generated_gain"] == 0.0  # the baseline


def test_the_shipped_example_replays_under_the_zoo_labelled_simulated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = read_trace(example_trace())
    assert (
        trace.header.source.startswith("april-bench run")
        and trace.header.provenance["result_kind"] == "measured"
    )
    out = tmp_path / "wi"
    argv = ["whatif", "example", "--hw", "h100", "--model", "qwen3-4b", "--gpus", "8", "--steps", "2"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "april-bench run" in text
    result = json.loads((out / "whatif.json").read_text())
    arms = {row["arm"] for row in result["rows"]}
    drivers = {row["driver"] for row in result["rows"]}
    strategies = {row["strategy"] for row in result["rows"]}
    assert {
        "sync",
        "tail-batching",
        "length-aware",
        "consistent",
        "sagc",
        "response-oversample",
    } <= strategies
    assert {"sync", "one-step-off", "stale (eta=1)", "stale (eta=2)", "lookahead (k=2)"} <= drivers and len(
        arms
    ) == len(result["rows"])
    assert all(row["off_policy_share"] is not None for row in result["rows"])
    assert result["result_kind"] == "simulated" and result["num_gpus"] == 8
    # the replay is an ordinary run directory: its own trace is the replayed one, group for group
    replayed = read_trace(out, arm="sync")
    assert replayed.group_size() == trace.group_size()


def test_verl_and_slime_dumps_run_through_whatif(tmp_path: Path) -> None:
    verl = tmp_path / "verl.jsonl"
    assert (
        main(
            [
                "trace",
                "import-verl",
                str(verl_dump(tmp_path / "v")),
                "--max-response-len",
                "150",
                "-o",
                str(verl),
            ]
        )
        == 0
    )
    slime = tmp_path / "slime.jsonl"
    dumps = [str(slime_dump(tmp_path / f"d_{i}.pt", i)) for i in range(2)]
    assert main(["trace", "import-slime", *dumps, "-o", str(slime)]) == 0
    for name, trace in (("verl", verl), ("slime", slime)):
        # verl's groups mix rewards 0 and 1, so DAPO's filter keeps them; slime's fixture rewards all 1
        algorithm = "dapo" if name == "verl" else "grpo"
        setup = WhatIf(
            strategies=("sync", "april"), drivers=({"driver": "one-step-off"},), algorithm=algorithm
        )
        result = run_whatif(trace, setup, tmp_path / f"wi-{name}")
        pairs = {(row["strategy"], row["driver"]) for row in result["rows"]}
        assert pairs == {(s, d) for s in ("sync", "april") for d in ("sync", "one-step-off")}
        assert result["trace"]["source"].startswith(name)


def test_a_trace_without_rewards_cannot_drive_dapo(tmp_path: Path) -> None:
    rows = [TraceRow(0, "a", j, 10, 50, "stop", None) for j in range(4)]
    path = tmp_path / "t.jsonl"
    write_trace(path, TraceHeader(source="x", evidence="per-sample", token_counts="exact"), rows)
    with pytest.raises(ConfigError, match="dynamic sampling needs rewards"):
        run_whatif(path, WhatIf(strategies=("sync",), drivers=(), algorithm="dapo"), tmp_path / "o")


@pytest.fixture(scope="module")
def fake_curve(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake engine's cost curve, measured as simcheck measures it (one token per virtual second)."""
    from april_bench.backends import build_components
    from april_bench.cli import build_parser
    from april_bench.cli.args import config_from_args
    from april_bench.simcheck import _measure_curve

    config = config_from_args(build_parser().parse_args(["run", "--engine", "fake", "--steps", "1"]))
    path: Path = tmp_path_factory.mktemp("curve") / "cost_curve.json"
    _measure_curve(build_components(config, progress=False), config).save(path)
    return path


def test_a_measured_cost_curve_prices_the_replay_as_that_engine(tmp_path: Path, fake_curve: Path) -> None:
    # The fake engine makes every running request a token per second whatever the batch, so a sync
    # step's rollout lasts exactly as many seconds as its longest response has tokens.
    lengths = {0: [30, 12, 8, 9, 5, 7, 11, 6], 1: [4, 25, 9, 10, 8, 6, 7, 13]}
    rows = [
        TraceRow(step, f"s{step}p{k // 2}", k % 2, 16, length, "stop", 1.0)
        for step, ls in lengths.items()
        for k, length in enumerate(ls)
    ]
    trace = tmp_path / "t.jsonl"
    header = TraceHeader(source="test", evidence="per-sample", token_counts="exact", max_response_len=64)
    write_trace(trace, header, rows)
    setup = WhatIf(strategies=("sync", "april"), drivers=(), cost_curve=fake_curve)
    result = run_whatif(trace, setup, tmp_path / "o")
    assert result["cost_curve"]["engine"] == "fake" and result["num_gpus"] == 1
    steps = table_rows(tmp_path / "o", "steps")
    sync = sorted(
        (s["step"], s["rollout_time_s"], s["generated_tokens"]) for s in steps if s["arm"] == "sync"
    )
    assert [(t, n) for _, t, n in sync] == [
        (pytest.approx(max(ls), rel=1e-9), sum(ls)) for ls in lengths.values()
    ]
    april = next(r for r in result["rows"] if r["strategy"] == "april")
    assert april["generated_gain"] > 0  # APRIL trains short groups while the 30- and 25-token ones wait
    assert "measured cost curve" in (tmp_path / "o" / "whatif.md").read_text()


def test_a_cost_curve_refuses_another_deployment_and_bad_files_with_one_line(
    tmp_path: Path, fake_curve: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "curve.json"
    bad.write_text("{}")
    out = str(tmp_path / "o")
    assert main(["whatif", "example", "--cost-curve", str(bad), "--out", out]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: {bad} is not an april-bench")
    assert main(["whatif", "example", "--cost-curve", str(fake_curve), "--hw", "h100", "--out", out]) == 2
    assert "was measured with" in capsys.readouterr().err
    assert main(["whatif", "example", "--cost-curve", str(fake_curve), "--gpus", "8", "--out", out]) == 2
    assert "prices one engine" in capsys.readouterr().err


def test_a_malformed_trace_is_one_error_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    header = TraceHeader(source="x", evidence="per-sample", token_counts="exact").to_json()
    path.write_text(
        json.dumps(header) + '\n{"step": 0, "prompt_id": "a", "sample_index": 0, "response_tokens": -4}\n'
    )
    assert main(["whatif", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {path}, line 2: response_tokens must be >= 0, got -4"]


def _long_trace(path: Path, reward: float | None = None) -> Path:
    """4 steps of 8 groups x 4 samples, every response longer than a quarter of the 8,192 limit; group g's
    longest is 3,600 + 300 g.  Rewards alternate per sample unless ``reward`` sets them all."""
    rows = [
        TraceRow(
            step,
            f"s{step}p{g}",
            j,
            120,
            2100 + 500 * j + 300 * g,
            "stop",
            reward if reward is not None else float(j % 2),
        )
        for step in range(4)
        for g in range(8)
        for j in range(4)
    ]
    header = TraceHeader(source="test", evidence="per-sample", token_counts="exact", max_response_len=8192)
    write_trace(path, header, rows)
    return path


def test_the_default_zoo_replays_responses_longer_than_a_quarter_of_the_limit(tmp_path: Path) -> None:
    said: list[str] = []
    result = run_whatif(
        _long_trace(tmp_path / "t.jsonl"), WhatIf(drivers=()), tmp_path / "o", echo=said.append
    )
    rows = {row["strategy"]: row for row in result["rows"]}
    # a segment of 2,048 finishes no group; the shortest group (3,600) fills step 0, rounded up to 3,712
    assert rows["segment"]["arm"] == "segment[over_sampling_batch_size=16,segment_len=3712]"
    assert rows["segment"]["cannot_run"] is None and rows["segment"]["generated_gain"] is not None
    assert all(row["cannot_run"] is None for row in result["rows"])
    assert any(line.startswith("whatif: segment_len 2,048: only 0 of") for line in said)


def test_a_baseline_that_cannot_replay_names_whatifs_own_flags(tmp_path: Path, capsys) -> None:
    trace = _long_trace(tmp_path / "t.jsonl", reward=0.0)  # every reward equal: DAPO's filter takes none
    argv = ["whatif", str(trace), "--algo", "dapo", "--strategies", "sync,april", "--drivers", "none"]
    assert main([*argv, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith("error: the baseline arm sync cannot replay this trace: step 0 launched")
    assert "--algo grpo" in errors[0]
    for flag in ("--no-dynamic-sampling", "--task-arg", "--rollout-arg"):  # run's flags, not whatif's
        assert flag not in errors[0]
