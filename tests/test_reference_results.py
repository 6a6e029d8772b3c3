"""Committed simulated results must be what the current code produces: re-run them and compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from april_bench.experiment import load_config, run
from april_bench.results.store import load_run

RUNS = Path(__file__).resolve().parents[1] / "results" / "runs"
SIMULATED = sorted(p for p in RUNS.glob("*") if (p / "provenance.json").exists() and load_run(p).simulated)


@pytest.mark.parametrize("path", SIMULATED, ids=lambda p: p.name)
def test_committed_simulated_run_reproduces_exactly(path: Path) -> None:
    committed = load_run(path)
    config = load_config(committed.config)
    rec = run(config, progress=False).recorder
    fresh = rec.summary()
    expected = committed.summary()
    for arm in (fresh, expected):  # real CPU seconds of the harness itself: measured, not simulated
        for metrics in arm.values():
            del metrics["bookkeeping_s_per_step"], metrics["bookkeeping_share_of_engine_time"]
    assert fresh == expected


def test_there_is_a_committed_simulated_run() -> None:
    assert SIMULATED, "results/runs should hold at least one simulated reference run"
