"""Multi-turn episodes, exactly, on the fake engine and the scripted environment.

The fake engine emits one token per second per request; the scripted environment waits each turn's
latency on the same (virtual) clock.  Workload: N=2 groups of n=2, N'=4, max 64 tokens.  Every 4th
prompt (uid 0, 4, 8, ...) is a long episode of 4 turns of 5 tokens with 2.5 s tool calls answering 2
observation tokens; the others are 2 turns of 3 tokens with 1 s calls.  A turn's call that ends the
episode answers no observation.  The expected values are derived by hand in each test.
"""

from __future__ import annotations

import asyncio
from typing import Any

from april_bench.engines.fake import FakeEngine
from april_bench.engines.protocol import WeightUpdate
from april_bench.envs import EpisodeWorkload
from april_bench.envs.scripted import ScriptedEpisodes, Turn
from april_bench.results.recorder import RunRecorder
from april_bench.results.records import Fate
from april_bench.rollout.driver import Pipeline, StepDone
from april_bench.rollout.loop import RolloutConfig, RolloutLoop, StepOutcome
from april_bench.rollout.state import group_from_dict, group_to_dict
from april_bench.strategies import ArmSpec, build_strategy
from april_bench.trainers.protocol import TrainResult
from april_bench.types import Group
from april_bench.vtime import run_virtual


def turns(uid: int, index: int) -> list[Turn]:
    return [(5, 2.5, 2)] * 4 if uid % 4 == 0 else [(3, 1.0, 2)] * 2


SETTINGS: dict[str, Any] = {
    "rollout_batch_size": 2,
    "n_samples_per_prompt": 2,
    "over_sampling_batch_size": 4,
    "max_response_len": 64,
    "replay_lengths": True,
}


def _loop(
    arm: str, fake: FakeEngine, workload: ScriptedEpisodes, recorder: RunRecorder, **rollout: Any
) -> RolloutLoop:
    spec = ArmSpec.parse(arm)
    return RolloutConfig(**{**SETTINGS, **rollout}).build(
        arm=spec.label,
        engine=fake,
        strategy=build_strategy(spec),
        workload=workload,
        prompts=workload.prompt_stream(),
        recorder=recorder,
    )


def episode_arm(
    arm: str, *, steps: int, state: dict[str, Any] | None = None
) -> tuple[list[StepOutcome], RunRecorder, RolloutLoop, ScriptedEpisodes]:
    """``steps`` steps of one arm (sync driver); ``state``: continue a loop saved after some steps."""
    fake = FakeEngine.Config().build()
    workload = ScriptedEpisodes(turns)
    recorder = RunRecorder()
    outcomes: list[StepOutcome] = []
    first = 0 if state is None else state["step"]

    async def main() -> RolloutLoop:
        await fake.start()
        loop = _loop(arm, fake, workload, recorder)
        if state is not None:
            loop.restore(state["loop"])
            await fake.update_weights(WeightUpdate(first))
        for step in range(first, steps):
            outcome = await loop.run_step(step, step)
            recorder.add(outcome.record)
            recorder.sample_fates(
                loop.arm, outcome.batch, step=step, fate=Fate.TRAINED, reason="accepted", train_version=step
            )
            outcomes.append(outcome)
            await fake.update_weights(WeightUpdate(step + 1))
        recorder.sample_fates(loop.arm, list(loop.buffer), step=steps, fate=Fate.BUFFERED, reason="end")
        return loop

    loop = run_virtual(main())
    return outcomes, recorder, loop, workload


def _steps(outcomes: list[StepOutcome]) -> list[tuple[Any, ...]]:
    # (rollout time, generated, accepted uids, buffered, env calls, env seconds, observation tokens)
    return [
        (
            o.record.rollout_time_s,
            o.record.generated_tokens,
            [g.uid for g in o.batch],
            o.record.buffered_groups,
            o.record.env_calls,
            o.record.env_time_s,
            o.record.observation_tokens,
        )
        for o in outcomes
    ]


