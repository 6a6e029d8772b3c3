"""Exact schedules of the strategy zoo on the deterministic fake engine.

Same setting as ``test_schedules.py``: N=2 groups of n=2, N'=4 unless a test says otherwise, max 64
tokens, one token per second per request, an abort lets the token in flight finish.  Every 4th prompt
(uid 0, 4, 8, ...) wants 100 tokens (truncated at 64); the others stop after 10.  Expected values are
derived by hand from each strategy's rules (see the comments).
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import fake_arm

from april_bench.config import ConfigError
from april_bench.rollout.strategy import Candidate, GroupProgress, RefillMode, RolloutView
from april_bench.strategies import build_strategy
from april_impl import AdaptiveAprilStrategy, AprilStrategy, LengthAwareStrategy, SegmentRolloutStrategy
from april_impl.adaptive import next_over_sampling
from baselines import SyncStrategy, TailBatchingStrategy


def long_every_fourth(uid: int, index: int) -> int:
    return 100 if uid % 4 == 0 else 10


def _steps(outcomes):  # (rollout time, generated, accepted uids, buffered, dropped)
    return [
        (
            o.record.rollout_time_s,
            o.record.generated_tokens,
            [g.uid for g in o.batch],
            o.record.buffered_groups,
            o.record.dropped_groups,
        )
        for o in outcomes
    ]


# ---------------------------------------------------------------- APRIL with N' = N is sync


def test_april_with_n_prime_equal_to_n_reproduces_sync_exactly() -> None:
    def record(o):
        row = dataclasses.asdict(o.record)
        row.pop("arm"), row.pop("bookkeeping_s")
        return row

    sync, sync_rec, _ = fake_arm(SyncStrategy.Config().build(), long_every_fourth, steps=4)
    april, april_rec, loop = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=2).build(), long_every_fourth, steps=4
    )
    assert [record(o) for o in april] == [record(o) for o in sync]
    assert [[g.uid for g in o.batch] for o in april] == [[g.uid for g in o.batch] for o in sync]
    strip = ("arm", "request_id")
    assert [
        {k: v for k, v in dataclasses.asdict(r).items() if k not in strip} for r in april_rec["requests"]
    ] == [{k: v for k, v in dataclasses.asdict(r).items() if k not in strip} for r in sync_rec["requests"]]
    assert len(loop.buffer) == 0


# ---------------------------------------------------------------- tail batching (RollPacker)


def test_tail_batching_defers_the_stragglers_to_a_tail_step_and_reruns_them_in_full() -> None:
    strategy = TailBatchingStrategy.Config(over_sampling_batch_size=4).build()
    outcomes, recorder, loop = fake_arm(strategy, long_every_fourth, steps=4)
    # Step 0 (short): fresh 0..3; 1, 2 accepted at t=10; 0 aborted with 11 tokens, 3 finished surplus:
    #   the queue holds N=2 groups, so step 1 is a tail step.
    # Step 1 (tail): exactly 0 and 3, re-run from their prompts (4 restarts, 2*11 + 2*10 tokens
    #   discarded); 3 at t=10, 0 truncated at t=64; nothing fresh launches.
    # Steps 2 and 3 repeat the pattern with 4..7.
    assert _steps(outcomes) == [
        (11.0, 82, [1, 2], 2, 0),
        (64.0, 148, [3, 0], 0, 0),
        (11.0, 82, [5, 6], 2, 0),
        (64.0, 148, [7, 4], 0, 0),
    ]
    assert [(o.record.restarted_samples, o.record.restart_tokens) for o in outcomes] == [
        (0, 0),
        (4, 42),
        (0, 0),
        (4, 42),
    ]
    assert [o.record.new_prompts for o in outcomes] == [4, 0, 4, 0]
    assert [o.record.off_policy_tokens for o in outcomes] == [0, 0, 0, 0]  # re-run in full: on-policy
    assert len(loop.buffer) == 0
    m = recorder.summary(baseline="tail-batching")["tail-batching"]
    assert m["generated_tokens"] == m["trained_tokens"] + m["wasted_tokens"] + m["buffered_tokens_at_end"]
    assert m["wasted_tokens"] == 84 and m["prompts"]["inconsistent"] == 0


def test_tail_batching_can_resume_partials_in_the_tail_step() -> None:
    strategy = TailBatchingStrategy.Config(over_sampling_batch_size=4, resume_partial=True).build()
    outcomes, _, _ = fake_arm(strategy, long_every_fourth, steps=2)
    # Step 1: 3 is accepted at once (finished at version 0: 20 old tokens); 0 continues from 11
    # tokens (22 old) with 53 left: t=53.
    assert _steps(outcomes)[1] == (53.0, 106, [3, 0], 0, 0)
    assert outcomes[1].record.off_policy_tokens == 42 and outcomes[1].record.restarted_samples == 0


def test_tail_batching_runs_a_short_queue_after_max_wait_steps() -> None:
    def run(max_wait_steps: int):
        strategy = TailBatchingStrategy.Config(
            over_sampling_batch_size=3, max_wait_steps=max_wait_steps
        ).build()
        return fake_arm(strategy, long_every_fourth, steps=3)

    # N'=3.  Step 0: 0, 1, 2 launch; 1 and 2 accepted at t=10; only 0 is queued (1 < N).
    # Waiting up to 4 steps: step 1 is short (3, 4, 5; 4 queued), step 2 is the tail step (0, 4).
    outcomes, _, _ = run(4)
    assert [[g.uid for g in o.batch] for o in outcomes] == [[1, 2], [3, 5], [0, 4]]
    assert outcomes[2].record.rollout_time_s == 64.0
    # Waiting 1 step: step 1 is a tail step of the queue (0) topped up with fresh prompt 3.
    outcomes, _, loop = run(1)
    assert [[g.uid for g in o.batch] for o in outcomes] == [[1, 2], [3, 0], [5, 6]]
    assert [o.record.new_prompts for o in outcomes] == [3, 1, 3]
    assert [g.uid for g in loop.buffer] == [4]


def test_tail_batching_state_survives_a_restore() -> None:
    strategy = TailBatchingStrategy.Config(over_sampling_batch_size=3).build()
    fake_arm(strategy, long_every_fourth, steps=2)  # two short steps, queue [0, 4]
    assert strategy.state() == {"steps_since_tail": 2}
    fresh = TailBatchingStrategy.Config(over_sampling_batch_size=3).build()
    fresh.restore(strategy.state())
    assert fresh.state() == strategy.state()


# ---------------------------------------------------------------- segment rollout (UloRL)


def test_segment_rollout_pauses_responses_at_the_segment_and_resumes_them_next_step() -> None:
    def lengths(uid: int, index: int) -> int:
        return {1: 5, 2: 20}.get(uid % 4, 30)

    strategy = SegmentRolloutStrategy.Config(segment_len=8).build()
    outcomes, recorder, loop = fake_arm(strategy, lengths, steps=2)
    # Step 0 (wave 4): 1 ends at t=5; 0, 2, 3 pause at their 8-token segment at t=8 while the step
    # goes on, so 4..7 launch at t=8; 5 ends at t=13 (N reached); 4, 6, 7 aborted with 6 tokens.
    # Step 1: 0, 2, 3, 4 resume for one segment each (pause at t=8); 6..9 (9 ends at t=13) pause at
    # t=16; 10..13 (13 ends at t=21; 10..12 aborted with 6 at t=22).
    assert [(o.record.rollout_time_s, o.record.generated_tokens) for o in outcomes] == [
        (14.0, 104),
        (22.0, 168),
    ]
    assert [[g.uid for g in o.batch] for o in outcomes] == [[1, 5], [9, 13]]
    segments = {r.output_len for r in recorder["requests"] if r.finish_reason == "length"}
    assert segments == {8}
    assert all(s.response_len <= 16 for g in loop.buffer for s in g.samples)


def test_segment_rollout_keeps_aprils_staleness_cap() -> None:
    with pytest.raises(ConfigError, match="segment_len"):
        SegmentRolloutStrategy.Config(segment_len=0)
    strategy = build_strategy("segment[segment_len=32,max_version_span=1]")
    assert isinstance(strategy, SegmentRolloutStrategy)
    outcomes, recorder, _ = fake_arm(strategy, lambda uid, i: {1: 5, 2: 40}.get(uid % 4, 100), steps=4)
    # 40- and 64-token responses need two segments (two versions); one aborted mid-segment needs a
    # third version and restarts instead when it would resume a segment two versions old.
    trained = [s for s in recorder["samples"] if s.fate == "trained"]
    assert trained and all(s.train_version - s.version_runs[0][0] <= 1 for s in trained)
    assert sum(o.record.restarted_samples for o in outcomes) > 0


def test_segment_rollout_refuses_a_bound_no_response_can_meet() -> None:
    # 64 tokens in segments of 8 take 8 versions; a span of 1 would restart them forever
    with pytest.raises(ConfigError, match="raise segment_len to 32 or max_version_span to 7"):
        fake_arm(build_strategy("segment[segment_len=8,max_version_span=1]"), long_every_fourth, steps=1)


# ---------------------------------------------------------------- adaptive over-provisioning


def test_adaptive_rule_grows_on_a_long_tail_and_shrinks_when_the_tail_is_short() -> None:
    config = AdaptiveAprilStrategy.Config(min_ratio=1.0, max_ratio=3.0)
    assert next_over_sampling(8, 4, (1.0, 2.0, 3.0, 10.0), config) == 10  # 10 > 2 x 2: x1.25
    assert next_over_sampling(8, 4, (1.0, 2.0, 2.0, 2.2), config) == 6  # 2.2 < 1.25 x 2: /1.25
    assert next_over_sampling(8, 4, (1.0, 2.0, 3.0, 3.0), config) == 8  # in between: unchanged
    assert next_over_sampling(11, 4, (1.0, 1.0, 9.0, 9.0), config) == 12  # capped at 3 x N
    assert next_over_sampling(4, 4, (5.0, 5.0), config) == 4  # never below N
    assert next_over_sampling(8, 4, (0.0, 0.0, 0.0, 9.0), config) == 6  # mostly finished surplus
    assert next_over_sampling(8, 4, (3.0,), config) == 8  # one completion says nothing


def test_adaptive_schedule_follows_its_completion_times() -> None:
    strategy = AdaptiveAprilStrategy.Config(over_sampling_batch_size=4).build()
    outcomes, _, _ = fake_arm(strategy, long_every_fourth, steps=2)
    # Step 0 with N'=4: APRIL's step 0 (1, 2 at t=10): the last came right behind the median, N' -> 3.
    # Step 1 with N'=3: 0 (11 tokens), 3 (finished, accepted at t=0) and fresh 4 launch; no refill
    # (1 accepted + 2 in flight = N); 0 is truncated at t=53, 4 aborted with 54 tokens.
    assert _steps(outcomes) == [(11.0, 82, [1, 2], 2, 0), (54.0, 214, [3, 0], 1, 0)]
    assert strategy.state() == {"over_sampling": 2}  # t_median = 0 (finished surplus): shrink to N
    restored = AdaptiveAprilStrategy.Config().build()
    restored.restore(strategy.state())
    assert restored.over_sampling == 2


# ---------------------------------------------------------------- length-aware scheduling


def _candidate(uid: int, longest: int, fresh: bool = False) -> Candidate:
    progress = GroupProgress(
        uid=uid,
        source_id=str(uid),
        prompt_len=10,
        samples=2,
        finished_samples=0,
        tokens=2 * longest,
        longest=longest,
        oldest_version=None if fresh else 0,
        newest_version=None if fresh else 0,
        aborts=0 if fresh else 1,
        first_step=None if fresh else 0,
    )
    return Candidate(progress, fresh=fresh)


_VIEW = RolloutView(
    step=1,
    policy_version=1,
    target_groups=2,
    over_sampling=4,
    accepted=0,
    in_flight=0,
    buffered=3,
    rejected=0,
    launched=0,
    refill=RefillMode.WAVE,
)


@pytest.mark.parametrize(
    ("order", "expected", "priorities"),
    [
        ("longest_first", [2, 3, 1, 9], [-50, -50, -5, 0]),
        ("shortest_first", [1, 2, 3, 9], [5, 50, 50, 0]),
        ("fifo", [1, 2, 3, 9], [0, 0, 0, 0]),
    ],
)
def test_length_aware_orders_buffered_groups_by_what_they_hold(
    order: str, expected: list[int], priorities: list[int]
) -> None:
    strategy = LengthAwareStrategy.Config(order=order).build()
    candidates = [_candidate(1, 5), _candidate(2, 50), _candidate(3, 50), _candidate(9, 0, fresh=True)]
    chosen = strategy.select(candidates, 4, _VIEW)
    assert [c.uid for c in chosen] == expected  # ties keep their FIFO order; fresh prompts come last
    assert [strategy.priority(c.progress, _VIEW) for c in chosen] == priorities
    assert [c.uid for c in strategy.select(candidates, 2, _VIEW)] == expected[:2]


def test_length_aware_aborts_only_the_longest_share_and_lets_the_rest_finish() -> None:
    def lengths(uid: int, index: int) -> int:
        return {0: 100, 3: 15}.get(uid % 4, 10)

    strategy = LengthAwareStrategy.Config(over_sampling_batch_size=4, abort_share=0.5).build()
    outcomes, _, loop = fake_arm(strategy, lengths, steps=1)
    # 1 and 2 are accepted at t=10; 0 and 3 are in flight, equally long-running: ceil(0.5 x 2) = 1 is
    # aborted, the earlier launched (0, 11 tokens); 3 runs on to its 15th token at t=15, buffered finished.
    record = outcomes[0].record
    assert (record.rollout_time_s, record.drain_time_s, record.generated_tokens) == (15.0, 5.0, 92)
    assert (record.abort_rounds, record.aborted_requests) == (1, 2)
    assert [(g.uid, g.is_finished) for g in loop.buffer] == [(0, False), (3, True)]


def test_length_aware_with_abort_all_and_fifo_is_april() -> None:
    april, _, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4).build(), long_every_fourth, steps=4
    )
    fifo, _, _ = fake_arm(
        LengthAwareStrategy.Config(over_sampling_batch_size=4, order="fifo").build(),
        long_every_fourth,
        steps=4,
    )
    assert _steps(fifo) == _steps(april)
    with pytest.raises(ConfigError, match="order must be one of"):
        LengthAwareStrategy.Config(order="random")
    with pytest.raises(ConfigError, match="abort_share"):
        LengthAwareStrategy.Config(abort_share=0.0)
