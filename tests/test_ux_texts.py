"""Texts a user reads (issue 35): each was wrong once."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from helpers import table_rows

from april_bench.cli import main
from april_bench.results.compare import points


@pytest.mark.parametrize(
    ("change", "sign", "text"),
    [(0.0, True, "+0.00"), (0.1234, True, "+12.34"), (-3e-5, True, "-3.0e-03"), (3e-5, False, "3.0e-03")],
)
def test_a_change_that_two_decimals_round_to_zero_still_shows(change: float, sign: bool, text: str) -> None:
    assert points(change, sign=sign) == text


def test_compare_help_prints_a_plain_percent_sign(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--help"]) == 0
    out = capsys.readouterr().out
    assert "95%" in out and "%%" not in out


def test_ls_engines_says_whether_sglang_can_launch_here(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "engines"]) == 0
    lines = capsys.readouterr().out.splitlines()
    status = lines[[line.split()[0] if line.strip() else "" for line in lines].index("sglang") + 1]
    if importlib.util.find_spec("sglang") is None:
        assert "cannot launch a server" in status and "--engine-url" in status
    else:
        assert status.strip() == "installed here"


def test_run_help_names_the_april_caps_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "ls strategies`)" not in out
    assert "unlimited" in out


def test_the_gpu_library_hint_only_where_a_gpu_lacks_its_library(monkeypatch: pytest.MonkeyPatch) -> None:
    from april_bench import machine
    from april_bench.telemetry.sampler import TelemetryConfig, check_backend

    monkeypatch.setattr(machine, "detect_accelerators", lambda: machine.Accelerators(nvidia=0, amd=0))
    assert check_backend(TelemetryConfig()) == ""  # a CPU machine: nothing to say
    monkeypatch.setattr(machine, "detect_accelerators", lambda: machine.Accelerators(nvidia=1, amd=0))
    note = check_backend(TelemetryConfig())
    if importlib.util.find_spec("pynvml") is None:
        assert "pip install 'april-bench[nvidia]'" in note  # a GPU without NVML: the hint


def _sim_run(tmp_path, *extra: str) -> list[str]:
    from helpers import sim_flags

    return ["run", *sim_flags(), "--strategies", "sync,april", "--out", str(tmp_path / "run"), *extra]


def test_no_progress_bars_or_control_characters_off_a_terminal(tmp_path, capsys) -> None:
    assert main(_sim_run(tmp_path)) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "\x1b" not in captured.err
    assert "step/s" not in captured.err


def test_log_level_quiets_what_is_said_along_the_way(tmp_path, capsys, monkeypatch) -> None:
    assert main(_sim_run(tmp_path, "--log-level", "warning")) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "## Results: SIMULATED" in captured.out  # the product still goes to stdout
    monkeypatch.setenv("APRIL_BENCH_LOG_LEVEL", "error")
    assert main(_sim_run(tmp_path / "b")) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("APRIL_BENCH_LOG_LEVEL", "loud")
    assert main(["ls", "engines"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: APRIL_BENCH_LOG_LEVEL='loud'") and "Traceback" not in err


_CITED = re.compile(r"(?<![\w/.-])((?:docs|results|benchmarks|tests|april_bench)/[\w./<>{}*-]*\w|[\w-]+\.md)")


def _help_texts() -> str:
    """Every command's --help and every `ls` listing: what a user reads before anything runs."""
    import contextlib
    import io

    from april_bench.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    texts = [parser.format_help()]
    for command in commands.values():
        texts.append(command.format_help())
        for action in command._actions:
            if getattr(action, "choices", None) and isinstance(action.choices, dict):  # nested actions
                texts += [sub.format_help() for sub in action.choices.values()]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ls", "all"]) == 0
    texts.append(out.getvalue())
    return "\n".join(texts)


