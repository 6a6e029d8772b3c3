"""Abort race, resume budget and token-exact resume."""

from __future__ import annotations

import asyncio

from helpers import fake_arm

from april_bench.engines.fake import FakeEngine, fake_token
from april_bench.engines.protocol import GenerateRequest, SamplingParams
from april_bench.rollout.strategy import RolloutView
from april_bench.types import SampleStatus
from april_bench.vtime import run_virtual
from april_impl import AprilStrategy


def test_a_request_landing_after_the_abort_is_aborted_again() -> None:
    # APRIL launches 4 groups at t=0; group uid 3's requests are slow in transit and land at t=12.5.
    # uids 1 and 2 finish at t=10, so the loop aborts at t=10 - before uid 3 has landed.  Without a
    # re-abort uid 3 would then run to its 64-token limit (t=76.5).  The loop re-aborts every second
    # until every request is back: at t=13 uid 3 is caught and returns its one token at t=13.5.
    outcomes, recorder, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4).build(),
        lambda uid, i: 100 if uid in (0, 3) else 10,
        steps=1,
        engine={"landing_delays": (0.0,) * 6 + (12.5, 12.5)},
        reabort_interval_s=1.0,
    )
    record = outcomes[0].record
    late = [(r.output_len, r.finish_reason, r.t_done) for r in recorder["requests"] if r.group_uid == 3]
    assert late == [(1, "abort", 13.5), (1, "abort", 13.5)]
    assert record.abort_rounds == 4  # t = 10, 11, 12 (nothing landed yet), 13
    assert record.rollout_time_s == 13.5
    assert record.buffered_groups == 2  # uid 0 and uid 3, both resumable


def test_without_late_landing_one_abort_suffices() -> None:
    outcomes, _, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4).build(),
        lambda uid, i: 100 if uid % 4 == 0 else 10,
        steps=1,
    )
    assert outcomes[0].record.abort_rounds == 1


def test_resume_budget_never_exceeds_the_limit_and_exhausted_samples_truncate() -> None:
    # Max 30 tokens; uid 0 wants 1000.  Each step it is aborted after 11 tokens, so it is resent with
    # 30, 19, 8 tokens of budget: the sum of its segments can never pass 30.
    _outcomes, recorder, _ = fake_arm(
        AprilStrategy.Config(over_sampling_batch_size=4).build(),
        lambda uid, i: 1000 if uid == 0 else 10,
        steps=4,
        max_response_len=30,
    )
    sends = [
        (r.prefix_len, r.max_new_tokens)
        for r in recorder["requests"]
        if r.group_uid == 0 and r.sample_index == 0
    ]
    assert sends == [(0, 30), (11, 19), (22, 8)]
    assert all(p + m == 30 for p, m in sends)
    trained = [s for s in recorder["samples"] if s.group_uid == 0 and s.fate == "trained"]
    assert [s.response_len for s in trained] == [30, 30] and trained[0].status == "truncated"


def test_a_sample_with_no_budget_left_truncates_without_a_request() -> None:
    strategy = AprilStrategy.Config().build()
    view = RolloutView(
        step=1,
        policy_version=1,
        target_groups=1,
        over_sampling=1,
        accepted=0,
        in_flight=0,
        buffered=1,
        rejected=0,
        launched=0,
        refill="wave",
    )  # type: ignore[arg-type]
    from april_bench.types import FinishReason, Prompt, Sample, Segment

    sample = Sample(prompt=Prompt(uid=0, source_id="p", length=2), index=0)
    sample.append(
        Segment(request_id="r", policy_version=0, num_tokens=64, finish_reason=FinishReason.ABORT, step=0)
    )
    assert strategy.keep_partial(sample, view)
    assert sample.status is SampleStatus.ABORTED
    # The loop's rule: budget = max_response_len - response_len = 0 -> TRUNCATED, no request.
    from april_bench.rollout.loop import RolloutConfig, RolloutLoop
    from april_bench.rollout.step import StepState

    class _NoEngine:
        info = FakeEngine.Config().build().info

    loop = RolloutLoop(
        RolloutConfig(max_response_len=64, rollout_batch_size=1, over_sampling_batch_size=1),
        arm="a",
        engine=_NoEngine(),
        strategy=strategy,
        workload=None,  # type: ignore[arg-type]
        prompts=None,
        recorder=None,
    )  # type: ignore[arg-type]
    state = StepState(step=1, version=1, t_start=0.0)
    assert loop._request_for(state, sample, view, priority=0) is None
    assert sample.status is SampleStatus.TRUNCATED


def test_fake_engine_resume_continues_the_same_token_sequence() -> None:
    prompt = (7, 7, 7)

    async def main() -> tuple[tuple[int, ...], tuple[int, ...]]:
        engine = FakeEngine.Config().build()
        await engine.start()
        full_req = GenerateRequest(
            "full", input_len=3, max_new_tokens=20, sampling=SamplingParams(), input_ids=prompt, replay_len=20
        )
        (full,) = [c async for c in engine.generate([full_req])]
        part_req = GenerateRequest(
            "part", input_len=3, max_new_tokens=20, sampling=SamplingParams(), input_ids=prompt, replay_len=20
        )
        stream = engine.generate([part_req])
        await asyncio.sleep(6.5)
        await engine.abort()
        (part,) = [c async for c in stream]
        assert part.finish_reason == "abort" and part.num_tokens == 7
        rest_req = GenerateRequest(
            "rest",
            input_len=3 + part.num_tokens,
            max_new_tokens=13,
            sampling=SamplingParams(),
            input_ids=prompt + part.output_ids,
            replay_len=13,
        )
        (rest,) = [c async for c in engine.generate([rest_req])]
        return full.output_ids, part.output_ids + rest.output_ids

    full, stitched = run_virtual(main())
    assert stitched == full == tuple(fake_token(7, 3 + i) for i in range(20))


def test_queued_requests_return_empty_on_abort() -> None:
    async def main() -> list[tuple[str, int, str]]:
        engine = FakeEngine.Config(max_running=1).build()
        await engine.start()
        reqs = [
            GenerateRequest(f"r{i}", input_len=1, max_new_tokens=50, sampling=SamplingParams(), replay_len=50)
            for i in range(3)
        ]
        stream = engine.generate(reqs)
        await asyncio.sleep(4.5)
        await engine.abort()
        return [(c.request_id, c.num_tokens, c.finish_reason.value) async for c in stream]

    assert run_virtual(main()) == [("r1", 0, "abort"), ("r2", 0, "abort"), ("r0", 5, "abort")]
