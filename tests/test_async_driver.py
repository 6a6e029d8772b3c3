"""The asynchronous drivers, exactly, on the fake engine (one token per second per request).

Each schedule is written down by hand: when every rollout step runs, when every batch trains and
when every weight push lands, and which policy version every trained token carries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from april_bench.config import ConfigError
from april_bench.engines.fake import FakeEngine
from april_bench.engines.protocol import GenerateRequest, SamplingParams, WeightUpdate
from april_bench.results.recorder import RunRecorder
from april_bench.rollout.driver import DriverConfig, Pipeline, StepDone
from april_bench.rollout.loop import RolloutConfig
from april_bench.strategies import ArmSpec, build_strategy
from april_bench.trainers.protocol import TrainResult
from april_bench.types import Group
from april_bench.vtime import run_virtual
from april_bench.workload import ScriptedWorkload


@dataclass
class FixedTrainer:
    """Training takes ``seconds`` of the loop's clock; it records (step, version, start)."""

    seconds: float
    calls: list[tuple[int, int, float]] = field(default_factory=list)

    async def train(self, batch: list[Group], *, step: int, policy_version: int) -> TrainResult:
        self.calls.append((step, policy_version, asyncio.get_running_loop().time()))
        await asyncio.sleep(self.seconds)
        return TrainResult()

    def weights(self) -> None:
        return None


@dataclass
class Run:
    done: list[StepDone]
    pushes: list[tuple[int, float, float]]  # (version, start, end)
    requests: list[Any]
    buffered: list[Group]


def run_pipeline(
    arm: str,
    length: Callable[[int, int], int],
    *,
    steps: int,
    train_s: float,
    sync_s: float = 1.0,
    **rollout: Any,
) -> Run:
    spec = ArmSpec.parse(arm)
    settings = {
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "over_sampling_batch_size": 2,
        "max_response_len": 64,
        "replay_lengths": True,
        **rollout,
    }
    config = RolloutConfig(**settings)
    fake = FakeEngine.Config(weight_sync_s=sync_s).build()
    workload = ScriptedWorkload(length)
    recorder = RunRecorder()
    strategy = build_strategy(spec)
    trainer = FixedTrainer(train_s)
    pushes: list[tuple[int, float, float]] = []
    done: list[StepDone] = []

    async def main() -> Run:
        await fake.start()
        loop = asyncio.get_running_loop()
        rollout_loop = config.build(
            arm=spec.label,
            engine=fake,
            strategy=strategy,
            workload=workload,
            prompts=workload.prompt_stream(),
            recorder=recorder,
        )

        async def push(version: int) -> None:
            start = loop.time()
            await fake.update_weights(WeightUpdate(version))
            pushes.append((version, start, loop.time()))

        async def on_step(d: StepDone) -> None:
            done.append(d)

        pipeline: Pipeline = spec.driver.build(
            rollout=rollout_loop,
            trainer=trainer,
            push=push,
            total_steps=steps,
            partial_rollout=strategy.partial_rollout,  # type: ignore[attr-defined]
        )
        await pipeline.run(range(steps), on_step)
        assert (await fake.load()).idle
        return Run(done, pushes, recorder["requests"], list(rollout_loop.buffer))

    return run_virtual(main())


def _phases(run: Run) -> list[tuple[float, ...]]:
    """Per step: (rollout start, rollout end, train start, train end, push start, push end)."""
    return [
        (d.rollout_start, d.rollout_end, d.train_start, d.train_end, d.sync_start, d.sync_end)
        for d in run.done
    ]


def _token_versions(d: StepDone) -> set[int]:
    return {v for g in d.outcome.batch for s in g.samples for v, _ in s.version_runs()}


def test_one_step_off_rolls_out_the_next_batch_while_training_and_pushes_between() -> None:
    run = run_pipeline("sync[driver=one-step-off]", lambda uid, i: 2, steps=4, train_s=5)
    # R0 0-2; T0 2-7 while R1 runs 2-4 on version 0; push 1 at 7-8; T1 8-13 while R2 8-10 on
    # version 1; push 2 13-14; T2 14-19 while R3 14-16; push 3 19-20; T3 20-25; push 4 25-26.
    assert _phases(run) == [
        (0, 2, 2, 7, 7, 8),
        (2, 4, 8, 13, 13, 14),
        (8, 10, 14, 19, 19, 20),
        (14, 16, 20, 25, 25, 26),
    ]
    assert [d.train_version for d in run.done] == [0, 1, 2, 3]
    assert [_token_versions(d) for d in run.done] == [{0}, {0}, {1}, {2}]  # one version behind
    assert [p[0] for p in run.pushes] == [1, 2, 3, 4]


def test_one_step_off_never_pushes_with_requests_in_flight() -> None:
    # rollout (6 s) slower than training (2 s): push 1 waits for R1 to come back
    run = run_pipeline("sync[driver=one-step-off]", lambda uid, i: 6, steps=3, train_s=2)
    assert _phases(run) == [
        (0, 6, 6, 8, 12, 13),  # T0 ends at 8, R1 runs 6-12: the push waits for it
        (6, 12, 13, 15, 19, 20),  # R2 starts with T1 (13) on version 1 and ends at 19
        (13, 19, 20, 22, 22, 23),
    ]
    assert all(len(s.segments) == 1 for d in run.done for g in d.outcome.batch for s in g.samples)


