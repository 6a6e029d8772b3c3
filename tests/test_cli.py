"""Integration through the CLI, as a user runs it."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from april_bench.cli import build_parser, main

SMALL = [
    "--steps",
    "3",
    "--rollout-batch-size",
    "8",
    "--n-samples-per-prompt",
    "4",
    "--over-sampling-batch-size",
    "16",
    "--max-response-len",
    "4096",
    "--no-progress",
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "april_bench", *args], capture_output=True, text=True, timeout=300
    )


def test_paper_command_runs_without_a_gpu_and_writes_a_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _run("run", "--hw", "mi300x", "--algo", "dapo", *SMALL, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "simulating mi300x" in proc.stderr and "no AMD GPU found" in proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert (
        "| Dataset" in proc.stdout
        and "Throughput gain" in proc.stdout
        and "Accuracy improvement" in proc.stdout
    )
    assert "SIMULATED" in proc.stdout and "n/a (simulated)" in proc.stdout
    final = json.loads(lines[-1])
    assert final["result_kind"] == "simulated" and set(final["throughput_gain_vs_sync"]) == {
        "sync",
        "oversample-discard",
        "april",
    }
    for name in (
        "config.json",
        "provenance.json",
        "requests.jsonl",
        "samples.jsonl",
        "steps.jsonl",
        "summary.json",
        "table.md",
    ):
        assert (out / name).exists(), name
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["result_kind"] == "simulated" and provenance["engine"] == "sim"
    assert {"git", "versions", "machine", "utc", "command"} <= set(provenance)
    summary = json.loads((out / "summary.json").read_text())
    arm = summary["arms"]["april"]
    for key in (
        "rollout_time_s",
        "step_time_s",
        "generated_tokens_per_s",
        "useful_tokens_per_s",
        "throughput_gain_vs_sync",
        "rollout_efficiency",
        "tail_time_share",
        "off_policy_token_ratio",
        "max_version_span",
        "wasted_tokens",
        "partial_samples",
        "accuracy",
    ):
        assert key in arm, key
    assert arm["accuracy"] is None  # a simulated rollout has no accuracy
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 9 and {s["arm"] for s in steps} == {"sync", "oversample-discard", "april"}

    report = _run("report", str(out))
    assert report.returncode == 0 and report.stdout.strip() == (out / "table.md").read_text().strip()
    for name in ("requests", "samples", "steps"):  # committed reference runs keep their rows gzipped
        data = (out / f"{name}.jsonl").read_bytes()
        (out / f"{name}.jsonl.gz").write_bytes(gzip.compress(data))
        (out / f"{name}.jsonl").unlink()
    again = _run("report", str(out))
    assert again.returncode == 0 and again.stdout == report.stdout
    assert "is not a run directory (missing config.json" in _run("report", str(tmp_path)).stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--over-sampling-batch-size", "8", "--rollout-batch-size", "32"],
            "--over-sampling-batch-size (8) must be >=",
        ),
        (["--strategies", "sync,aprill"], "Did you mean: april"),
        (["--engine-arg", "tensor_parallel=2"], "unknown --engine-arg tensor_parallel"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--model", "qwen3-4"], "Did you mean: qwen3-4b"),
    ],
)
def test_bad_input_gets_a_clear_error_naming_the_fix(args: list[str], message: str, capsys) -> None:
    assert main(["run", *args, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_validate_and_ls(capsys) -> None:
    assert main(["validate", "--hw", "h200", "--engine-arg", "tp_size=1"]) == 0
    out = capsys.readouterr().out
    assert "8 replica(s) of qwen3-4b on h200" in out
    assert main(["ls", "hardware"]) == 0
    listing = capsys.readouterr().out
    assert "mi300x" in listing and "eta_bw:" in listing


def test_cli_flags_stay_few() -> None:
    """The CLI surface is deliberate: adding a flag means changing this list (torchtitan's rule)."""
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "run")[1]
    flags = sorted(opt for action in run._actions for opt in action.option_strings if opt.startswith("--"))
    assert flags == sorted(
        [
            "--help",
            "--hw",
            "--algo",
            "--dataset",
            "--model",
            "--engine",
            "--strategies",
            "--steps",
            "--seed",
            "--rollout-batch-size",
            "--n-samples-per-prompt",
            "--over-sampling-batch-size",
            "--max-response-len",
            "--dynamic-sampling",
            "--no-dynamic-sampling",
            "--refill",
            "--max-version-span",
            "--max-aborts-per-sample",
            "--num-gpus",
            "--engine-arg",
            "--workload-arg",
            "--out",
            "--no-progress",
        ]
    )


@pytest.mark.parametrize("hw", ["cpu", "h100", "h200", "mi300x"])
def test_every_hardware_choice_runs(hw: str, tmp_path: Path, capsys) -> None:
    args = [
        "run",
        "--hw",
        hw,
        "--steps",
        "1",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--over-sampling-batch-size",
        "4",
        "--max-response-len",
        "512",
        "--no-progress",
        "--out",
        str(tmp_path / hw),
    ]
    assert main(args) == 0
    assert "simulated" in capsys.readouterr().out