def test_the_scripted_workload_is_an_episode_workload() -> None:
    assert isinstance(ScriptedEpisodes(turns), EpisodeWorkload)


def test_sync_waits_for_the_slowest_episode() -> None:
    outcomes, recorder, _, _ = episode_arm("sync", steps=2)
    # Step 0, uid 1 (short): turn 0-3, call 3-4, turn 4-7, call 7-8: done at 8, 6 tokens a sample.
    # uid 0 (long): turns of 5 tokens and 2.5 s calls, 4 times: done at 30; 20 tokens a sample.
    # Calls: 2 x 4 + 2 x 2 = 12, seconds 2 x 4 x 2.5 + 4 x 1 = 24; observations: 2 x 3 x 2 + 2 x 2 = 16.
    assert _steps(outcomes) == [
        (30.0, 52, [1, 0], 0, 12, 24.0, 16),
        (8.0, 24, [2, 3], 0, 8, 8.0, 8),
    ]
    long = next(s for s in recorder["samples"] if s.group_uid == 0 and s.sample_index == 0)
    assert long.response_len == 26 and long.observation_tokens == 6 and long.version_runs == [[0, 26]]
    assert long.episode == {
        "turns": 4,
        "env_calls": 4,
        "env_time_s": 10.0,
        "request_time_s": 20.0,
        "generated_tokens": 20,
        "steps": [0],
        "env_state": {"uid": 0, "sample": 0, "turn": 4, "done_len": 26},
    }
    # the turns of uid 1 sample 0: each request continues the episode after the observation
    sends = [
        (r.prefix_len, r.max_new_tokens, r.output_len, r.finish_reason)
        for r in recorder["requests"]
        if (r.group_uid, r.sample_index) == (1, 0)
    ]
    assert sends == [(0, 64, 3, "stop"), (5, 59, 3, "stop")]


def test_the_summary_reports_per_episode_figures() -> None:
    _, recorder, _, _ = episode_arm("sync", steps=2)
    # trained: 2 long episodes (4 turns, 20 generated, 6 observed, 10 s of calls, 20 s of requests) and
    # 6 short ones (2 turns, 6, 2, 2 s, 6 s)
    assert recorder.summary(baseline="sync")["sync"]["episodes"] == {
        "episodes": 8,
        "turns_per_episode": 20 / 8,
        "generated_tokens_per_turn": 76 / 20,
        "observation_tokens_per_turn": 24 / 20,
        "env_time_share": 32 / (32 + 76),
        "env_calls_per_step": 10.0,
        "resumed_across_versions": 0,
        "resumed_across_versions_share": 0.0,
    }


def test_observations_are_masked_and_keep_the_episode_state_through_the_buffer() -> None:
    outcomes, _, loop, _ = episode_arm("april", steps=1)
    partial = next(g for g in loop.buffer if g.uid == 0)
    sample = partial.samples[0]
    # uid 0 at the stop (t=8): turn 1 (0-5), call (5-7.5), 1 token of turn 2 (7.5-8.5, the abort's)
    assert [(s.num_tokens, s.observation) for s in sample.segments] == [(5, False), (2, True), (1, False)]
    assert sample.loss_mask == [1] * 5 + [0] * 2 + [1]
    assert sample.env_state == {"uid": 0, "sample": 0, "turn": 1, "done_len": 7}
    assert len(sample.response_logprobs()) == len(sample.token_versions()) == sample.response_len == 8
    again = group_from_dict(group_to_dict(partial), loop.prompts.make)
    assert again.samples[0].segments == sample.segments and again.samples[0].env_state == sample.env_state
    assert again.samples[0].loss_mask == sample.loss_mask and again.samples[0].env_calls == 1
    # accepted groups: observation tokens are in the response, masked, and not counted as trained
    assert outcomes[0].record.trained_tokens == 24


