"""Inputs fail closed (issue 32, item 4): NaN and infinities, sampling bounds, metadata kept as text,
a gate that meets a NaN gain, and bounded reads (size, line length, nesting, YAML aliases).

Every case is exit 2 with exactly one ``error:`` line, no traceback, checked before a run directory
exists.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import refused, sim_flags

from april_bench.cli import main
from april_bench.cli.args import key_value, metadata_pair
from april_bench.results.compare import Rule, _compare

SIM = ["--engine", "sim", "--hw", "h100"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rollout-arg", "temperature=NaN"], "temperature='NaN': expected a finite number"),
        (["--rollout-arg", "temperature=Infinity"], "temperature='Infinity': expected a finite number"),
        (["--rollout-arg", "temperature=1e999"], "expected a finite number"),
        (["--rollout-arg", "temperature=-1"], "temperature must be a finite number >= 0, got -1"),
        (["--rollout-arg", "top_p=5"], "top_p must be in (0, 1], got 5"),
        (["--rollout-arg", "top_p=0"], "top_p must be in (0, 1], got 0"),
        (["--engine-arg", "max_running_requests=Infinity"], "max_running_requests='Infinity'"),
        (["--workload-arg", "response_median=NaN"], "response_median='NaN'"),
        (["--steps", "10000000"], "--steps must be <= 1,000,000"),
        (["--repeats", "100000"], "--repeats must be <= 10,000"),
        (["--seed", str(2**64)], "--seed must be < 2**63"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "run"])
def test_bad_numbers_are_refused_before_the_run_directory_exists(
    tmp_path: Path, capsys, command: str, flags: list[str], message: str
) -> None:
    out = tmp_path / "run"
    refused(capsys, [command, *SIM, *flags, "--out", str(out)], message)
    assert not out.exists()


def test_flag_values_are_strict_json_and_metadata_keeps_strings() -> None:
    assert metadata_pair("x=NaN") == ("x", "NaN")
    assert metadata_pair("x=1e999") == ("x", "1e999")
    assert metadata_pair("x=-Infinity") == ("x", "-Infinity")
    assert metadata_pair("x=3") == ("x", 3)
    assert key_value("temperature=NaN") == ("temperature", "NaN")  # then refused by the setting's type


def test_metadata_nan_is_kept_as_a_string_in_summary_json(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", *sim_flags(steps=1, strategies="sync"), "--metadata", "x=NaN", "--metadata", "y=Infinity"]
    assert main([*argv, "--out", str(out)]) == 0

    def refuse(name: str) -> None:
        raise AssertionError(f"bare {name} in a JSON file")

    summary = json.loads((out / "summary.json").read_text(), parse_constant=refuse)
    assert summary["metadata"] == {"x": "NaN", "y": "Infinity"}


@pytest.mark.parametrize("view", ["total", "median"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_gate_that_meets_a_nan_gain_fails(view: str, bad: float) -> None:
    rule = Rule(view=view, tolerance=0.0) if view == "total" else Rule(view=view, tolerance=None)
    base = {"throughput_gain": 0.2, "paired_gains": {"throughput": {"median": 0.2, "ci": [0.1, 0.3]}}}
    new = {"throughput_gain": bad, "paired_gains": {"throughput": {"median": bad, "ci": [bad, bad]}}}
    row = _compare("april", "throughput", rule, base, new)
    assert row.regressed and "finite" in row.why
    row = _compare("april", "throughput", rule, new, base)  # a NaN BASE fails too
    assert row.regressed


# ---------------------------------------------------------------- bounded reads


def _alias_bomb(levels: int, width: int) -> str:
    text = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]\n"
    return text + f"steps: *a{levels - 1}\n"


@pytest.mark.parametrize(
    ("levels", "width", "message"),
    [(9, 9, "more than 64 YAML aliases"), (6, 9, "repeats a YAML alias"), (20, 2, "repeats a YAML alias")],
)
def test_a_yaml_alias_bomb_does_not_hang_validate(
    tmp_path: Path, capsys, levels: int, width: int, message: str
) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(levels, width))
    assert len(path.read_bytes()) < 600
    refused(capsys, ["validate", "--config", str(path)], message)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("c.json", b'{"steps": NaN}', "NaN is not a number april-bench accepts"),
        ("c.json", b'{"steps": 1e999}', "overflows to infinity"),
        ("c.yaml", b"steps: .nan\n", "steps is nan; give a finite number"),
        ("c.toml", b"steps = inf\n", "steps is inf; give a finite number"),
        ("c.yaml", b"1: 2\n", "key 1 of the top must be a string"),
        ("c.json", b"[" * 100_000, "nested deeper than"),
        ("c.yaml", b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested"),
        ("c.toml", b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested"),
        ("c.yaml", b"steps: \xff\xfe\n", "not UTF-8"),
        ("c.json", b" " * (1 << 20) + b"{}", "larger than 1,048,576 bytes"),
    ],
)
def test_a_hostile_config_file_is_one_line(
    tmp_path: Path, capsys, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    refused(capsys, ["validate", "--config", str(path)], message)


def test_a_config_that_is_a_fifo_is_refused_not_read(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    refused(capsys, ["validate", "--config", str(fifo)], "not a regular file")


def test_trace_show_of_a_device_or_a_fifo_is_refused(tmp_path: Path, capsys) -> None:
    """The `trace show /dev/zero` probe, on a FIFO in tmp_path: refused at once, nothing read."""
    fifo = tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    refused(capsys, ["trace", "show", str(fifo)], "not a regular file")


def test_a_trace_line_longer_than_the_bound_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    from april_bench import bounded

    monkeypatch.setattr(bounded, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "t.jsonl"
    path.write_text("x" * 5000)  # no line break: /dev/zero's shape
    refused(capsys, ["trace", "show", str(path)], "a line longer than 1,000 characters")


def _bare(name: str) -> Any:
    raise AssertionError(f"bare {name} in --json output")


def test_compare_fails_and_its_json_says_regressed_when_a_gain_is_nan(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """The probe: `compare --fail total:0` printed `+nan% ... ok` and --json said "regressed": false."""
    from april_bench.results.store import RunDirectory

    base = tmp_path / "base"
    assert main(["run", *sim_flags(steps=1), "--out", str(base)]) == 0
    new = tmp_path / "new"
    shutil.copytree(base, new)
    original = RunDirectory.summary

    def nan_gains(self: RunDirectory) -> dict[str, Any]:
        summary = original(self)
        if self.path.name == "new":
            for metrics in summary.values():
                for key in [k for k in metrics if k.endswith("_gain")]:
                    metrics[key] = math.nan
        return summary

    monkeypatch.setattr(RunDirectory, "summary", nan_gains)
    capsys.readouterr()
    assert main(["compare", str(base), str(new), "--fail", "total:0"]) == 1
    assert "REGRESSED" in capsys.readouterr().out
    assert main(["compare", str(base), str(new), "--fail", "total:0", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out, parse_constant=_bare)["rows"]  # strict JSON: no bare NaN
    assert rows and all(r["regressed"] for r in rows if r["new"] == "nan")
    assert any(r["new"] == "nan" for r in rows)
