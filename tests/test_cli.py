"""Integration through the CLI, as a user runs it."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import embedded_flags, flags, table_rows, tiny_sim_flags

from april_bench.cli import build_parser, main

SMALL = flags(
    steps=3,
    rollout_batch_size=8,
    n_samples_per_prompt=4,
    over_sampling_batch_size=16,
    max_response_len=4096,
    no_progress=True,
)
TINY_EMBEDDED = embedded_flags(steps=2, eval_every=1)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "april_bench", *args], capture_output=True, text=True, timeout=600, env=env
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
    assert final["result_kind"] == "simulated" and set(final["throughput_gain"]) == {
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
        "evals.jsonl",
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
        "throughput_gain",
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
    steps = table_rows(out, "steps")
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


@pytest.mark.slow  # a warm start from an empty cache and a measured run (about 20 s); tox's measured gate
# runs an embedded run too
def test_embedded_default_measures_throughput_and_accuracy(tmp_path: Path) -> None:
    out = tmp_path / "embedded"
    env = {**__import__("os").environ, "APRIL_BENCH_CACHE": str(tmp_path / "cache")}
    proc = _run("run", *TINY_EMBEDDED, "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "MEASURED" in proc.stdout and "| measured" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1])["result_kind"] == "measured"
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["engine"] == "hf" and provenance["result_kind"] == "measured"
    assert provenance["engine_dtype"] == "float32"  # what the engine computed in: the gap depends on it
    evals = table_rows(out, "evals")
    # The arms are interleaved (ABBA blocks), so rows of the two arms alternate on disk.
    assert sorted((e["arm"], e["step"]) for e in evals) == [
        ("april", 0),
        ("april", 1),
        ("april", 2),
        ("sync", 0),
        ("sync", 1),
        ("sync", 2),
    ]
    assert all(0.0 <= e["accuracy"] <= 1.0 and e["n"] > 0 for e in evals)
    # the starting policy is evaluated once: the second arm's step-0 row repeats the first's numbers
    first, second = [e for e in evals if e["step"] == 0]
    assert first["reused_from"] is None and first["eval_time_s"] > 0
    assert second["reused_from"] == first["arm"] != second["arm"] and second["eval_time_s"] == 0
    same = ("accuracy", "accuracy_stderr", "n", "mean_response_len", "by_dataset")
    assert [second[k] for k in same] == [first[k] for k in same]
    assert all(e["reused_from"] is None for e in evals if e["step"] > 0)
    summary = json.loads((out / "summary.json").read_text())["arms"]
    for arm in ("sync", "april"):
        assert summary[arm]["accuracy"] is not None and summary[arm]["accuracy_equal_time"] is not None
        assert summary[arm]["generated_tokens_per_s"] > 0
    assert summary["april"]["throughput_gain"] is not None
    table = (out / "table.md").read_text()
    assert "(baseline)" in table and "pts)" in table


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
    assert main(["run", "--hw", "h100", *args, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trainer-arg", "learning_rate=1"], "unknown --trainer-arg learning_rate"),
        (["--model", "tinyy"], "Did you mean: tiny"),
        (["--off-policy", "tis", "--trainer-arg", "mini_batches=0"], "mini_batches and epochs must be >= 1"),
    ],
)
def test_bad_embedded_input_is_caught_before_any_training(args: list[str], message: str, capsys) -> None:
    assert main(["validate", *args]) == 2
    assert message in capsys.readouterr().err


def test_validate_and_ls(capsys) -> None:
    assert main(["validate", "--hw", "h200", "--engine-arg", "tp_size=1"]) == 0
    out = capsys.readouterr().out
    assert "8 replica(s) of qwen3-4b on h200" in out
    assert main(["validate"]) == 0
    assert "ok: hf engine, tiny on cpu; synthetic task on synthetic; torch trainer; arms: sync, april" in (
        capsys.readouterr().out
    )
    assert main(["ls", "hardware"]) == 0
    listing = capsys.readouterr().out
    assert "mi300x" in listing and "eta_bw:" in listing


@pytest.mark.parametrize("hw", ["h100", "h200", "mi300x"])
def test_every_gpu_hardware_choice_simulates_here(hw: str, tmp_path: Path, capsys) -> None:
    assert main(["run", *tiny_sim_flags(hw=hw), "--out", str(tmp_path / hw)]) == 0
    assert '"result_kind": "simulated"' in capsys.readouterr().out


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
            "--engine-url",
            "--trainer",
            "--strategies",
            "--baseline",
            "--steps",
            "--seed",
            "--rollout-batch-size",
            "--n-samples-per-prompt",
            "--over-sampling-batch-size",
            "--max-response-len",
            "--dynamic-sampling",
            "--no-dynamic-sampling",
            "--refill",
            "--rollout-arg",
            "--off-policy",
            "--max-version-span",
            "--max-aborts-per-sample",
            "--strategy-arg",
            "--eval-every",
            "--num-gpus",
            "--engine-arg",
            "--trainer-arg",
            "--warmstart-arg",
            "--workload-arg",
            "--length-oracle",  # forced lengths and rewards from a seeded draw (docs/results-schema.md)
            "--task-arg",
            "--data-path",
            "--eval-datasets",
            "--repeats",
            "--block-steps",
            "--warmup-steps",
            "--telemetry",
            "--telemetry-rate",
            "--telemetry-devices",
            "--out",
            "--overwrite",
            "--resume",
            "--checkpoint-every",
            "--allow-dirty",
            "--no-progress",
            "--log-level",
            "--recipe",
            "--colocate",  # engines give their memory to the trainer between rollouts (docs/scale-out.md)
            "--config",  # the field's conventions (docs/conventions.md): config files, trackers, labels
            "--logger",
            "--logger-project",
            "--logger-offline",
            "--metadata",
        ]
    )
