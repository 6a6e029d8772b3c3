"""Where a gain comes from (april_bench.results.decomposition), exactly, on rows written by hand."""

from __future__ import annotations

import math

import pytest

from april_bench.results.decomposition import decompose
from april_bench.results.summary import summarize


def _step(arm: str, step: int, t_start: float, rollout: float, sat: float | None, generated: int) -> dict:
    return {
        "arm": arm,
        "step": step,
        "t_start": t_start,
        "rollout_time_s": rollout,
        "step_time_s": rollout,
        "saturated_tokens_per_s": sat,
        "generated_tokens": generated,
    }


def _requests(arm: str, step: int, done: list[float], tokens: int) -> list[dict]:
    """One request per finish time, ``tokens`` split evenly between them."""
    return [
        {"arm": arm, "step": step, "t_done": t, "output_len": tokens // len(done), "finish_reason": "stop",
         "group_uid": i, "sample_index": 0}
        for i, t in enumerate(done)
    ]  # fmt: skip


def _sample(arm: str, uid: int, fate: str, tokens: int) -> dict:
    return {"arm": arm, "group_uid": uid, "sample_index": 0, "fate": fate, "response_len": tokens,
            "version_runs": [[0, tokens]], "train_version": 0, "status": "completed"}  # fmt: skip


def _run(*, april_sat: float | None = 150.0) -> dict:
    """sync: 10 s of rollout at a saturated 100 tok/s, 600 tokens (9th of 10 requests done at 5 s: tail
    0.5), half of them discarded.  april: 8 s at 150 tok/s, 960 tokens (9th done at 6 s: tail 0.25), all
    trained."""
    tables = {
        "steps": [_step("sync", 0, 0.0, 10.0, 100.0, 600), _step("april", 0, 0.0, 8.0, april_sat, 960)],
        "requests": [
            *_requests("sync", 0, [1, 1, 2, 2, 3, 3, 4, 4, 5, 10], 600),
            *_requests("april", 0, [1, 2, 2, 3, 3, 4, 5, 5, 6, 8], 960),
        ],
        "samples": [
            _sample("sync", 0, "trained", 300),
            _sample("sync", 1, "dropped", 300),
            _sample("april", 2, "trained", 960),
        ],
    }
    return summarize(tables, baseline="sync")


def test_each_factor_and_its_points_on_hand_built_rows() -> None:
    summary = _run()
    sync, april = summary["sync"], summary["april"]
    assert (sync["tail_time_share"], april["tail_time_share"]) == (0.5, 0.25)
    assert (sync["rollout_efficiency"], april["rollout_efficiency"]) == (
        pytest.approx(0.6),
        pytest.approx(0.8),
    )
    d = april["gain_decomposition"]
    assert summary["sync"]["gain_decomposition"] is None  # the baseline has nothing to decompose
    assert d["throughput_gain"] == pytest.approx(1.0)  # 120 tok/s against 60
    assert d["tail_factor"] == pytest.approx(0.75 / 0.5)
    assert d["concurrency_factor"] == pytest.approx((120 / 0.8) / (60 / 0.6))  # saturated 150 against 100
    assert d["fill_factor"] == pytest.approx((0.8 / 0.75) / (0.6 / 0.5))
    # each factor's log share of the gain: ln 1.5 / ln 2 points twice, ln(8/9) / ln 2 once; they add up
    assert d["tail"] == pytest.approx(math.log(1.5) / math.log(2))
    assert d["concurrency"] == pytest.approx(math.log(1.5) / math.log(2))
    assert d["fill"] == pytest.approx(math.log(8 / 9) / math.log(2))
    assert d["tail"] + d["fill"] + d["concurrency"] == pytest.approx(d["throughput_gain"], abs=1e-12)
    # not discarding: sync trained half its tokens, april all of them (keep x2): useful gain 2 x 2 - 1
    assert d["keep_factor"] == pytest.approx(2.0)
    assert d["useful_gain"] == pytest.approx(3.0) == pytest.approx(april["useful_gain"])
    assert d["discard"] == pytest.approx(2.0)


def test_without_a_saturated_rate_fill_holds_all_but_the_tail() -> None:
    d = _run(april_sat=None)["april"]["gain_decomposition"]
    assert d["concurrency"] is None and d["concurrency_factor"] is None
    assert d["tail"] == pytest.approx(math.log(1.5) / math.log(2))
    assert d["tail"] + d["fill"] == pytest.approx(1.0, abs=1e-12)


def test_no_gain_splits_into_log_factors_that_cancel() -> None:
    base = {"generated_tokens_per_s": 100.0, "tail_time_share": 0.5, "rollout_efficiency": 0.5,
            "generated_tokens": 1000, "trained_tokens": 500}  # fmt: skip
    arm = {"generated_tokens_per_s": 100.0, "tail_time_share": 0.0, "rollout_efficiency": 0.5,
           "generated_tokens": 1000, "trained_tokens": 1000}  # fmt: skip
    d = decompose(arm, base)
    assert d is not None and d["throughput_gain"] == 0.0
    assert d["tail"] == pytest.approx(math.log(2)) and d["fill"] == pytest.approx(-math.log(2))
    assert d["concurrency"] == pytest.approx(0.0) and d["discard"] == pytest.approx(1.0)


def test_missing_inputs_give_no_decomposition() -> None:
    base = {"generated_tokens_per_s": 100.0, "tail_time_share": 0.5}
    assert decompose({"generated_tokens_per_s": 100.0, "tail_time_share": None}, base) is None
    assert decompose({"generated_tokens_per_s": 100.0, "tail_time_share": 1.0}, base) is None
    assert decompose({"generated_tokens_per_s": None, "tail_time_share": 0.1}, base) is None


def test_the_per_step_mean_of_tokens_throughput_beside_the_ratio_of_totals() -> None:
    """APRIL logged tokens_throughput per step: sync 100 tok/s then 25 (mean 62.5; totals 200 / 5 = 40),
    april 50 then 50 (mean and totals 50)."""
    tables = {
        "steps": [
            _step("sync", 0, 0.0, 1.0, None, 100),
            _step("sync", 1, 1.0, 4.0, None, 100),
            _step("april", 0, 0.0, 2.0, None, 100),
            _step("april", 1, 2.0, 2.0, None, 100),
        ],
        "requests": [
            *_requests("sync", 0, [1.0], 100),
            *_requests("sync", 1, [5.0], 100),
            *_requests("april", 0, [2.0], 100),
            *_requests("april", 1, [4.0], 100),
        ],
    }
    summary = summarize(tables, baseline="sync")
    assert summary["sync"]["tokens_throughput_step_mean"] == pytest.approx(62.5)
    assert summary["april"]["tokens_throughput_step_mean"] == pytest.approx(50.0)
    assert summary["april"]["throughput_gain_step_mean"] == pytest.approx(50 / 62.5 - 1)
    assert summary["april"]["throughput_gain"] == pytest.approx(50 / 40 - 1)  # the ratio of totals differs
