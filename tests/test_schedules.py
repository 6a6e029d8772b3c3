"""Exact schedules of each strategy on the deterministic fake engine.

Workload: N=2 groups of n=2, N'=4, max 64 tokens, one token per second per
request.  Every 4th prompt (uid 0, 4, 8, ...) wants 100 tokens (so it is
truncated at 64); the others stop after 10.  The expected values below were
derived by hand from the strategies' rules (see each test).
"""

from __future__ import annotations

from helpers import fake_arm

from april_impl import AprilStrategy
from baselines import OversampleDiscardStrategy, SyncStrategy


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


def test_sync_waits_for_the_longest_group() -> None:
    outcomes, _, _ = fake_arm(SyncStrategy.Config().build(), long_every_fourth, steps=4)
    # Step 0: uid 1 stops at t=10, uid 0 is truncated at t=64: 2*64 + 2*10 tokens.
    assert _steps(outcomes) == [
        (64.0, 148, [1, 0], 0, 0),
        (10.0, 40, [2, 3], 0, 0),
        (64.0, 148, [5, 4], 0, 0),
        (10.0, 40, [6, 7], 0, 0),
    ]


def test_oversample_discard_throws_away_what_is_left() -> None:
    outcomes, recorder, _ = fake_arm(
        OversampleDiscardStrategy.Config(over_sampling_batch_size=4).build(), long_every_fourth, steps=2
    )
    # 4 groups launched; 1, 2, 3 stop at t=10, 1 and 2 are accepted; the abort lets uid 0 finish the
    # token in flight (11 tokens each, back at t=11); uid 3 (finished surplus) and uid 0 are dropped.
    assert _steps(outcomes) == [(11.0, 82, [1, 2], 0, 2), (11.0, 82, [5, 6], 0, 2)]
    dropped = [(s.group_uid, s.reason, s.response_len) for s in recorder["samples"] if s.fate == "dropped"]
    assert dropped[:4] == [
        (0, "unfinished_discarded", 11),
        (0, "unfinished_discarded", 11),
        (3, "surplus_discarded", 10),
        (3, "surplus_discarded", 10),
    ]


def test_april_recycles_partials_first_and_finishes_them_later() -> None:
    outcomes, recorder, loop = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4).build(), long_every_fourth, steps=4
    )
    assert _steps(outcomes) == [
        (11.0, 82, [1, 2], 2, 0),  # buffer [0 (11 tok), 3 (finished)]
        (11.0, 64, [3, 5], 2, 0),  # 3 accepted at once; 0 resumes to 22; 4 starts (11)
        (11.0, 84, [6, 7], 2, 0),  # 0 -> 33, 4 -> 22
        (32.0, 210, [9, 0], 2, 0),  # 0 finishes its last 31 tokens (truncated at 64)
    ]
    assert [o.record.off_policy_tokens for o in outcomes] == [0, 20, 0, 66]
    assert [o.record.resumed_groups for o in outcomes] == [0, 2, 2, 2]
    # uid 0, sample 0 was sent four times, each time with the remaining budget.
    sends = [
        (r.prefix_len, r.max_new_tokens, r.output_len, r.finish_reason, r.policy_version)
        for r in recorder["requests"]
        if r.group_uid == 0 and r.sample_index == 0
    ]
    assert sends == [
        (0, 64, 11, "abort", 0),
        (11, 53, 11, "abort", 1),
        (22, 42, 11, "abort", 2),
        (33, 31, 31, "length", 3),
    ]
    trained0 = next(s for s in recorder["samples"] if s.group_uid == 0 and s.fate == "trained")
    assert trained0.version_runs == [[0, 11], [1, 11], [2, 11], [3, 31]]
    assert trained0.off_policy_tokens == 33 and trained0.abort_count == 3
    assert [g.uid for g in loop.buffer] == [4, 8]


def test_april_conserves_every_token_and_prompt() -> None:
    _, recorder, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4).build(), long_every_fourth, steps=4
    )
    m = recorder.summary(baseline="april")["april"]
    assert m["generated_tokens"] == 440
    assert m["trained_tokens"] == 268 and m["buffered_tokens_at_end"] == 172 and m["wasted_tokens"] == 0
    assert m["prompts"] == {"launched": 10, "trained": 8, "dropped": 0, "buffered": 2, "inconsistent": 0}