def test_april_resumes_episodes_across_steps_with_their_state() -> None:
    outcomes, recorder, _, workload = episode_arm("april", steps=4)
    # Step 0: uids 0-3 launch at 0.  1, 2, 3 finish at 8 (3 + 1 + 3 + 1); two are accepted, and the
    # abort lets uid 0 (turn 2 began at 7.5) finish its token in flight at 8.5.  Generated: 3 x 12
    # + 2 x (5 + 1) = 48; calls: 12 short + 2 long (17 s); observations 12 + 4.
    # Step 1: buffered 0 and 2 first (2 finished: accepted at once), 4 and 5 fresh.  5 is done at 8;
    # uid 0 finishes turn 2 (4 tokens, 0-4), calls (4-6.5), turn 3 runs 6.5-8.5 (2 tokens).  Step 2:
    # turn 3's last 3 tokens (0-3), call (3-5.5), turn 4 runs 5.5-8.5 (3); step 3: its last 2.
    assert _steps(outcomes) == [
        (8.5, 48, [3, 1], 2, 14, 17.0, 16),
        (8.5, 36, [2, 5], 2, 8, 14.0, 12),
        (8.5, 48, [6, 7], 2, 12, 18.0, 16),
        (8.5, 40, [0, 9], 2, 10, 19.0, 12),
    ]
    sends = [
        (r.step, r.prefix_len, r.max_new_tokens, r.output_len, r.finish_reason, r.policy_version)
        for r in recorder["requests"]
        if (r.group_uid, r.sample_index) == (0, 0)
    ]
    # each turn resumes from the whole episode (prompt + turns + observations) with its version
    assert sends == [
        (0, 0, 64, 5, "stop", 0),
        (0, 7, 57, 1, "abort", 0),
        (1, 8, 56, 4, "stop", 1),
        (1, 14, 50, 2, "abort", 1),
        (2, 16, 48, 3, "stop", 2),
        (2, 21, 43, 3, "abort", 2),
        (3, 24, 40, 2, "stop", 3),
    ]
    trained = next(
        s for s in recorder["samples"] if (s.group_uid, s.sample_index) == (0, 0) and s.fate == "trained"
    )
    assert trained.episode is not None and trained.episode["steps"] == [0, 1, 2, 3]
    assert trained.episode["env_state"] == {"uid": 0, "sample": 0, "turn": 4, "done_len": 26}
    assert trained.version_runs == [[0, 8], [1, 8], [2, 8], [3, 2]]
    figures = recorder.summary(baseline="april")["april"]["episodes"]
    assert figures["resumed_across_versions"] == 2  # uid 0's two samples
    # off-policy: generated tokens of versions 0-2 (5+1, 4+2, 3+3), observations excluded
    assert trained.off_policy_tokens == 18
    # every episode's calls happened exactly once, in order, though its turns spanned steps
    for uid in {c[0] for c in workload.environment.calls}:
        for index in (0, 1):
            mine = [t for u, i, t in workload.environment.calls if (u, i) == (uid, index)]
            assert mine == list(range(len(mine)))


def test_april_conserves_every_prompt_and_generated_token() -> None:
    _, recorder, _, _ = episode_arm("april", steps=4)
    m = recorder.summary(baseline="april")["april"]
    assert m["prompts"] == {"launched": 10, "trained": 8, "dropped": 0, "buffered": 2, "inconsistent": 0}
    assert (
        m["generated_tokens"] == 172 == m["trained_tokens"] + m["buffered_tokens_at_end"] + m["wasted_tokens"]
    )
    assert m["wasted_tokens"] == 0


def test_a_call_out_at_the_stop_finishes_and_no_turn_follows() -> None:
    # oversample-discard: at the stop (t=8) uid 0 is in turn 2; it is dropped after its token in flight
    outcomes, recorder, _, _workload = episode_arm("oversample-discard", steps=1)
    assert [g.uid for g in outcomes[0].batch] == [3, 1]
    dropped = [s for s in recorder["samples"] if s.group_uid == 0]
    assert {s.fate for s in dropped} == {"dropped"} and {s.response_len for s in dropped} == {8}
    assert outcomes[0].record.dropped_tokens == 2 * 6 + 2 * 6  # uid 0 (5 + 1 each) and surplus uid 2 (3 + 3)


