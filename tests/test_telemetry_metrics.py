"""Per-arm GPU metrics from telemetry and event rows: hand-derived exact values."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from april_bench.results.summary import summarize
from april_bench.telemetry.metrics import (
    gpu_metrics,
    gpu_summary,
    integrate,
    merge_windows,
    phase_windows,
    tail_windows,
    window_metrics,
)


def sample(
    t: float,
    util: float | None,
    clock: float | None,
    power: float | None,
    energy: float | None,
    *,
    device: int = 0,
) -> dict[str, Any]:
    return {
        "t": t,
        "device": device,
        "name": "gpu",
        "util_gpu": util,
        "util_mem": None,
        "sm_clock_mhz": clock,
        "mem_used_bytes": None,
        "mem_total_bytes": None,
        "power_w": power,
        "energy_j": energy,
    }


def event(t: float, kind: str, step: int = 0, arm: str = "sync", repeat: int = 0) -> dict[str, Any]:
    return {"arm": arm, "step": step, "kind": kind, "t": t, "repeat": repeat}


def one_step(arm: str = "sync", *, at: float = 0.0, repeat: int = 0) -> list[dict[str, Any]]:
    """The events the driver emits for one step (no train_start/train_end: train is rollout_end ..
    weight_sync_start), shifted by ``at``."""
    return [
        event(at + t, kind, arm=arm, repeat=repeat)
        for t, kind in [
            (0.5, "rollout_start"),
            (3.0, "rollout_stop"),
            (3.5, "rollout_end"),
            (4.5, "weight_sync_start"),
            (5.0, "weight_sync_end"),
        ]
    ]


# One GPU sampled every second.  Held backwards, the samples give on (0,1], (1,2], ... (5,6]:
#   util 100, 50, 0, 100, 20, 40 %;  clock 1000, 2000, 2000, 1000, 1500, 1500 MHz;
#   energy counter 0, 10, 30, 30, 50, 60, 60 J -> power 10, 20, 0, 20, 10, 0 W.
TELEMETRY = [
    sample(0, 0, 1000, 100, 0),
    sample(1, 100, 1000, 100, 10),
    sample(2, 50, 2000, 100, 30),
    sample(3, 0, 2000, 100, 30),
    sample(4, 100, 1000, 100, 50),
    sample(5, 20, 1500, 100, 60),
    sample(6, 40, 1500, 100, 60),
]
# Then fully busy, 10 W, up to t = 12: (6,7] ... (11,12].
BUSY_AFTER = [sample(t, 100, 1800, 10, 60 + 10 * (t - 6)) for t in range(7, 13)]


def test_every_phase_of_one_step_is_integrated_exactly() -> None:
    m = gpu_metrics(TELEMETRY, one_step(), tail={"sync": [(3.0, 3.5)]}, trained_tokens={"sync": 110})["sync"]
    # rollout [0.5, 3.5]: busy 0.5*1 + 1*0.5 + 1*0 + 0.5*1 = 1.5 of 3 s
    assert m["rollout_busy_share"] == 0.5
    assert m["rollout_idle_gpu_s"] == 1.5
    assert m["rollout_sm_clock_mhz"] == pytest.approx(5000 / 3)  # (500 + 2000 + 2000 + 500) / 3
    assert m["rollout_energy_j"] == 35.0  # E(3.5) - E(0.5) = 40 - 5
    assert m["rollout_coverage"] == 1.0
    # tail [3.0, 3.5] and abort drain [3.0, 3.5] (rollout_stop .. rollout_end): all busy
    assert (m["tail_busy_share"], m["tail_idle_gpu_s"], m["tail_energy_j"]) == (1.0, 0.0, 10.0)
    assert (m["drain_busy_share"], m["drain_energy_j"]) == (1.0, 10.0)
    # train = rollout_end .. weight_sync_start [3.5, 4.5]: 0.5*1 + 0.5*0.2 = 0.6
    assert m["train_busy_share"] == pytest.approx(0.6)
    assert m["train_idle_gpu_s"] == pytest.approx(0.4)
    assert m["train_energy_j"] == 15.0
    # weight sync [4.5, 5.0]: 0.5*0.2 = 0.1 of 0.5 s
    assert m["weight_sync_busy_share"] == pytest.approx(0.2)
    assert m["weight_sync_energy_j"] == 5.0
    # step [0.5, 5.0]: busy 2.2 of 4.5 s; energy E(5) - E(0.5) = 55 J over 110 trained tokens
    assert m["step_busy_share"] == pytest.approx(2.2 / 4.5)
    assert m["step_idle_gpu_s"] == pytest.approx(2.3)
    assert m["step_energy_j"] == 55.0
    assert m["energy_per_trained_token_j"] == 0.5
    assert (m["energy_source"], m["gpus"]) == ("counter", 1)


def test_train_events_when_present_bound_the_train_phase() -> None:
    events = [*one_step(), event(3.6, "train_start"), event(4.0, "train_end")]
    m = gpu_metrics(TELEMETRY, events)["sync"]
    assert m["train_busy_share"] == 1.0  # [3.6, 4.0] lies in (3, 4]: 100 %
    assert m["train_energy_j"] == pytest.approx(8.0)  # 0.4 s at 20 W


def test_a_window_between_samples_takes_the_covering_sample_and_time_after_the_last_is_uncovered() -> None:
    telemetry = [sample(0, 90, 1000, 300, None), sample(10, 30, 1200, 100, None)]
    events = [
        event(2, "rollout_start"),  # inside (0, 10]: the t=10 sample covers it
        event(3, "rollout_end"),
        event(11, "weight_sync_start"),  # after the last sample
        event(12, "weight_sync_end"),
    ]
    m = gpu_metrics(telemetry, events)["sync"]
    assert (m["rollout_busy_share"], m["rollout_idle_gpu_s"], m["rollout_sm_clock_mhz"]) == (0.3, 0.7, 1200)
    assert m["rollout_energy_j"] == 100.0  # no counter: 100 W held over 1 s
    assert m["energy_source"] == "power"
    assert (m["weight_sync_busy_share"], m["weight_sync_idle_gpu_s"], m["weight_sync_coverage"]) == (
        None,
        None,
        0.0,
    )


def test_devices_add_up_and_a_missing_sample_leaves_its_interval_uncovered() -> None:
    telemetry = [
        *(sample(t, u, 1000, 50, e) for t, u, e in [(0, 0, 0), (1, 100, 5), (2, 100, 10)]),
        *(sample(t, u, 1000, 50, None, device=1) for t, u in [(0, 0), (1, None), (2, 0)]),
    ]
    m = gpu_metrics(telemetry, [event(0, "rollout_start"), event(2, "rollout_end")])["sync"]
    # device 0: busy 2 of 2 s; device 1: (0,1] unknown, (1,2] idle -> busy 0 of 1 s
    assert m["rollout_busy_share"] == pytest.approx(2 / 3)
    assert m["rollout_idle_gpu_s"] == 1.0
    assert m["rollout_coverage"] == 0.75  # 3 covered device-seconds of 2 s x 2 GPUs
    assert m["rollout_energy_j"] == 110.0  # 10 J from device 0's counter + 50 W x 2 s held on device 1
    assert (m["gpus"], m["energy_source"]) == (2, "mixed")


def test_arms_take_the_samples_inside_their_own_windows() -> None:
    events = [*one_step("sync"), *one_step("april", at=6.0), *one_step("oversample-discard", at=20.0)]
    metrics = gpu_metrics([*TELEMETRY, *BUSY_AFTER], events)
    assert list(metrics) == ["sync", "april", "oversample-discard"]
    assert metrics["sync"]["rollout_busy_share"] == 0.5
    assert metrics["sync"]["step_energy_j"] == 55.0
    assert metrics["april"]["rollout_busy_share"] == 1.0  # [6.5, 9.5]
    assert metrics["april"]["step_energy_j"] == 45.0  # [6.5, 11]: 4.5 s at 10 W
    assert metrics["oversample-discard"]["rollout_busy_share"] is None  # [20.5, 23.5]: after the last sample
    assert metrics["oversample-discard"]["rollout_coverage"] == 0.0
    assert metrics["sync"]["tail_busy_share"] is None  # no tail windows given


def test_repeats_of_an_arm_are_separate_steps_and_both_count() -> None:
    events = [*one_step("sync", repeat=0), *one_step("sync", at=6.0, repeat=1)]
    assert phase_windows(events, "rollout") == {"sync": [(0.5, 3.5), (6.5, 9.5)]}
    m = gpu_metrics([*TELEMETRY, *BUSY_AFTER], events)["sync"]
    assert m["rollout_busy_share"] == pytest.approx((1.5 + 3.0) / 6.0)
    assert m["step_energy_j"] == 100.0  # 55 J + 45 J


def test_a_counter_that_restarts_counts_nothing_for_that_one_interval() -> None:
    restarted = [sample(0, 50, 1000, 1, 0), sample(1, 50, 1000, 1, 10), sample(2, 50, 1000, 1, 0)]
    restarted.append(sample(3, 50, 1000, 1, 5))
    m = gpu_metrics(restarted, [event(0, "rollout_start"), event(3, "rollout_end")])["sync"]
    assert m["rollout_energy_j"] == 15.0  # 10 J on (0,1], nothing on (1,2], 5 J on (2,3]


def test_phase_windows_pair_boundaries_of_the_same_step_and_drop_unfinished_steps() -> None:
    events = [
        event(0, "rollout_start", 0),
        event(4, "rollout_end", 0),
        event(10, "rollout_start", 1),
        event(12, "rollout_end", 1),
        event(20, "rollout_start", 2),  # crashed: no end
        event(1, "rollout_start", 0, arm="april"),
        event(2, "rollout_end", 0, arm="april"),
    ]
    assert phase_windows(events, "rollout") == {"sync": [(0, 4), (10, 12)], "april": [(1, 2)]}


def test_merged_windows_never_count_time_twice() -> None:
    assert merge_windows([(5, 6), (0, 2), (1, 3), (3, 4), (7, 7)]) == [(0, 4), (5, 6)]


def test_tail_windows_have_the_summary_tail_length_and_end_at_the_rollout_end_event() -> None:
    steps = [
        {"arm": "april", "step": 0, "t_start": 0.0, "rollout_time_s": 10.0},
        {"arm": "april", "step": 1, "t_start": 12.0, "rollout_time_s": 6.0},
    ]
    requests = [
        *({"arm": "april", "step": 0, "finish_reason": "stop", "t_done": float(t)} for t in range(1, 11)),
        {"arm": "april", "step": 0, "finish_reason": "abort", "t_done": 9.9},
        *({"arm": "april", "step": 1, "finish_reason": "length", "t_done": t} for t in (13.0, 14.0, 15.5)),
    ]
    events = [event(1000.0, "rollout_end", 0, "april"), event(1020.0, "rollout_end", 1, "april")]
    # step 0: 9th of 10 finished at 9 -> tail 1 s; step 1: 3rd of 3 at 15.5, rollout ends at 18 -> 2.5 s
    windows = tail_windows(steps, requests, events)
    assert windows == {"april": [(999.0, 1000.0), (1017.5, 1020.0)]}
    tail_s = sum(b - a for a, b in windows["april"])
    assert tail_s / 16.0 == summarize({"steps": steps, "requests": requests})["april"]["tail_time_share"]


def test_gpu_summary_takes_tails_and_trained_tokens_from_the_run_tables() -> None:
    steps = [{"arm": "sync", "step": 0, "t_start": 0.0, "rollout_time_s": 3.0}]
    requests = [{"arm": "sync", "step": 0, "finish_reason": "stop", "t_done": 2.5}]
    samples = [
        {"arm": "sync", "fate": "trained", "response_len": 100},
        {"arm": "sync", "fate": "trained", "response_len": 10},
        {"arm": "sync", "fate": "dropped", "response_len": 999},
    ]
    m = gpu_summary(TELEMETRY, one_step(), steps, requests, samples)["sync"]
    assert m["tail_energy_j"] == 10.0  # tail [3.0, 3.5]
    assert m["energy_per_trained_token_j"] == 0.5  # 55 J / 110 tokens


windows_st = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), max_size=6).map(
    lambda ws: merge_windows((float(a), float(a + n)) for a, n in ws)
)
series_st = st.lists(st.tuples(st.integers(1, 5), st.integers(0, 100)), min_size=1, max_size=12)


@given(series_st, windows_st)
def test_two_pointer_integral_equals_the_brute_force_overlap_sum(
    steps: list[tuple[int, int]], windows: list[tuple[float, float]]
) -> None:
    t, segments = 0.0, []
    for dt, value in steps:
        segments.append((t, t + dt, float(value)))
        t += dt
    brute_total = brute_covered = 0.0
    for s0, s1, v in segments:
        for w0, w1 in windows:
            overlap = max(0.0, min(s1, w1) - max(s0, w0))
            brute_total += v * overlap
            brute_covered += overlap
    assert integrate(segments, windows) == (brute_total, brute_covered)


def test_window_metrics_merges_overlapping_windows_before_integrating() -> None:

    m = window_metrics(TELEMETRY, [(0.5, 3.5), (3.0, 4.5)])  # = [0.5, 4.5]
    assert m["busy_share"] == pytest.approx(2.1 / 4)  # 1.5 (rollout) + 0.6 (train)
    assert m["energy_j"] == 50.0  # E(4.5) - E(0.5) = 55 - 5
    assert (m["coverage"], m["gpus"], m["energy_source"]) == (1.0, 1, "counter")


def test_gpm_shares_are_time_weighted_over_the_samples_that_have_them() -> None:
    # Device 0 has GPM: SM activity 20% on (0,1], 80% on (1,2]; device 1 (older GPU, or rows written
    # before the field existed) has none and so does not dilute the mean.
    rows = [sample(t, 100, 1000, 10, None) for t in range(3)]
    for row, (sm, dram) in zip(rows, [(None, None), (20.0, 10.0), (80.0, 70.0)], strict=True):
        row["sm_active_pct"], row["dram_bw_pct"] = sm, dram
    old = [sample(t, 50, 1000, 10, None, device=1) for t in range(3)]
    m = window_metrics(rows + old, [(0.5, 2.0)])
    assert m["sm_active"] == pytest.approx((0.5 * 0.2 + 1.0 * 0.8) / 1.5)
    assert m["dram_bw"] == pytest.approx((0.5 * 0.1 + 1.0 * 0.7) / 1.5)
    assert window_metrics(old, [(0.5, 2.0)])["sm_active"] is None  # no GPM samples: not a zero