def test_every_file_a_help_text_or_listing_cites_is_in_the_repository(monkeypatch) -> None:
    """A user is never pointed to a file the repository does not hold (shared/docs/landscape.md was)."""
    from april_bench.results.rundir import _KNOWN_FILES

    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps help at hyphens (docs/run-directories.md)
    root = Path(__file__).resolve().parents[1]
    text = " ".join(_help_texts().split())
    cited = sorted(set(_CITED.findall(text)))
    assert cited, "the help texts cite no file at all: the pattern is broken"
    missing = []
    for path in cited:
        if any(c in path for c in "<>{}*"):  # a pattern (runs/<run-id>, results/gpu/<gpu>-<date>/)
            path = re.split(r"[<>{}*]", path)[0].rsplit("/", 1)[0]
        if "/" not in path:  # a bare NAME.md: the README, a page of docs/, or a file a run writes
            found = (root / path).exists() or (root / "docs" / path).exists() or path in _KNOWN_FILES
        else:
            found = (root / path).exists()
        if not found:
            missing.append(path)
    assert not missing, f"cited but not in the repository: {missing}"
    assert "landscape.md" not in text


def _arm(**fields: object) -> dict[str, object]:
    return {"baseline": "sync", **fields}


def test_an_arm_that_gains_generated_tokens_but_loses_useful_ones_is_flagged() -> None:
    from april_bench.results.legend import table_legend
    from april_bench.results.table import paper_table

    summary = {
        "sync": _arm(throughput_gain=0.0, useful_gain=0.0),
        "april": _arm(throughput_gain=0.49, useful_gain=0.22),
        "oversample-discard": _arm(throughput_gain=0.52, useful_gain=-0.25),
    }
    config = {"dataset": "d", "model": "m", "algorithm": "grpo", "hardware": "h100"}
    cells = {row[4]: row[5] for row in paper_table(config, summary, simulated=True)}
    assert cells == {"sync": "baseline", "april": "+49.0%", "oversample-discard": "+52.0% (!)"}
    legend = table_legend(summary, simulated=True)
    assert "partial_rollout/tokens_throughput" in legend  # the headline names the paper's metric
    assert "- (!): oversample-discard generated more tokens" in legend


@pytest.mark.parametrize(
    ("pairs", "ci", "verdict"),
    [
        (1, None, "no verdict: 1 pair"),
        (2, [0.1, 0.5], "no verdict: 2 pairs"),  # two pairs excluding 0 are still no verdict
        (3, [-0.1, 0.5], "not distinguishable"),
        (3, [0.1, 0.5], "faster than sync"),
        (12, [-0.5, -0.1], "slower than sync"),
    ],
)
def test_a_verdict_needs_three_pairs_and_an_interval_that_excludes_zero(pairs, ci, verdict) -> None:
    from april_bench.results.headline import headline_table

    stats = {"median": 0.3 if verdict != "slower than sync" else -0.3, "ci": ci, "pairs": pairs}
    summary = {"sync": _arm(), "april": _arm(paired_gains={"throughput": stats})}
    (row,) = headline_table(summary)
    assert row[2].startswith(verdict)


def test_run_names_the_command_that_draws_its_figures(tmp_path, capsys) -> None:
    assert main(_sim_run(tmp_path)) == 0
    lines = capsys.readouterr().out.splitlines()
    run = tmp_path / "run"
    assert f"figures: python -m april_bench plot {run}  (writes {run / 'figures'})" in lines
    assert lines[-1].startswith('{"result_kind"')  # the JSON line stays last, for scripts


