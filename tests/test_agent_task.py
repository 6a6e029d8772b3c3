"""The synthetic-agent task: the calculator environment, and runs of its episodes through the CLI.

The replayed episodes (``--engine sim``) are deterministic, so an interrupted run resumed with
``--resume`` must write exactly the rows of an uninterrupted one, every episode with one fate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from helpers import comparable_rows, flags, interrupt_at, table_rows

from april_bench.cli import main
from april_bench.tasks.agent import AgentTask, Calculator, ReplayedCalculator
from april_bench.tasks.synthetic import CharTokenizer, Problem
from april_bench.types import Prompt

SIM = flags(
    dataset="synthetic-agent",
    engine="sim",
    steps=4,
    rollout_batch_size=4,
    n_samples_per_prompt=4,
    over_sampling_batch_size=8,
    strategies="sync,april",
    no_progress=True,
)


def _task(**options: Any) -> AgentTask:
    return AgentTask(AgentTask.Config(tool_latency_ms=0.0, **options))


def _prompt(n: int, k: int) -> Prompt:
    return Prompt(uid=3, source_id=f"{n}-{k}=", length=5, metadata={"n": n, "k": k})


def test_a_transcript_calls_the_calculator_until_the_chain_ends() -> None:
    task = _task()
    assert task.transcript(Problem(73, 7)) == [
        ("?", False),
        ("66,59,52,45,", True),
        ("?", False),
        ("38,31,24,17,", True),
        ("?", False),
        ("10,3", True),
        ("#3", False),
    ]
    assert task.tokenizer.decode(task.solution_ids(Problem(10, 7))) == "?3#3"


def test_the_calculator_answers_a_call_and_grades_the_answer() -> None:
    task = _task()
    calc = Calculator(task, seed=0)
    enc = task.tokenizer.encode
    state = calc.reset(_prompt(73, 7), 1).state
    first = asyncio.run(calc.step(state, enc("?")))
    assert task.tokenizer.decode(first.token_ids) == "66,59,52,45," and not first.done
    assert state["calls"] == 0 and first.state["calls"] == 1  # the state given is not changed
    # the policy may write values itself: the calculator continues from the last one
    second = asyncio.run(calc.step(first.state, enc("38,31?")))
    assert task.tokenizer.decode(second.token_ids) == "24,17,10,3"
    right = asyncio.run(calc.step(second.state, [*enc("#3"), CharTokenizer.EOS]))
    wrong = asyncio.run(calc.step(second.state, [*enc("#4"), CharTokenizer.EOS]))
    assert (right.done, right.reward, wrong.reward) == (True, 1.0, 0.0)


def test_an_episode_that_keeps_calling_ends_at_the_call_limit() -> None:
    task = _task(max_calls=2)
    calc = Calculator(task, seed=0)
    state = calc.reset(_prompt(99, 2), 0).state
    for _ in range(2):
        state = asyncio.run(calc.step(state, task.tokenizer.encode("?"))).state
    last = asyncio.run(calc.step(state, task.tokenizer.encode("?")))
    assert last.done and last.reward == 0.0


def test_call_latency_is_seeded_per_call_and_heavy_tailed() -> None:
    calc = Calculator(AgentTask(AgentTask.Config()), seed=0)
    state = calc.reset(_prompt(73, 7), 0).state
    draws = [calc.latency({**state, "uid": u, "calls": c}) for u in range(50) for c in range(4)]
    assert draws == [calc.latency({**state, "uid": u, "calls": c}) for u in range(50) for c in range(4)]
    draws.sort()
    assert 0.03 < draws[len(draws) // 2] < 0.08 and draws[-1] > 4 * draws[len(draws) // 2]


def test_replayed_episodes_follow_the_transcript() -> None:
    task = _task()
    calc = ReplayedCalculator(task, seed=0, solve_rate=1.0)
    state = calc.reset(_prompt(10, 7), 0).state
    assert calc.replay_len(state) == 1  # a call: "?"
    state = asyncio.run(calc.step(state, [0])).state
    assert calc.replay_len(state) == 2 + 3  # after the observation "3": "#3" and EOS
    done = asyncio.run(calc.step(state, [0, 0, 0]))
    assert done.done and done.reward == 1.0 and done.state["done_len"] == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task-arg", "chunk=0"], "chunk and max_calls must be >= 1"),
        (["--task-arg", "tool_latency_ms=-1"], "tool_latency_ms and tool_latency_sigma must be >= 0"),
        (["--engine", "sim", "--task-arg", "solve_rate=2"], "solve_rate must be in [0, 1]"),
    ],
)
def test_bad_agent_input_is_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--dataset", "synthetic-agent", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("agent") / "run"
    assert main(["run", *SIM, "--out", str(out)]) == 0
    return out


def test_a_simulated_agent_run_resumes_episodes_across_steps(uninterrupted: Path) -> None:
    samples = table_rows(uninterrupted, "samples")
    resumed = [
        s
        for s in samples
        if s["arm"] == "april" and s["fate"] == "trained" and len(s["episode"]["steps"]) > 1
    ]
    assert resumed, "APRIL carried episodes over"
    for s in resumed:  # the episode's state went with it: it ended at the chain's end, answered
        state = s["episode"]["env_state"]
        assert state["x"] < state["k"] and s["episode"]["env_calls"] == state["calls"] + 1
        assert s["observation_tokens"] > 0 and s["status"] == "completed"
    steps = table_rows(uninterrupted, "steps")
    assert all(r["env_calls"] > 0 and r["observation_tokens"] > 0 for r in steps)
    assert main(["report", str(uninterrupted)]) == 0  # every prompt one fate, tokens conserved


@pytest.mark.parametrize(("arm", "step"), [("april", 1), ("sync", 2)])
def test_interrupt_then_resume_an_agent_run_gives_the_samecomparable_rows(
    arm: str, step: int, uninterrupted: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with interrupt_at(step, arm):
        assert main(["run", *SIM, "--out", str(out)]) == 130
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    for table in ("requests", "samples", "steps", "events"):
        assert comparable_rows(out, table) == comparable_rows(uninterrupted, table), table
    fates: dict[tuple[str, int, int], int] = {}
    for f in table_rows(out, "samples"):
        key = (f["arm"], f["group_uid"], f["sample_index"])
        fates[key] = fates.get(key, 0) + 1
    assert set(fates.values()) == {1}  # no episode lost or doubled


class _Recording:
    """An engine that records every request it is given and otherwise is the engine it wraps."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.requests: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, requests: Any) -> Any:
        self.requests += list(requests)
        return self._engine.generate(requests)