def test_stale_runs_ahead_by_at_most_max_staleness_versions() -> None:
    run = run_pipeline("sync[driver=stale,max_staleness=2]", lambda uid, i: 2, steps=4, train_s=5)
    # R0 0-2, R1 2-4, R2 4-6 all on version 0 (2 - 2 = 0); R3 needs version 1: it waits for push 1
    # (7-8) and runs 8-10.  Training is the bottleneck: T0 2-7, T1 8-13, T2 14-19, T3 20-25.
    assert _phases(run) == [
        (0, 2, 2, 7, 7, 8),
        (2, 4, 8, 13, 13, 14),
        (4, 6, 14, 19, 19, 20),
        (8, 10, 20, 25, 25, 26),
    ]
    assert [_token_versions(d) for d in run.done] == [{0}, {0}, {0}, {1}]
    assert max(d.train_version - min(_token_versions(d)) for d in run.done) == 2  # exactly the bound


def test_stale_with_partial_rollout_updates_weights_in_flight() -> None:
    # APRIL (N' = N here) with eta = 1: the push after T0 lands while R1's requests run; they pause
    # for the sync second and go on with the new weights, so their tokens carry two versions.
    run = run_pipeline("april[driver=stale,max_staleness=1]", lambda uid, i: 6, steps=3, train_s=2)
    assert _phases(run) == [
        (0, 6, 6, 8, 8, 9),  # R1 (6-13) runs 2 tokens, pauses 8-9 for push 1, then 4 more
        (6, 13, 13, 15, 15, 16),  # R2 (13-20) is paused 15-16 by push 2
        (13, 20, 20, 22, 22, 23),
    ]
    runs = [{tuple(s.version_runs()) for g in d.outcome.batch for s in g.samples} for d in run.done]
    assert runs == [{((0, 6),)}, {((0, 2), (1, 4))}, {((1, 2), (2, 4))}]
    assert [d.train_version for d in run.done] == [0, 1, 2]
    for d in run.done:  # every token within the bound of the version that trains it
        assert min(_token_versions(d)) >= d.train_version - 1
    r1 = [r for r in run.requests if r.step == 1]
    assert {r.policy_version for r in r1} == {1} and {r.output_len for r in r1} == {6}


def test_stale_drain_waits_for_the_rollout_in_flight_before_the_push() -> None:
    run = run_pipeline(
        "april[driver=stale,max_staleness=1,weight_update=drain]", lambda uid, i: 6, steps=2, train_s=2
    )
    assert _phases(run) == [(0, 6, 6, 8, 12, 13), (6, 12, 13, 15, 15, 16)]
    assert [_token_versions(d) for d in run.done] == [{0}, {0}]


def test_stale_restarts_a_buffered_partial_older_than_the_bound() -> None:
    # N = 2 of N' = 3 groups; group 2 is long (30 tokens) and is aborted at every stop.  With
    # eta = 1 its partial from version v may only be trained up to step v + 1: older, it restarts.
    def length(uid: int, i: int) -> int:
        return 30 if uid == 2 else 3

    run = run_pipeline(
        "april[driver=stale,max_staleness=1]",
        length,
        steps=5,
        train_s=1,
        over_sampling_batch_size=3,
    )
    for d in run.done:
        assert min(_token_versions(d)) >= d.train_version - 1
    restarted = sum(d.outcome.record.restarted_samples for d in run.done)
    assert restarted > 0
    # conservation: every launched prompt trained or still buffered (nothing dropped by APRIL)
    trained = [g.uid for d in run.done for g in d.outcome.batch]
    launched = {r.group_uid for r in run.requests}
    assert sorted(trained + [g.uid for g in run.buffered]) == sorted(launched)
    groups = [g for d in run.done for g in d.outcome.batch] + run.buffered
    kept = sum(s.response_len + s.discarded_tokens for g in groups for s in g.samples)
    assert kept == sum(r.output_len for r in run.requests)  # every generated token accounted for


def test_a_driver_option_is_checked_where_the_arm_is_read() -> None:
    with pytest.raises(ConfigError, match="driver"):
        ArmSpec.parse("april[driver=later]")
    with pytest.raises(ConfigError, match="weight_update applies to driver=stale"):
        ArmSpec.parse("sync[driver=one-step-off,weight_update=inflight]")
    spec = ArmSpec.parse("april[driver=stale,max_staleness=2,max_version_span=3]")
    assert spec.options == {"max_version_span": 3} and spec.driver.max_staleness == 2
    assert DriverConfig().asynchronous is False


# ------------------------------------------------------------- the engines' in-flight update


def _request(rid: str, n: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid,
        input_len=2,
        max_new_tokens=64,
        sampling=SamplingParams(),
        input_ids=(7, 7),
        replay_len=n,
    )


