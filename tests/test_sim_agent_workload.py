"""The simulator's tool-episode workload (the paper's fourth row), exactly.

Base lengths come from a scripted workload (12 tokens for even uids, 6 for odd ones); the episode
shape has a mean of 2 calls, 1.5 s per call (sigma 0: every call the same) and 2 observation tokens.
The plans below are the seeded draws of :func:`plan_episode` (seed 0), written out; the schedules
are derived from them by hand on the fake engine (one token per second per request, virtual time).
"""

from __future__ import annotations

import asyncio

import pytest

from april_bench.engines.fake import FakeEngine
from april_bench.envs import EpisodeWorkload
from april_bench.experiment_config import ExperimentConfig
from april_bench.results.recorder import RunRecorder
from april_bench.rollout.loop import RolloutConfig
from april_bench.sim.agent_workload import AgentToolEpisodes, EpisodePlan, ToolShape, plan_episode
from april_bench.sim.paper_settings import AGENT_ROW
from april_bench.strategies import ArmSpec, build_strategy
from april_bench.tasks.lengths import sim_workload
from april_bench.types import Prompt
from april_bench.vtime import run_virtual
from april_bench.workload import ScriptedWorkload

SHAPE = ToolShape(calls=2, latency_s=1.5, latency_sigma=0.0, observation_tokens=2)


def length(uid: int, index: int) -> int:
    return 12 if uid % 2 == 0 else 6


def episodes(shape: ToolShape = SHAPE) -> AgentToolEpisodes:
    return AgentToolEpisodes(ScriptedWorkload(length, lambda uid, i: 1.0), shape, seed=0)


def test_plans_are_seeded_draws_cut_into_equal_turns() -> None:
    plans = {(uid, i): plan_episode(SHAPE, 0, uid, i, length(uid, i)) for uid in (0, 1) for i in (0, 1)}
    assert plans == {
        (0, 0): EpisodePlan((6, 12), (1.5,)),
        (0, 1): EpisodePlan((1, 3, 5, 6, 8, 10, 12), (1.5,) * 6),
        (1, 0): EpisodePlan((1, 3, 4, 6), (1.5,) * 3),
        (1, 1): EpisodePlan((1, 3, 4, 6), (1.5,) * 3),
    }
    # no calls: one turn; at most L - 1 calls and max_calls; the timeout cuts a call
    assert plan_episode(ToolShape(calls=0), 0, 5, 0, 40) == EpisodePlan((40,), ())
    assert len(plan_episode(ToolShape(calls=50, max_calls=16), 0, 5, 0, 4).turn_ends) == 4
    assert len(plan_episode(ToolShape(calls=50, max_calls=16), 0, 5, 0, 400).turn_ends) == 17
    capped = plan_episode(ToolShape(calls=8, latency_s=500, latency_sigma=0, timeout_s=120), 0, 1, 0, 400)
    assert set(capped.latencies) == {120.0}


def test_agent_workload_args_wrap_the_length_workload() -> None:
    args = {"agent_calls": "4", "agent_max_calls": "8", "response_median": 10}
    assert ToolShape.from_args(args) == ToolShape(calls=4.0, max_calls=8)
    assert args == {"response_median": 10}  # the length workload's own arguments stay
    assert ToolShape.from_args({"response_median": 10}) is None
    config = ExperimentConfig(
        model="r1-distill-qwen-1.5b", dataset="deepscaler", workload_args={"agent_calls": 2.0}
    )
    workload = sim_workload(config)
    assert isinstance(workload, AgentToolEpisodes) and isinstance(workload, EpisodeWorkload)
    assert workload.shape == ToolShape(calls=2.0)
    assert not isinstance(sim_workload(ExperimentConfig(model="r1-distill-qwen-1.5b")), AgentToolEpisodes)
    with pytest.raises(Exception, match="must be >= 0"):
        ToolShape(calls=-1)