def test_the_hf_engine_continues_an_episode_by_token_ids() -> None:
    from april_bench.engines.hf import HFEngine
    from april_bench.envs.scripted import ScriptedEpisodes
    from april_bench.results.recorder import RunRecorder
    from april_bench.rollout.loop import RolloutConfig
    from april_bench.strategies import ArmSpec, build_strategy
    from april_bench.vtime import run_real

    hf = HFEngine.Config(model="tiny", dtype="float64", max_context_len=64, eos_token_ids=(2,)).build(
        vocab_size=1100  # the scripted observations are ids 1000-1096
    )
    engine = _Recording(hf)
    workload = ScriptedEpisodes(lambda uid, i: [(3, 0.01, 2), (2, 0.01, 1), (4, 0.0, 0)])
    config = RolloutConfig(
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        over_sampling_batch_size=2,
        max_response_len=32,
        replay_lengths=True,
    )

    async def main() -> Any:
        await engine.start()
        try:
            loop = config.build(
                arm="sync",
                engine=engine,
                strategy=build_strategy(ArmSpec.parse("sync")),
                workload=workload,
                prompts=workload.prompt_stream(),
                recorder=RunRecorder(),
            )
            return await loop.run_step(0, 0)
        finally:
            await engine.close()

    outcome = run_real(main())
    by_sample: dict[tuple[str, int | None], list[Any]] = {}  # a sample's requests share its seed
    for request in engine.requests:
        by_sample.setdefault((request.routing_key, request.sampling.seed), []).append(request)
    for group in outcome.batch:
        for s in group.samples:
            ids = [*s.prompt.token_ids, *s.response_ids()]
            (sent,) = [
                r
                for r in by_sample.values()
                if r[-1].input_ids == tuple(ids[: len(r[-1].input_ids)])
                and r[0].routing_key == str(group.uid)
                and len(r[-1].input_ids) > 4
            ]
            # three turns; each continues from the prompt and everything before it, observations included
            assert [len(r.input_ids) for r in sent] == [4, 4 + 3 + 2, 4 + 3 + 2 + 2 + 1]
            assert all(tuple(ids[: len(r.input_ids)]) == r.input_ids for r in sent)
            assert s.loss_mask == [1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 1]
            assert s.status.is_finished and s.env_calls == 3
