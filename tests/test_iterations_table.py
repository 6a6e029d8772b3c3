"""The ``iterations`` table: the hf engine's scheduler rounds during each rollout (time, batch, tokens,
step ms), bounded per step, and the report's table of them."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import flags, table_rows

from april_bench.cli import main

#: The gpu-check preset at tiny sizes on the CPU: forced lengths, no warm start (seconds, not minutes).
RUN = [
    "run",
    "--recipe",
    "gpu-check",
    *flags(
        hw="cpu",
        model="tiny",
        engine_arg="device=cpu",
        trainer_arg="device=cpu",
        steps=2,
        block_steps=1,
        rollout_batch_size=2,
        n_samples_per_prompt=4,
        over_sampling_batch_size=4,
        max_response_len=32,
        telemetry="off",
        no_progress=True,
    ),
]


@pytest.mark.slow
def test_each_rollouts_rounds_are_rows_on_the_arm_clock_bounded_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("APRIL_BENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main([*RUN, "--out", str(out)]) == 0
    rounds = table_rows(out, "iterations")
    steps = {(s["arm"], s["step"]): s for s in table_rows(out, "steps")}
    busy = {key for key, s in steps.items() if s["engine_iterations"]}  # a step may need no forward
    assert busy and {(r["arm"], r["step"]) for r in rounds} == busy
    decode_tokens: dict[tuple[str, int], int] = defaultdict(int)
    decode_steps: dict[tuple[str, int], int] = defaultdict(int)
    for r in rounds:
        s = steps[(r["arm"], r["step"])]
        assert r["sampled_every"] == 1 and r["kind"] in ("prefill", "decode") and r["step_ms"] >= 0
        assert s["t_start"] <= r["t"] <= s["t_start"] + s["rollout_time_s"]  # within its rollout
        if r["kind"] == "decode":
            decode_tokens[(r["arm"], r["step"])] += r["tokens"]
            decode_steps[(r["arm"], r["step"])] += r["steps"]
    for key, s in steps.items():  # every decode step of the rollout, none of an evaluation's
        assert decode_tokens[key] == s["decode_tokens"] and decode_steps[key] == s["decode_iterations"], key
    summary = json.loads((out / "summary.json").read_text())["arms"]
    for arm in ("sync", "april"):
        counted = summary[arm]["iterations"]
        assert counted["decode_steps"] == summary[arm]["decode_iterations"]
        assert 0.0 <= counted["low_batch_decode_share"] <= 1.0
    table = (out / "table.md").read_text()
    assert "### Engine rounds: decode steps and the tail at low batch (measured" in table
    capsys.readouterr()

    import april_bench.experiment.session as session

    monkeypatch.setattr(session, "ITERATION_ROWS_PER_STEP", 3)
    bounded = tmp_path / "bounded"
    assert main([*RUN, "--out", str(bounded)]) == 0
    per_step: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in table_rows(bounded, "iterations"):
        per_step[(r["arm"], r["step"])].append(r)
    assert all(len(rows) <= 3 for rows in per_step.values())
    assert any(rows[0]["sampled_every"] > 1 for rows in per_step.values())
