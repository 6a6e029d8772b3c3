"""The tracebacks issue 32 found, each now one ``error:`` line (issue 32, item 6), and Markdown cells
that keep their columns.

Non-UTF-8 bytes in config, provenance, verl and CSV files, deep nesting and integer keys
(``tests/test_fail_closed.py``), a config.json without ``steps``, text in a numeric row field, a lone
surrogate in a verl row, a file named ``².jsonl``, a text file named ``.pt``, a 200 kB CSV field, an
absurd ``--groups-per-step``, ``--ratios inf``, an ``--out`` symbolic link loop.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import refused, sim_flags

from april_bench.cli import main


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("complete") / "run"
    assert main(["run", *sim_flags(steps=1), "--out", str(out)]) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(run, target)
    return target


_STATS = ["--groups-per-step", "2", "--samples-per-prompt", "2", "--max-response-len", "100"]


def test_a_verl_dump_that_is_not_utf8_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "1.jsonl").write_bytes(b'{"input": "p", "output": "\xff\xfe", "score": 1}\n')
    refused(capsys, ["trace", "import-verl", str(tmp_path / "d"), "-o", str(tmp_path / "t")], "not UTF-8")


def test_a_lone_surrogate_in_a_verl_row_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "1.jsonl").write_text('{"input": "\\ud800", "output": "a", "score": 1}\n')
    refused(
        capsys, ["trace", "import-verl", str(tmp_path / "d"), "-o", str(tmp_path / "t")], "lone surrogate"
    )


def test_a_verl_file_named_with_a_superscript_digit_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "².jsonl"
    path.write_text('{"input": "p", "output": "a", "score": 1}\n')
    refused(
        capsys, ["trace", "import-verl", str(path), "-o", str(tmp_path / "t")], "cannot tell this file's step"
    )
    (tmp_path / "d").mkdir()
    shutil.move(path, tmp_path / "d" / "².jsonl")
    refused(
        capsys, ["trace", "import-verl", str(tmp_path / "d"), "-o", str(tmp_path / "t")], "no {step}.jsonl"
    )


@pytest.mark.parametrize(
    ("content", "flags", "message"),
    [
        (b"step,response_length/mean\n1,\xff\n", _STATS, "not UTF-8"),
        (b"step,response_length/mean\n1," + b"9" * 200_000 + b"\n", _STATS, "field larger than field limit"),
        (
            b"step,response_length/mean\n1,50\n",
            ["--groups-per-step", "100000000000", "--samples-per-prompt", "2", "--max-response-len", "100"],
            "more than any run makes",
        ),
    ],
)
def test_a_hostile_stats_csv_is_one_line(
    tmp_path: Path, capsys, content: bytes, flags: list[str], message: str
) -> None:
    path = tmp_path / "s.csv"
    path.write_bytes(content)
    refused(capsys, ["trace", "import-stats", str(path), *flags, "-o", str(tmp_path / "t")], message)


def test_a_text_file_named_pt_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "x.pt"
    path.write_text("not a pickle\n")
    refused(capsys, ["trace", "import-slime", str(path), "-o", str(tmp_path / "t")], str(path))


def test_ablate_ratios_inf_is_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ab"
    refused(
        capsys,
        ["ablate", "--engine", "sim", "--ratios", "inf", "--out", str(out)],
        "must be >= 1 (and finite)",
    )
    assert not out.exists()


def test_an_out_symlink_loop_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    refused(capsys, ["run", "--engine", "sim", "--out", str(tmp_path / "loop" / "x")], "choose another --out")


def test_report_on_a_config_without_steps_is_one_line(complete_run: Path, tmp_path: Path, capsys) -> None:
    run = _copy(complete_run, tmp_path)
    config = json.loads((run / "config.json").read_text())
    del config["steps"]
    (run / "config.json").write_text(json.dumps(config))
    refused(capsys, ["report", str(run)], "field 'steps' must be a whole number")


def test_text_in_a_numeric_row_field_is_one_line(complete_run: Path, tmp_path: Path, capsys) -> None:
    run = _copy(complete_run, tmp_path)
    lines = (run / "steps.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["generated_tokens"] = "lots"
    lines[0] = json.dumps(row)
    (run / "steps.jsonl").write_text("\n".join(lines) + "\n")
    refused(capsys, ["report", str(run)], "steps.jsonl, line 1: generated_tokens must be a number")
    refused(capsys, ["compare", str(complete_run), str(run)], "generated_tokens must be a number")


def test_a_provenance_that_is_not_utf8_is_one_line_for_every_reader(
    complete_run: Path, tmp_path: Path, capsys
) -> None:
    run = _copy(complete_run, tmp_path)
    (run / "provenance.json").write_bytes(b"\xff\xfe{}")
    refused(capsys, ["report", str(run)], "provenance.json: not UTF-8")
    refused(capsys, ["trace", "show", str(run)], "provenance.json")


def test_markdown_cells_escape_the_column_bar() -> None:
    from april_bench.results.table import md_cell, render_markdown

    assert md_cell("a|b") == "a\\|b"
    table = render_markdown(["arm", "gain"], [["evil|arm", "+1%"]])
    header, _, row = table.splitlines()
    assert header.count("|") == row.count("|") - 1  # the escaped bar is not a column


def test_an_arm_name_with_a_bar_keeps_the_ablation_table_columns() -> None:
    from april_bench.cli.ablate import render_ablation

    row = {
        "arm": "a|b",
        "strategy": "sync",
        "driver": "sync",
        "off_policy_mode": "as-is",
        "n_prime_over_n": None,
        "max_version_span_bound": "-",
        "segment_len": None,
        "throughput_gain": 0.1,
        "useful_gain": 0.1,
        "end_to_end_gain": 0.1,
        "off_policy_token_ratio": 0.0,
        "max_version_span": 0,
        "max_staleness": 0,
        "step_time_per_step_s": 1.0,
        "wasted_tokens": 0,
        "rollout_time_per_step_s": 1.0,
        "accuracy": None,
        "accuracy_improvement": None,
        "failures": None,
    }
    result = {
        "result_kind": "simulated",
        "model": "m",
        "hardware": "h100",
        "algorithm": "grpo",
        "dataset": "d",
        "steps": 1,
        "baseline": "sync",
        "rows": [row],
    }
    lines = [line for line in render_ablation(result).splitlines() if line.startswith("|")]
    bars = {line.replace("\\|", "").count("|") for line in lines}
    assert len(bars) == 1, lines