def test_a_stop_during_a_call_lets_it_finish_then_the_episode_waits_at_the_turn() -> None:
    # uid 0 with a 1-token turn and a 10 s call: at the stop (t=8) its call (1-11) is out; the step
    # ends when it returns (11), with the observation appended and no request for the next turn.
    def slow(uid: int, index: int) -> list[Turn]:
        return [(1, 10.0, 2), (1, 1.0, 0)] if uid == 0 else [(3, 1.0, 2)] * 2

    fake = FakeEngine.Config().build()
    workload = ScriptedEpisodes(slow)
    recorder = RunRecorder()

    async def main() -> RolloutLoop:
        await fake.start()
        loop = _loop("april", fake, workload, recorder)
        outcome = await loop.run_step(0, 0)
        assert outcome.record.rollout_time_s == 11.0 and outcome.record.drain_time_s == 3.0
        return loop

    loop = run_virtual(main())
    (waiting,) = [g for g in loop.buffer if g.uid == 0]
    assert [(s.num_tokens, s.observation) for s in waiting.samples[0].segments] == [(1, False), (2, True)]
    assert waiting.samples[0].env_state is not None and waiting.samples[0].env_state["turn"] == 1
    assert len([r for r in recorder["requests"] if r.group_uid == 0]) == 2  # one per sample


def test_resume_from_a_saved_loop_gives_the_same_rows() -> None:
    full, full_rec, _, _ = episode_arm("april", steps=4)
    _, _, half_loop, _ = episode_arm("april", steps=2)
    saved = {"step": 2, "loop": half_loop.state()}
    rest, rest_rec, _, _ = episode_arm("april", steps=4, state=saved)
    assert _steps(rest) == _steps(full[2:])
    keys = lambda rec: sorted(  # noqa: E731
        (r.step, r.group_uid, r.sample_index, r.prefix_len, r.output_len, r.finish_reason)
        for r in rec["requests"]
        if r.step >= 2
    )
    assert keys(rest_rec) == keys(full_rec)
    episodes = lambda rec: sorted(  # noqa: E731
        (s.group_uid, s.sample_index, s.fate, str(s.episode)) for s in rec["samples"] if s.step >= 2
    )
    assert episodes(rest_rec) == episodes(full_rec)


# ------------------------------------------------------------------ an async driver


