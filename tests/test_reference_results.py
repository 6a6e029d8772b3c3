"""Committed simulated results must be what the current code produces: re-run them and compare."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from april_bench.experiment import load_config, run
from april_bench.results.store import RunDirectory

RUNS = Path(__file__).resolve().parents[1] / "results" / "runs"
# Chosen by their provenance alone (RunDirectory.simulated's test): reading every run's rows here would
# cost each pytest process seconds at collection, in every tox env
SIMULATED = sorted(
    p
    for p in RUNS.glob("*")
    if (p / "provenance.json").exists()
    and json.loads((p / "provenance.json").read_text()).get("result_kind") == "simulated"
)


@pytest.mark.parametrize("path", SIMULATED, ids=lambda p: p.name)
def test_committed_simulated_run_reproduces_exactly(
    path: Path, committed_run: Callable[[Path], RunDirectory]
) -> None:
    committed = committed_run(path)
    assert committed.simulated
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