def test_the_row_s_episode_arguments_are_the_shape() -> None:
    args = AGENT_ROW.workload_args(4.0, 1.0)
    assert ToolShape.from_args(dict(args)) == ToolShape(calls=4.0, latency_s=1.0)


def test_sync_waits_for_the_episode_with_the_most_calls() -> None:
    # Step 0 runs uids 0 and 1.  Finish times (tokens + calls x 1.5 s): uid 0 sample 0 12 + 1.5 = 13.5,
    # sample 1 12 + 6 x 1.5 = 21; uid 1's samples 6 + 3 x 1.5 = 10.5.  So the step takes 21 s; 36 tokens
    # generated; 13 calls answer 2 observation tokens each (26), in 19.5 s of tool time.
    workload = episodes()
    fake = FakeEngine.Config().build()
    recorder = RunRecorder()
    spec = ArmSpec.parse("sync")

    async def main() -> object:
        await fake.start()
        loop = RolloutConfig(
            rollout_batch_size=2, n_samples_per_prompt=2, max_response_len=64, replay_lengths=True
        ).build(
            arm=spec.label, engine=fake, strategy=build_strategy(spec), workload=workload,
            prompts=workload.prompt_stream(), recorder=recorder,
        )  # fmt: skip
        return await loop.run_step(0, 0)

    outcome = run_virtual(main())
    r = outcome.record  # type: ignore[attr-defined]
    assert (r.rollout_time_s, r.generated_tokens, r.observation_tokens) == (21.0, 36, 26)
    assert r.env_time_s == pytest.approx(19.5)
    assert sorted(c[:3] for c in workload.environment.calls) == sorted(
        [(0, 0, 0)] + [(0, 1, t) for t in range(6)] + [(1, i, t) for i in (0, 1) for t in range(3)]
    )
    # every response: the generated tokens and 2 observation tokens per call
    lens = {(s.prompt.uid, s.index): s.response_len for g in outcome.batch for s in g.samples}  # type: ignore[attr-defined]
    assert lens == {(0, 0): 12 + 2, (0, 1): 12 + 12, (1, 0): 6 + 6, (1, 1): 6 + 6}


def test_calls_queue_for_the_sandbox_slots() -> None:
    # One slot: two calls of 2 s issued together return at 2 s and 4 s (slime's semaphore).
    workload = episodes(ToolShape(calls=50, max_calls=1, latency_s=2.0, latency_sigma=0.0, tool_slots=1))
    env = workload.environment
    prompts = [Prompt(uid=uid, source_id=str(uid), length=4) for uid in (0, 1)]

    async def main() -> list[float]:
        states = [env.reset(p, 0).state for p in prompts]
        clock = asyncio.get_running_loop()
        start = clock.time()
        done: list[float] = []

        async def call(state: dict[str, object]) -> None:
            answer = await env.step(state, ())
            assert len(answer.token_ids) == 32 and not answer.done
            done.append(clock.time() - start)

        await asyncio.gather(*(call(s) for s in states))
        return done

    assert run_virtual(main()) == [2.0, 4.0]


def test_a_run_left_with_calls_queued_leaves_no_slot_taken_to_the_next() -> None:
    # The first run ends with one call holding the only slot and two queued for it (as an arm that
    # failed mid-step leaves them, with nothing to release them); the next run's loop has its own
    # slots, whatever address its loop gets.
    workload = episodes(ToolShape(calls=50, max_calls=1, latency_s=2.0, latency_sigma=0.0, tool_slots=1))
    env = workload.environment
    prompts = [Prompt(uid=uid, source_id=str(uid), length=4) for uid in (0, 1, 2)]

    async def abandon() -> None:
        for p in prompts:
            env.step_then(env.reset(p, 0).state, (), lambda answer: None)

    async def call() -> float:
        answer = await env.step(env.reset(prompts[0], 0).state, ())
        assert len(answer.token_ids) == 32
        return asyncio.get_running_loop().time()

    for _ in range(3):
        run_virtual(abandon())
        assert run_virtual(call()) == 2.0
