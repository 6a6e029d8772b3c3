"""Metric definitions on rows written by hand."""

from __future__ import annotations

import pytest

from april_bench.results.summary import summarize


def _step(arm: str, step: int, t_start: float, rollout: float, *, sat: float | None = 100.0) -> dict:
    return {
        "arm": arm,
        "step": step,
        "t_start": t_start,
        "rollout_time_s": rollout,
        "step_time_s": rollout + 1,
        "train_time_s": 1.0,
        "weight_sync_time_s": 0.0,
        "saturated_tokens_per_s": sat,
        "partial_samples": 0,
        "restarted_samples": 0,
        "rejected_groups": 0,
        "dropped_groups": 0,
        "abort_rounds": 0,
        "bookkeeping_s": 0.001,
    }


def _req(
    arm: str, step: int, t_done: float, n: int, reason: str = "stop", *, uid: int = 0, prefix: int = 0
) -> dict:
    return {
        "arm": arm,
        "step": step,
        "t_done": t_done,
        "output_len": n,
        "finish_reason": reason,
        "group_uid": uid,
        "sample_index": 0,
        "prefix_len": prefix,
        "t_submit": float(step),
    }


def _sample(arm: str, uid: int, fate: str, runs: list[list[int]], train_version: int | None, **kw) -> dict:
    n = sum(c for _, c in runs)
    off = sum(c for v, c in runs if train_version is not None and v < train_version)
    row = {
        "arm": arm,
        "group_uid": uid,
        "fate": fate,
        "response_len": n,
        "version_runs": runs,
        "train_version": train_version,
        "off_policy_tokens": off,
        "discarded_tokens": 0,
        "status": "completed",
    }
    row.update(kw)
    return row


def test_tail_share_efficiency_gain_and_off_policy() -> None:
    # sync: 10 completions in a 10 s step; the 9th finishes at t=2, so the last 10% take 8 s.
    steps = [_step("sync", 0, 0.0, 10.0), _step("april", 0, 0.0, 5.0)]
    requests = [_req("sync", 0, float(t), 10) for t in (1, 1, 1, 1, 1, 1, 1, 1, 2, 10)]
    requests += [_req("april", 0, 5.0, 100), _req("april", 0, 5.0, 20, "abort")]
    samples = [
        _sample("sync", 0, "trained", [[0, 100]], 0),
        _sample("april", 1, "trained", [[0, 30], [1, 50]], 1),
        _sample("april", 2, "buffered", [[1, 40]], None),
    ]
    s = summarize({"requests": requests, "samples": samples, "steps": steps})
    assert s["sync"]["tail_time_share"] == pytest.approx(0.8)
    assert s["sync"]["off_policy_ratio_reference_def"] == 0
    assert s["sync"]["rollout_efficiency"] == pytest.approx(100 / (10 * 100))
    assert s["april"]["generated_tokens_per_s"] == pytest.approx(24.0)
    assert s["april"]["throughput_gain"] == pytest.approx(24.0 / 10.0 - 1)
    assert s["april"]["off_policy_token_ratio"] == pytest.approx(30 / 80)
    assert s["april"]["max_version_span"] == 1 and s["april"]["max_staleness"] == 1
    assert s["april"]["buffered_tokens_at_end"] == 40
    assert s["april"]["prompts"] == {
        "launched": 2,
        "trained": 1,
        "dropped": 0,
        "buffered": 1,
        "inconsistent": 0,
    }


def test_reference_off_policy_counts_only_the_previous_segment() -> None:
    # One sample resumed twice: 10, then 5, then 7 tokens.  slime adds the previous call's count on
    # each resume (10, then 5) and divides by total + off: 15 / (22 + 15).  The true share of the
    # final 22-token response produced by older policies is 15 / 22.
    steps = [_step("april", i, float(i), 1.0) for i in range(3)]
    requests = [
        _req("april", 0, 1, 10, "abort"),
        _req("april", 1, 2, 5, "abort", prefix=10),
        _req("april", 2, 3, 7, prefix=15),
    ]
    s = summarize({"requests": requests, "steps": steps}, baseline="april")
    assert s["april"]["off_policy_ratio_reference_def"] == pytest.approx(15 / 37)


def test_missing_baseline_or_saturation_gives_none_not_a_number() -> None:
    s = summarize({"requests": [_req("april", 0, 1.0, 5)], "steps": [_step("april", 0, 0.0, 1.0, sat=None)]})
    assert s["april"]["baseline"] == "april" and s["april"]["throughput_gain"] == 0.0  # the only arm
    s = summarize(
        {"requests": [_req("april", 0, 1.0, 5)], "steps": [_step("april", 0, 0.0, 1.0, sat=None)]},
        baseline="sync",
    )
    assert s["april"]["throughput_gain"] is None
    assert s["april"]["rollout_efficiency"] is None
    assert s["april"]["accuracy"] is None and s["april"]["accuracy_improvement"] is None


def test_the_table_legend_explains_every_column_a_reader_sees() -> None:
    from april_bench.results.legend import COLUMN_MEANINGS, table_legend
    from april_bench.results.table import PAPER_COLUMNS, detail_columns

    self_explaining = {"Dataset", "Model", "Algorithm", "Hardware", "Strategy", "Source", "Rollout s/step"}
    self_explaining |= {"Step s/step", "Gen tok/s", "Useful tok/s", "Useful gain"}
    for column in (*PAPER_COLUMNS, *detail_columns(8)):
        assert column in COLUMN_MEANINGS or column in self_explaining, column
    summary = {
        "sync": {
            "baseline": "sync",
            "accuracy": 0.15,
            "accuracy_equal_time": 0.16,
            "equal_time_budget_s": 59.4,
        },
        "april": {
            "baseline": "sync",
            "accuracy": 0.16,
            "accuracy_equal_time": 0.16,
            "equal_time_budget_s": 59.4,
        },
    }
    legend = table_legend(summary, simulated=False)
    assert "docs/results-schema.md" in legend and "- Tail share: " in legend
    assert "The baseline (sync) shows two accuracies" in legend and "59.4 s" in legend
    assert "two accuracies" not in table_legend(summary, simulated=True)
