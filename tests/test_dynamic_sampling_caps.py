"""DAPO dynamic sampling refills, and APRIL's staleness caps."""

from __future__ import annotations

import pytest
from helpers import fake_arm

from april_bench.algorithms.filters import keep_group
from april_impl import AprilStrategy
from baselines import SyncStrategy


def test_keep_group_rejects_only_all_equal_rewards() -> None:
    assert not keep_group([1.0] * 8)
    assert not keep_group([0.0, 0.0])
    assert keep_group([0.0, 1.0])
    assert keep_group([1.0])  # a singleton group carries no baseline: kept (verl)


def _reject_multiples_of_three(uid: int, index: int) -> float:
    return 1.0 if uid % 3 == 0 else float(index % 2)


@pytest.mark.parametrize(
    ("refill", "launched", "dropped"),
    [
        # uid 0 is rejected at t=10 while uid 1 is still in flight: 0 + 1 < 2, so a whole wave (2, 3)
        # goes out; uid 2 completes the batch at t=20 and uid 3, finished at the same instant, is surplus.
        ("wave", 4, 1),
        # granular refill launches only the deficit: uid 2.
        ("granular", 3, 0),
    ],
)
def test_sync_refills_after_rejections(refill: str, launched: int, dropped: int) -> None:
    outcomes, recorder, _ = fake_arm(
        SyncStrategy.Config().build(),
        lambda uid, i: 10,
        steps=1,
        reward=_reject_multiples_of_three,
        dynamic_sampling=True,
        refill=refill,
    )
    record = outcomes[0].record
    assert (record.launched_groups, record.rejected_groups, record.dropped_groups) == (launched, 1, dropped)
    assert [g.uid for g in outcomes[0].batch] == [1, 2]
    assert record.rejected_tokens == 20 and record.rollout_time_s == 20.0
    rejected = {s.group_uid for s in recorder["samples"] if s.reason == "filter_rejected"}
    assert rejected == {0}


def test_max_version_span_restarts_stale_partials_and_counts_their_tokens() -> None:
    # uid 0 wants 100 tokens and is aborted after 11 tokens every step.  With span <= 1, the tokens of
    # version 0 are 2 versions old at step 2, so the sample restarts from its prompt there.
    outcomes, recorder, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4, max_version_span=1).build(),
        lambda uid, i: 100 if uid == 0 else 10,
        steps=3,
        max_response_len=200,
    )
    assert [o.record.restarted_samples for o in outcomes] == [0, 0, 2]
    assert [o.record.restart_tokens for o in outcomes] == [0, 0, 44]
    sends = [r.prefix_len for r in recorder["requests"] if r.group_uid == 0 and r.sample_index == 0]
    assert sends == [0, 11, 0]


def test_max_aborts_restarts_samples_aborted_too_often() -> None:
    outcomes, _, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4, max_aborts_per_sample=1).build(),
        lambda uid, i: 100 if uid == 0 else 10,
        steps=3,
        max_response_len=200,
    )
    # Aborted at the end of steps 0 and 1 (count 2 > 1): restarted when resumed in step 2.
    assert [o.record.restarted_samples for o in outcomes] == [0, 0, 2]


@pytest.mark.parametrize("strategy", ["april", "oversample-discard"])
def test_granular_refill_still_over_provisions_the_first_wave(strategy: str) -> None:
    from april_bench.strategies import build_strategy

    outcomes, _, _ = fake_arm(
        build_strategy(f"{strategy}[over_sampling_batch_size=4]"),
        lambda uid, i: 100 if uid % 4 == 0 else 10,
        steps=1,
        refill="granular",
    )
    assert outcomes[0].record.launched_groups == 4


def test_abort_cap_counts_aborts_since_the_last_restart() -> None:
    # uid 0 never finishes within a step; with a cap of 1 it restarts every second resume, not every resume.
    outcomes, recorder, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4, max_aborts_per_sample=1).build(),
        lambda uid, i: 100 if uid == 0 else 10,
        steps=6,
        max_response_len=200,
    )
    assert [o.record.restarted_samples for o in outcomes] == [0, 0, 2, 0, 2, 0]
    sends = [r.prefix_len for r in recorder["requests"] if r.group_uid == 0 and r.sample_index == 0]
    assert sends == [0, 11, 0, 11, 0, 11]
