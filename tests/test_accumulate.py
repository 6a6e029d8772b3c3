"""Summaries accumulated row by row equal summaries of the rows, in memory that does not keep them."""

from __future__ import annotations

import math
import random

import pytest
from helpers import fake_arm

from april_bench.results.accumulate import LatencyValues
from april_bench.results.recorder import SMALL_TABLES, RunRecorder
from april_bench.results.summary import summarize
from april_bench.strategies import build_strategy


def _length(uid: int, index: int) -> int:
    return 2 + ((uid * 37 + index * 11) % 23) ** 2 // 8


def test_a_recorder_keeping_only_small_tables_summarizes_as_the_rows_do() -> None:
    full = RunRecorder()
    lean = RunRecorder(keep=SMALL_TABLES)
    for strategy in ("sync", "april"):
        _, recorder, _ = fake_arm(build_strategy(strategy), _length, steps=5, rollout_batch_size=4)
        for table, rows in recorder.rows().items():
            full.preload({table: rows})
        for record in [*recorder["requests"], *recorder["samples"], *recorder["steps"]]:
            lean.add(record)
    assert not lean["requests"] and not lean["samples"] and lean["steps"]
    assert lean.summary() == full.summary() == summarize(full.rows())
    assert lean.summary()["april"]["prompts"]["inconsistent"] == 0


def test_latency_percentiles_are_exact_up_to_the_cap_then_within_a_tenth_of_a_percent() -> None:
    rng = random.Random(0)
    values = [rng.lognormvariate(0.0, 2.0) for _ in range(5000)] + [0.0]
    exact, binned = LatencyValues(cap=10_000), LatencyValues(cap=100)
    for v in values:
        exact.add(v)
        binned.add(v)
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99):
        pos = q * (len(ordered) - 1)
        lo = math.floor(pos)
        want = ordered[lo] + (ordered[lo + 1] - ordered[lo]) * (pos - lo)
        assert exact.quantile(q) == want
        nearest = ordered[round(pos)]
        assert binned.quantile(q) == pytest.approx(nearest, rel=1e-3)
    assert len(binned) == len(values) and binned.quantile(0.0) == 0.0


def test_one_quantile_serves_the_summary_the_bootstrap_and_the_data_stats() -> None:
    import numpy as np

    from april_bench.data.stats import percentile
    from april_bench.quantiles import quantile

    rng = random.Random(3)
    for n in (1, 2, 7, 100):
        values = sorted(rng.uniform(0, 50) for _ in range(n))
        exact = LatencyValues()
        for v in values:
            exact.add(v)
        for q in (0.0, 0.25, 0.5, 0.9, 0.99, 1.0):
            expected = float(np.quantile(values, q))
            assert quantile(values, q) == pytest.approx(expected, rel=1e-12, abs=1e-12)
            assert exact.quantile(q) == quantile(values, q)
            assert percentile(values, q * 100) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert math.isnan(percentile([], 50))