def test_fake_update_with_requests_in_flight_pauses_and_stamps_every_token() -> None:
    fake = FakeEngine.Config(weight_sync_s=2.0).build()

    async def main() -> list[Any]:
        await fake.start()
        stream = fake.generate([_request("a", 5), _request("b", 2)])
        await asyncio.sleep(3.0)  # b is done (2 s); a has 3 tokens
        await fake.update_weights(WeightUpdate(1))  # 3-5 s paused
        late = fake.generate([_request("c", 1)])  # lands after the pause: all version 1
        out = [c async for c in stream] + [c async for c in late]
        return [(c.request_id, c.t_done, c.runs()) for c in out]

    assert run_virtual(main()) == [
        ("b", 2.0, ((0, 2),)),
        ("a", 7.0, ((0, 3), (1, 2))),
        ("c", 6.0, ((1, 1),)),
    ]


def test_sim_update_with_requests_in_flight_continues_them() -> None:
    from april_bench.engines.sim.engine import SimEngine

    sim = SimEngine.Config(hardware="h100", model="qwen3-4b", num_gpus=2).build()

    async def main() -> list[Any]:
        await sim.start()
        reqs = [
            GenerateRequest(
                request_id=f"r{i}",
                input_len=100,
                max_new_tokens=4000,
                sampling=SamplingParams(),
                replay_len=3000,
            )
            for i in range(4)
        ]
        stream = sim.generate(reqs)
        await asyncio.sleep(5.0)
        await sim.update_weights(WeightUpdate(1))
        out = [c async for c in stream]
        await sim.close()
        return out

    out = run_virtual(main())
    assert len(out) == 4
    for c in out:
        runs = c.runs()
        assert [v for v, _ in runs] == [0, 1] and sum(n for _, n in runs) == c.num_tokens == 3000
        assert c.finish_reason == "stop" and c.policy_version == 1


# ----------------------------------------------------------------------------- lookahead


def test_lookahead_gates_like_stale_when_nothing_is_buffered() -> None:
    # sync-style rollout buffers nothing: steps_ahead=k opens the same gate as max_staleness=k
    stale = run_pipeline("sync[driver=stale,max_staleness=2]", lambda uid, i: 2, steps=4, train_s=5)
    ahead = run_pipeline("sync[driver=lookahead,steps_ahead=2]", lambda uid, i: 2, steps=4, train_s=5)
    assert (
        _phases(ahead)
        == _phases(stale)
        == [
            (0, 2, 2, 7, 7, 8),
            (2, 4, 8, 13, 13, 14),
            (4, 6, 14, 19, 19, 20),
            (8, 10, 20, 25, 25, 26),
        ]
    )


def test_lookahead_never_restarts_a_partial_however_old() -> None:
    # The stale test's workload (N = 2 of N' = 3; group 2 wants 30 tokens and is aborted at every
    # stop, gaining 5 tokens at step 0 and 4 a step after): eta = 1 restarts it at every step from
    # step 2 on, so it is never trained; lookahead keeps every token and trains it at step 7, with
    # tokens from versions 0 to 7 (staleness 7: the bound is on how far the sampler runs ahead).
    def length(uid: int, i: int) -> int:
        return 30 if uid == 2 else 3

    def go(arm: str) -> Run:
        return run_pipeline(arm, length, steps=10, train_s=1, over_sampling_batch_size=3)

    stale, ahead = go("april[driver=stale,max_staleness=1]"), go("april[driver=lookahead,steps_ahead=1]")
    # the same gate (the rollout of step s waits for version s - 1): the same phases until step 7,
    # where the schedules part (lookahead trains group 2 there; stale restarts it at every step)
    assert _phases(ahead)[:7] == _phases(stale)[:7]
    assert _phases(ahead)[7] != _phases(stale)[7]
    assert [d.outcome.record.restarted_samples for d in stale.done] == [0, 0] + [2] * 8
    assert 2 not in [g.uid for d in stale.done for g in d.outcome.batch]
    assert sum(d.outcome.record.restarted_samples for d in ahead.done) == 0
    step7 = ahead.done[7]
    assert [g.uid for g in step7.outcome.batch] == [2, 16]
    group2 = step7.outcome.batch[0]
    runs = [(0, 5), (1, 4), (2, 4), (3, 4), (4, 4), (5, 4), (6, 4), (7, 1)]
    assert [s.version_runs() for s in group2.samples] == [runs, runs]
    assert step7.train_version - min(_token_versions(step7)) == 7
    # every generated token is trained or still buffered: nothing discarded
    groups = [g for d in ahead.done for g in d.outcome.batch] + ahead.buffered
    assert sum(s.response_len for g in groups for s in g.samples) == sum(r.output_len for r in ahead.requests)


def test_lookahead_options_are_checked_where_the_arm_is_read() -> None:
    with pytest.raises(ConfigError, match="steps_ahead must be >= 1"):
        ArmSpec.parse("april[driver=lookahead,steps_ahead=0]")
    spec = ArmSpec.parse("april[driver=lookahead,steps_ahead=3,weight_update=drain]")
    assert spec.driver.lookahead == 3 and spec.driver.oldest_allowed(5) is None
