"""``run --engine vllm`` end to end on the embedded synthetic task: real training, weights to vLLM each step.

Needs the vllm package (``pytest -m vllm``; tox env ``vllm``).  vLLM starts once per arm (about a
minute each on two cores), so the run is the smallest that still shows partial rollouts: the APRIL
arm alone (sync on vLLM is the same engine calls less the aborts, which the conformance suite covers).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import embedded_flags, table_rows

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SMALL = embedded_flags(strategies="april", eval_every=10)


def test_run_with_vllm_trains_and_resumes_partials_under_fresh_weights(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "APRIL_BENCH_CACHE": os.environ.get("APRIL_BENCH_CACHE", str(tmp_path / "cache"))}
    proc = subprocess.run(
        [sys.executable, "-m", "april_bench", "run", "--engine", "vllm", *SMALL, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["engine"] == "vllm" and provenance["result_kind"] == "measured"
    assert provenance["engine_version"]  # vLLM's own version string
    assert provenance["engine_dtype"] == "float32"  # vLLM's resolved dtype, the trainer's

    steps = table_rows(out, "steps")
    assert {(s["arm"], s["step"]) for s in steps} == {("april", i) for i in range(3)}
    assert all(s["train_metrics"]["loss"] == s["train_metrics"]["loss"] for s in steps)  # trained, not NaN
    assert all(s["weight_sync_time_s"] > 0 for s in steps)
    # weights reached vLLM after every step: its reload counter moves by one per step
    updates = {
        (m["arm"], m["step"]): m["metrics"]["weight_updates"] for m in table_rows(out, "engine_metrics")
        if m["phase"] == "rollout_end"
    }  # fmt: skip
    assert all(updates[(arm, step)] == step for arm, step in updates)

    requests = table_rows(out, "requests")
    for r in requests:  # every token stamped with the weights in force: one update per step
        assert r["policy_version"] == r["step"]
    april = [r for r in requests if r["arm"] == "april"]
    aborted = {(r["group_uid"], r["sample_index"], r["step"]) for r in april if r["finish_reason"] == "abort"}
    aborted_with_tokens = {
        (r["group_uid"], r["sample_index"], r["step"])
        for r in april
        if r["finish_reason"] == "abort" and r["output_len"] > 0
    }
    resumed = [r for r in april if r["prefix_len"] > 0]
    assert aborted and aborted_with_tokens and resumed
    for r in resumed:  # a resumed request continues a partial aborted in an earlier step
        assert any((r["group_uid"], r["sample_index"], s) in aborted for s in range(r["step"]))

    summary = json.loads((out / "summary.json").read_text())["arms"]
    engine = summary["april"]["engine"]
    assert engine["reprefilled_tokens"] == sum(r["prompt_len"] + r["prefix_len"] for r in resumed) > 0
    gap = engine["logprob_gap_mean"]
    assert gap is not None and math.isfinite(gap) and gap < 0.1  # same tokens, same weights: close
    assert "Re-prefilled tok" in (out / "table.md").read_text()