def test_whatif_example_replays_on_the_deployment_that_made_it(tmp_path, capsys) -> None:
    out = tmp_path / "wi"
    argv = ["whatif", "example", "--strategies", "sync,april", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "SIMULATED (tiny on 1 x cpu" in text and "warning" not in text
    shipped = (
        Path(__file__).resolve().parents[1] / "april_bench/trace/examples/embedded-sync.jsonl"
    ).read_text()
    assert "/tmp" not in shipped  # no machine-local path in a shipped file


def test_whatif_warns_in_one_line_when_the_trace_does_not_fit_the_model(tmp_path, capsys) -> None:
    argv = ["whatif", "example", "--hw", "h100", "--model", "qwen3-4b", "--strategies", "sync,april"]
    assert main([*argv, "--drivers", "none", "--out", str(tmp_path / "wi")]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "median response (13 tokens)" in warnings[0] and "--hw cpu --model tiny" in warnings[0]


@pytest.mark.parametrize(
    ("files", "command"),
    [(["0.jsonl", "1.jsonl"], "trace import-verl"), (["r0.pt"], "trace import-slime")],
)
def test_whatif_names_the_import_for_another_frameworks_dump(tmp_path, capsys, files, command) -> None:
    dump = tmp_path / "dump"
    dump.mkdir()
    for name in files:
        (dump / name).write_text("{}\n")
    assert main(["whatif", str(dump), "--out", str(tmp_path / "wi")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"`python -m april_bench {command} {dump}" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "wi").exists()


def test_every_run_writes_one_flat_result_file(tmp_path) -> None:
    import json

    from april_bench.results.result_file import step_stats

    assert main([*_sim_run(tmp_path), "--metadata", "cluster=a"]) == 0
    run = tmp_path / "run"
    result = json.loads((run / "result.json").read_text())
    assert (result["format"], result["version"], result["result_kind"]) == (
        "april-bench-result",
        1,
        "simulated",
    )
    assert result["metadata"] == {"cluster": "a"} and result["gpus"] == 8  # one simulated H100 node
    summary = json.loads((run / "summary.json").read_text())["arms"]
    steps = table_rows(run, "steps")
    for arm, numbers in result["arms"].items():
        assert numbers["throughput_gain"] == summary[arm]["throughput_gain"]
        assert numbers["generated_tokens_per_gpu_per_s"] == summary[arm]["generated_tokens_per_s"] / 8
        rows = [r for r in steps if r["arm"] == arm and not r["warmup"]]
        rates = [r["generated_tokens"] / r["rollout_time_s"] for r in rows]
        assert numbers["per_step"]["generated_tokens_per_s"] == step_stats(rates)
        assert numbers["per_step"]["generated_tokens_per_s"]["n"] == len(rows) > 0


def test_step_stats_of_one_and_of_no_value() -> None:
    from april_bench.results.result_file import step_stats

    assert step_stats([2.0, 4.0]) == {"mean": 3.0, "std": 2**0.5, "min": 2.0, "max": 4.0, "n": 2}
    assert step_stats([5.0])["std"] == 0.0
    assert step_stats([])["mean"] is None


def test_the_readmes_python_example_runs_and_returns_directory_summary_and_gains(
    tmp_path, monkeypatch
) -> None:
    import contextlib
    import io
    import json

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 6
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    out = tmp_path / "runs" / "from-python"
    arms = json.loads((out / "summary.json").read_text())["arms"]
    first, second = printed.getvalue().splitlines()[-2:]
    assert first.startswith(str(Path("runs/from-python"))) or first.startswith(str(out))
    assert str({arm: m["throughput_gain"] for arm, m in arms.items()}) in first
    assert second == str(arms["april"]["useful_gain"])


def test_a_simulated_table_shows_tokens_per_gpu_per_second(tmp_path, capsys) -> None:
    assert main(_sim_run(tmp_path)) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| Strategy ") and "Rollout" in line)
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells[cells.index("Gen tok/s") + 1] == "Gen tok/s/GPU"


def test_the_whatif_figure_holds_every_label(tmp_path) -> None:
    """Long arm names and the right axis label were cut off at the figure's edges."""
    import matplotlib.image

    from april_bench.whatif import whatif_figure

    row = {"generated_gain": 0.5, "useful_gain": 0.2, "end_to_end_gain": 0.1, "off_policy_share": 0.4}
    long_name = "segment[over_sampling_batch_size=32,segment_len=48,max_version_span=1]" * 2
    result = {
        "rows": [{"arm": "sync", **row}, {"arm": long_name, **row}],
        "baseline": "sync",
        "trace": {"source": "a test"},
        "model": "tiny",
        "hardware": "cpu",
    }
    path = whatif_figure(result, tmp_path / "whatif.png")
    assert path is not None
    width = matplotlib.image.imread(path).shape[1]
    assert width > 11 * 110  # grown past the 11-inch canvas to hold the long label


def test_a_hub_id_on_the_simulator_names_the_profile_to_use(capsys) -> None:
    assert main(["validate", "--engine", "sim", "--hw", "h100", "--model", "Qwen/Qwen3-4B"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --model Qwen/Qwen3-4B") and "--model qwen3-4b" in err
    assert len(err.strip().splitlines()) == 1
