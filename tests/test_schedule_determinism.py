"""The embedded engine's schedule is a function of the seed: the same rows at any load, only times differ."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import embedded_flags, table_rows

#: Columns that are clock readings (or rates and counts derived from them): the only ones that may differ.
TIME_COLUMNS = {
    "requests": {"t_submit", "t_first_token", "t_done"},
    "steps": {
        "t_start",
        "rollout_time_s",
        "train_time_s",
        "weight_sync_time_s",
        "step_time_s",
        "drain_time_s",
        "bookkeeping_s",
        "saturated_tokens_per_s",  # from measured decode-step times
        "abort_rounds",  # a re-abort is sent when a forward outlasts reabort_interval_s
    },
    "evals": {"train_time_s", "eval_time_s"},
    "engine_metrics": {"t"},
    "samples": set(),
}

RUN = embedded_flags(block_steps=1, eval_every=100)


def _untimed(run: Path, table: str) -> list[dict[str, Any]]:
    """A table's rows without its timing columns (:data:`TIME_COLUMNS`)."""
    drop = TIME_COLUMNS[table]
    return [{k: v for k, v in row.items() if k not in drop} for row in table_rows(run, table)]


def _run(out: Path, cache: Path) -> None:
    env = {**os.environ, "APRIL_BENCH_CACHE": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-m", "april_bench", "run", *RUN, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_two_seeded_embedded_runs_one_beside_a_cpu_hog_give_the_same_rows_but_times(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _run(tmp_path / "quiet", cache)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        _run(tmp_path / "loaded", cache)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    for table in TIME_COLUMNS:
        quiet, loaded = _untimed(tmp_path / "quiet", table), _untimed(tmp_path / "loaded", table)
        assert quiet, table
        assert quiet == loaded, table
    steps = _untimed(tmp_path / "quiet", "steps")
    assert all(s["engine_iterations"] > 0 and s["work_deterministic"] for s in steps)
    assert any(s["reprefill_tokens"] > 0 for s in steps if s["arm"] == "april")