class FixedTrainer:
    """Training takes ``seconds`` of the loop's clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def train(self, batch: list[Group], *, step: int, policy_version: int) -> TrainResult:
        await asyncio.sleep(self.seconds)
        return TrainResult()

    def weights(self) -> None:
        return None


def test_stale_driver_updates_weights_during_a_tool_call() -> None:
    # Two turns of 2 tokens, 1 s calls, 1 observation token: a rollout step is 2+1+2+1 = 6 s.
    # R0 0-6 (version 0).  T0 6-8.5, push 1 8.5-9.5.  R1 starts at 6 (eta 1): turn 6-8, call 8-9,
    # turn 2 is submitted at 9 during the push and runs 9.5-11.5 on version 1, call 11.5-12.5.
    # T1 12.5-15, push 2 15-16; R2 12.5: turn 12.5-14.5, call 14.5-15.5, turn 16-18 (v2), call 18-19.
    spec = ArmSpec.parse("april[driver=stale,max_staleness=1]")
    fake = FakeEngine.Config(weight_sync_s=1.0).build()
    workload = ScriptedEpisodes(lambda uid, i: [(2, 1.0, 1)] * 2)
    recorder = RunRecorder()
    done: list[StepDone] = []

    async def main() -> None:
        await fake.start()
        loop = _loop(spec.label, fake, workload, recorder, over_sampling_batch_size=2)

        async def push(version: int) -> None:
            await fake.update_weights(WeightUpdate(version))

        async def on_step(d: StepDone) -> None:
            done.append(d)

        pipeline: Pipeline = spec.driver.build(
            rollout=loop, trainer=FixedTrainer(2.5), push=push, total_steps=3, partial_rollout=True
        )
        await pipeline.run(range(3), on_step)

    run_virtual(main())
    phases = [
        (d.rollout_start, d.rollout_end, d.train_start, d.train_end, d.sync_start, d.sync_end) for d in done
    ]
    assert phases == [(0, 6, 6, 8.5, 8.5, 9.5), (6, 12.5, 12.5, 15, 15, 16), (12.5, 19, 19, 21.5, 21.5, 22.5)]
    runs = [{tuple(s.version_runs()) for g in d.outcome.batch for s in g.samples} for d in done]
    # turn 1 and its observation on the old version, turn 2 on the new: every token keeps its version
    assert runs == [{((0, 5),)}, {((0, 3), (1, 2))}, {((1, 3), (2, 2))}]


def test_cancel_at_the_stop_ends_the_step_at_once_and_repeats_the_call_on_resume() -> None:
    # As above, with env_calls_at_stop=cancel: at t=8 uid 0's calls (1-11) are cancelled, so the step
    # ends at 8 with no drain; the episode keeps its unanswered turn.  Step 1 makes the call again
    # (0-10) but N groups are in at 8 again: a call longer than a step is cancelled every step and the
    # episode never advances - the price of cancelling (docs/agents.md).
    def slow(uid: int, index: int) -> list[Turn]:
        return [(1, 10.0, 2), (1, 1.0, 0)] if uid == 0 else [(3, 1.0, 2)] * 2

    fake = FakeEngine.Config().build()
    workload = ScriptedEpisodes(slow)
    recorder = RunRecorder()

    async def main() -> tuple[RolloutLoop, list[StepOutcome]]:
        await fake.start()
        loop = _loop("april", fake, workload, recorder, env_calls_at_stop="cancel")
        return loop, [await loop.run_step(step, step) for step in range(3)]

    loop, outcomes = run_virtual(main())
    assert [(o.record.rollout_time_s, o.record.drain_time_s, o.record.env_cancelled) for o in outcomes] == [
        (8.0, 0.0, 2),
        (8.0, 0.0, 2),
        (8.0, 0.0, 2),
    ]
    (waiting,) = [g for g in loop.buffer if g.uid == 0]
    for sample in waiting.samples:
        assert [(s.num_tokens, s.observation) for s in sample.segments] == [(1, False)]
        assert sample.env_state is not None and sample.env_state["turn"] == 0 and sample.env_calls == 0
    assert all(uid != 0 for uid, _, _ in workload.environment.calls)  # no call of uid 0 ever answered
    # one request per sample: the resumed episode re-made its call instead of generating
    assert len([r for r in recorder["requests"] if r.group_uid == 0]) == 2


def test_cancel_resumes_a_short_call_on_the_next_step() -> None:
    # uid 0: 1 token, a 7.5 s call (1-8.5) out at the stop (8): cancelled.  Step 1 makes it again
    # (0-7.5); N groups are in at 8, so turn 2 (from 7.5) is aborted after its token in flight (8.5)
    # and its last 2 tokens run in step 2.
    def medium(uid: int, index: int) -> list[Turn]:
        return [(1, 7.5, 2), (3, 0.5, 0)] if uid == 0 else [(3, 1.0, 2)] * 2

    fake = FakeEngine.Config().build()
    workload = ScriptedEpisodes(medium)
    recorder = RunRecorder()

    async def main() -> list[StepOutcome]:
        await fake.start()
        loop = _loop("april", fake, workload, recorder, env_calls_at_stop="cancel")
        return [await loop.run_step(step, step) for step in range(3)]

    outcomes = run_virtual(main())
    assert outcomes[0].record.env_cancelled == 2 and outcomes[1].record.env_cancelled == 0
    sends = [
        (r.step, r.prefix_len, r.output_len, r.finish_reason)
        for r in recorder["requests"]
        if (r.group_uid, r.sample_index) == (0, 0)
    ]
    assert sends == [(0, 0, 1, "stop"), (1, 3, 1, "abort"), (2, 4, 2, "stop")]
    assert [(u, t) for u, i, t in workload.environment.calls if (u, i) == (0, 0)] == [(0, 0), (0, 1)]
