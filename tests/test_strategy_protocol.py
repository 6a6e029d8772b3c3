"""The wider strategy protocol, on the fake engine: which groups launch, segment budgets, priorities,
selective abort mid-step and at the stop, and the step summary.

Each test defines the smallest strategy that uses one question of the protocol and checks the
schedule it produces, derived by hand (one token per second per request; N=2 groups of n=2).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from helpers import fake_arm

from april_bench.rollout.strategy import (
    BaseStrategy,
    Candidate,
    Disposition,
    GroupProgress,
    RolloutView,
    StepSummary,
    wave_refill,
)
from april_bench.types import Group, Sample


class _Buffering(BaseStrategy):
    """APRIL's rules (waves of N', buffer leftovers); subclasses change one answer."""

    name = "test"
    wave: int | None = None  # None: N'

    def launch_count(self, view: RolloutView) -> int:
        return wave_refill(view, self.wave or view.over_sampling)

    def on_leftover(self, group: Group, view: RolloutView) -> Disposition:
        return Disposition.BUFFER


def long_every_fourth(uid: int, index: int) -> int:
    return 100 if uid % 4 == 0 else 10


def test_select_can_hold_buffered_groups_back_and_unpicked_prompts_come_first_next_time() -> None:
    class HoldBack(_Buffering):
        def select(self, candidates: Sequence[Candidate], count: int, view: RolloutView) -> list[Candidate]:
            allowed = [c for c in candidates if c.fresh or c.uid % 4 != 0]  # long buffered groups wait
            return allowed[:count]

    outcomes, _, loop = fake_arm(HoldBack(), long_every_fourth, steps=3)
    # Step 0 is APRIL's: 0..3 launched, 1 and 2 accepted at t=10, buffer [0 (11 tokens), 3 (done)].
    # Step 1: candidates 0, 3 (buffered) + fresh 4..7; 0 is held back, so 3, 4, 5, 6 launch (7 goes
    #   back to the stream); 3 is accepted at launch, 5 at t=10; buffer [0, 4, 6].
    # Step 2: 0 and 4 held back; 6, then 7 (given back last step, so first now), 8, 9 launch; 6 at
    #   launch, 7 at t=10; buffer [0, 4, 8, 9]; 10 was taken and given back.
    assert [[g.uid for g in o.batch] for o in outcomes] == [[1, 2], [3, 5], [6, 7]]
    assert [o.record.launched_groups for o in outcomes] == [4, 4, 4]
    assert [g.uid for g in loop.buffer] == [0, 4, 8, 9]
    assert loop.prompts.position == 11 and loop.prompts.returned_uids() == [10]
    assert [o.record.new_prompts for o in outcomes] == [4, 3, 3]


def test_a_segment_budget_pauses_responses_and_they_resume_next_step() -> None:
    class Segments(_Buffering):
        def request_budget(self, sample: Sample, remaining: int, view: RolloutView) -> int:
            return min(remaining, 8)

    def lengths(uid: int, index: int) -> int:
        return {1: 5, 2: 20}.get(uid % 4, 30)

    outcomes, recorder, loop = fake_arm(Segments(), lengths, steps=2)
    # Step 0 (wave 4): 1 ends at t=5; 0, 2, 3 pause at their 8-token segment at t=8 and come back
    # while the step goes on, so a second wave (4..7) starts at t=8; 5 ends at t=13 (N reached),
    # 4, 6, 7 are aborted holding 6 tokens (t=14).  All six unfinished groups are buffered.
    first = outcomes[0].record
    assert [g.uid for g in outcomes[0].batch] == [1, 5]
    assert (first.rollout_time_s, first.generated_tokens, first.launched_groups) == (14.0, 104, 8)
    assert (first.buffered_groups, first.partial_samples) == (6, 12)
    partial = [r for r in recorder["requests"] if r.step == 0 and r.finish_reason == "length"]
    assert sorted({r.group_uid for r in partial}) == [0, 2, 3] and {r.output_len for r in partial} == {8}
    # Step 1: 0, 2, 3, 4 resume for one more segment each and pause at t=8; then 6, 7, 8, 9 (9 ends at
    # t=13), pause at t=16; then 10..13 (13 ends at t=21, N reached; 10..12 aborted with 6 at t=22).
    second = outcomes[1].record
    assert [g.uid for g in outcomes[1].batch] == [9, 13]
    assert (second.rollout_time_s, second.generated_tokens, second.resumed_groups) == (22.0, 168, 6)
    resumed = [r for r in recorder["requests"] if r.step == 1 and r.group_uid == 0]
    assert [(r.prefix_len, r.max_new_tokens, r.output_len) for r in resumed] == [(8, 8, 8), (8, 8, 8)]
    assert all(s.response_len <= 16 for g in loop.buffer for s in g.samples)


def test_priority_reaches_every_request_of_a_group() -> None:
    from april_bench.engines.fake import FakeEngine

    seen: list[tuple[str, int]] = []
    original = FakeEngine.generate

    def spy(self: FakeEngine, requests: Sequence) -> object:
        seen.extend((r.routing_key, r.priority) for r in requests)
        return original(self, requests)

    class LongFirst(_Buffering):
        def priority(self, group: GroupProgress, view: RolloutView) -> int:
            return -group.tokens  # resumed groups holding more tokens go first

    FakeEngine.generate = spy  # type: ignore[method-assign]
    try:
        fake_arm(LongFirst(), long_every_fourth, steps=2)
    finally:
        FakeEngine.generate = original  # type: ignore[method-assign]
    # Step 0: four fresh groups (priority 0); step 1: uid 0 comes back with 2 x 11 tokens (-22),
    # uid 3 is finished (no request), fresh 4 and 5 have none.
    assert seen[:8] == [(str(u), 0) for u in (0, 0, 1, 1, 2, 2, 3, 3)]
    assert seen[8:] == [("0", -22), ("0", -22), ("4", 0), ("4", 0), ("5", 0), ("5", 0)]


def test_abort_now_cuts_a_long_group_mid_step_and_the_step_refills() -> None:
    class CutTheTail(_Buffering):
        wave = 2  # launch exactly N, as sync does

        def abort_now(self, view: RolloutView) -> Collection[int]:
            if view.accepted != view.target_groups - 1:
                return ()
            # the last group has run as long as the first N-1 took: it is the tail, cut it
            return [uid for uid, g in view.groups.items() if (g.running_for_s or 0) >= view.elapsed_s]

    outcomes, _, loop = fake_arm(CutTheTail(), long_every_fourth, steps=1)
    # 0 and 1 launch; 1 ends at t=10 and uid 0 is aborted then (11 tokens back at t=11); as a leftover
    # it leaves room for a wave of 2 (uids 2, 3) at t=11, which ends at t=21: 2 accepted, 3 surplus.
    record = outcomes[0].record
    assert [g.uid for g in outcomes[0].batch] == [1, 2]
    assert (record.rollout_time_s, record.generated_tokens, record.aborted_requests) == (21.0, 82, 2)
    assert [g.uid for g in loop.buffer] == [0, 3]


def test_stop_abort_can_let_short_stragglers_finish() -> None:
    class AbortOnlyTheLong(_Buffering):
        def stop_abort(self, view: RolloutView) -> Collection[int] | None:
            return [uid for uid in view.groups if uid % 4 == 0]

    def lengths(uid: int, index: int) -> int:
        return {0: 100, 3: 15}.get(uid % 4, 10)

    outcomes, _, loop = fake_arm(AbortOnlyTheLong(), lengths, steps=1)
    # 1 and 2 are accepted at t=10; only uid 0 is aborted (11 tokens); uid 3 runs on to its 15th
    # token at t=15 and is buffered finished.
    record = outcomes[0].record
    assert (record.rollout_time_s, record.drain_time_s, record.generated_tokens) == (15.0, 5.0, 92)
    assert (record.abort_rounds, record.aborted_requests) == (1, 2)
    assert [(g.uid, g.is_finished) for g in loop.buffer] == [(0, False), (3, True)]


def test_on_step_end_sees_when_each_accepted_group_finished() -> None:
    summaries: list[StepSummary] = []

    class Watch(_Buffering):
        def on_step_end(self, summary: StepSummary) -> None:
            summaries.append(summary)

    fake_arm(Watch(), long_every_fourth, steps=2)
    assert [(s.step, s.accepted_groups, s.completion_times_s) for s in summaries] == [
        (0, 2, (10.0, 10.0)),
        (1, 2, (0.0, 10.0)),  # step 1: uid 3 was finished when resumed, uid 5 ends at t=10
    ]
    assert [s.buffered_groups for s in summaries] == [2, 2]
