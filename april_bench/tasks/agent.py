"""The synthetic task with a tool: ``--dataset synthetic-agent``, multi-turn episodes on the CPU.

The problem is the synthetic task's (``n-k=`` asks for ``n mod k`` by repeated subtraction), but
the policy does not write the chain itself: it calls a calculator.  A turn ends with the call token
``?``; the calculator answers with the next ``chunk`` values of the chain (fewer at its end), and
a trailing ``,`` when the chain goes on.  When the chain has ended the policy writes the answer,
``#`` and the last value, and EOS ends the episode::

    prompt        <bos>73-7=
    turn 1        ?                   -> calculator  66,59,52,45,
    turn 2        ?                   -> calculator  38,31,24,17,
    turn 3        ?                   -> calculator  10,3
    turn 4        #3<eos>             -> done, reward 1

A problem with ``s = n // k`` chain steps is an episode of ``ceil(s / chunk) + 1`` turns, so the
turn count has the synthetic task's heavy tail.  The warm start learns the protocol from transcripts
(:meth:`AgentTask.solution_ids`); RL then trains the calls and the answer, with the calculator's
observation tokens masked from the loss.  The policy may also write chain values itself before
calling: the calculator continues from the last number of the turn.

Latency: each call waits a seeded log-normal time (``tool_latency_ms`` median, ``tool_latency_sigma``)
on the event loop's clock: a real wait on a measured run (the engine keeps decoding other requests
meanwhile), virtual seconds in the simulator.  The calculation itself takes microseconds; the wait
stands in for a tool's service time (a sandbox, a search, an API), seeded so every arm sees the same
latency for the same call.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError, config_from, param
from april_bench.engines.protocol import Engine, GenerateRequest
from april_bench.envs.protocol import EnvStep
from april_bench.evaluation import AvgAtK, EvalItem, EvalResult, EvalRow
from april_bench.tasks.base import Task, checkpoint_of, looks_like_path
from april_bench.tasks.synthetic import CharTokenizer, Problem, SyntheticTask
from april_bench.tasks.workload import SyntheticWorkload
from april_bench.types import Prompt, Sample

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["AgentTask", "AgentWorkload", "Calculator", "build"]


class AgentTask(SyntheticTask):
    """The synthetic task's problems with a calculator tool (``?`` calls it)."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(SyntheticTask.Config):
        chunk: int = param(4, help="chain values one calculator call returns")
        max_calls: int = param(32, help="calls after which an episode ends unanswered (reward 0)")
        tool_latency_ms: float = param(50.0, help="median latency of a calculator call (log-normal)")
        tool_latency_sigma: float = param(1.0, help="log-normal sigma of the call latency (0: fixed)")

        def __post_init__(self) -> None:
            SyntheticTask.Config.__post_init__(self)
            if self.chunk < 1 or self.max_calls < 1:
                raise ConfigError("--task-arg chunk and max_calls must be >= 1")
            if self.tool_latency_ms < 0 or self.tool_latency_sigma < 0:
                raise ConfigError("--task-arg tool_latency_ms and tool_latency_sigma must be >= 0")

    ALPHABET = SyntheticTask.ALPHABET + "?"
    config: Config

    @property
    def call_id(self) -> int:
        return self.tokenizer.encode("?")[0]

    def observation(self, x: int, k: int) -> str:
        """The calculator's answer from ``x``: the next ``chunk`` chain values, ``,`` if more follow."""
        values: list[str] = []
        while x - k >= 0 and len(values) < self.config.chunk:
            x -= k
            values.append(str(x))
        return ",".join(values) + ("," if x >= k else "")

    def transcript(self, problem: Problem) -> list[tuple[str, bool]]:
        """A worked episode as ``(text, is_observation)`` parts: what the warm start learns."""
        parts: list[tuple[str, bool]] = []
        x = problem.n
        while x >= problem.k:
            parts.append(("?", False))
            obs = self.observation(x, problem.k)
            parts.append((obs, True))
            x = int(obs.rstrip(",").rsplit(",", 1)[-1])
        parts.append((f"#{x}", False))
        return parts

    def solution_ids(self, problem: Problem) -> list[int]:
        """The worked episode, calls, observations and answer, as the warm start's target."""
        text = "".join(t for t, _ in self.transcript(problem))
        return [*self.tokenizer.encode(text), CharTokenizer.EOS]


class Calculator:
    """The environment: answers ``?`` with chain values after a seeded latency, grades the answer."""

    name = "calculator"

    def __init__(self, task: AgentTask, *, seed: int, wait: bool = True) -> None:
        self.task = task
        self.seed = seed
        self.wait = wait

    def reset(self, prompt: Prompt, sample_index: int) -> EnvStep:
        n, k = int(prompt.metadata["n"]), int(prompt.metadata["k"])
        return EnvStep((), {"n": n, "k": k, "x": n, "calls": 0, "uid": prompt.uid, "sample": sample_index})

    def latency(self, state: Mapping[str, Any]) -> float:
        """Seconds the call waits: seeded by (seed, prompt, sample, call), the same in every arm."""
        cfg = self.task.config
        rng = random.Random(f"{self.seed}:{state['uid']}:{state['sample']}:{state['calls']}")
        return cfg.tool_latency_ms / 1000 * math.exp(cfg.tool_latency_sigma * rng.gauss(0.0, 1.0))

    async def step(self, state: Mapping[str, Any], action: Sequence[int]) -> EnvStep:
        text = self.task.tokenizer.decode(action)  # stops at EOS
        k, calls = int(state["k"]), int(state["calls"])
        if not action or action[-1] != self.task.call_id or calls >= self.task.config.max_calls:
            reward = Problem(int(state["n"]), k).grade(text) if action and "#" in text else 0.0
            return EnvStep((), {**state, "answer": text}, reward=reward, done=True)
        if self.wait:
            await asyncio.sleep(self.latency(state))
        written = [w for w in text.rstrip("?").split(",") if w.isdigit()]  # values the policy wrote
        x = int(written[-1]) if written else int(state["x"])
        obs = self.task.observation(x, k)
        last = obs.rstrip(",").rsplit(",", 1)[-1]
        new = {**state, "x": int(last) if last else x, "calls": calls + 1}
        return EnvStep(tuple(self.task.tokenizer.encode(obs)), new)

    def replay_len(self, state: Mapping[str, Any]) -> int | None:
        return None  # the model decides where a turn ends


class AgentWorkload(SyntheticWorkload):
    """The synthetic prompts as episodes in the calculator; rewards from the calculator's grading."""

    def __init__(self, task: AgentTask, *, seed: int) -> None:
        super().__init__(task)
        self.name = "synthetic-agent"
        self.environment = Calculator(task, seed=seed)

    def reward(self, sample: Sample) -> float:
        """An episode that never answered (truncated, or cut by the call limit): graded as written."""
        return self.task.grade(self.problem(sample.prompt), sample.response_ids())


class EpisodeAvgAtK(AvgAtK):
    """avg@k where every sample is an episode: generate a turn, call the tool (without its latency:
    evaluation time is not the arm's), append the answer, until the episode ends."""

    def __init__(self, calculator: Calculator, items: Sequence[EvalItem], **kwargs: Any) -> None:
        task = calculator.task

        def grade(item: EvalItem, output_ids: Sequence[int]) -> tuple[float, bool]:
            value = task.grade(item.reference, output_ids)
            return value, value >= 1.0

        super().__init__(items, grade, **kwargs)
        self.calculator = calculator

    async def evaluate(self, engine: Engine) -> EvalResult:
        requests, where = self.requests()
        episodes = [self._episode(engine, r, where[r.request_id]) for r in requests]
        return self.summarise(await asyncio.gather(*episodes))

    async def _episode(self, engine: Engine, request: GenerateRequest, at: tuple[EvalItem, int]) -> EvalRow:
        item, j = at
        problem: Problem = item.reference
        prompt = Prompt(
            uid=-1,
            source_id=item.source_id,
            length=len(item.prompt_ids),
            metadata={"n": problem.n, "k": problem.k},
        )
        state = self.calculator.reset(prompt, j).state
        response: list[int] = []
        turn = 0
        while True:
            budget = self.max_new_tokens - len(response)
            ids = (*item.prompt_ids, *response)
            req = GenerateRequest(
                f"{request.request_id}-t{turn}", len(ids), budget, request.sampling, input_ids=ids
            )
            action: tuple[int, ...] = ()
            async for c in engine.generate([req]):
                action = c.output_ids or ()
            response += action
            answer = await self.calculator.step(state, action)
            state = answer.state
            turn += 1
            if answer.done or len(response) + len(answer.token_ids) >= self.max_new_tokens:
                break
            response += answer.token_ids
        score, correct = self.grade(item, response)
        return EvalRow(item.dataset, item.source_id, j, score, correct, len(response))


def build(
    config: ExperimentConfig, model: str, *, produces_tokens: bool = True, progress: bool = False
) -> Task:
    """The agent task of ``config`` for ``model``: the synthetic task's warm start on calculator
    transcripts, episodes in the calculator as rollouts, held-out avg@k over episodes."""
    from april_bench.models.zoo import model_config
    from april_bench.tasks.warmstart import WarmStart

    if looks_like_path(model):
        raise ConfigError(
            "the synthetic-agent task trains a named architecture (--model tiny) from its own warm start; "
            f"it cannot use the checkpoint {model}"
        )
    task = config_from(
        AgentTask.Config, config.task_args, where="--task-arg", owner="the synthetic-agent task"
    )
    agent = AgentTask(task)
    warm_options = {"model": model, "seed": config.seed, **config.warmstart_args}
    warm = config_from(WarmStart.Config, warm_options, where="--warmstart-arg").build(task=agent)
    vocab = agent.tokenizer.vocab_size
    model_config(model, vocab_size=vocab)
    workload = AgentWorkload(agent, seed=config.seed)
    rollout = config.rollout
    items = [
        EvalItem("synthetic-agent-heldout", p.prompt, tuple(agent.prompt_ids(p)), p)
        for p in agent.heldout_problems
    ]
    evaluator = EpisodeAvgAtK(
        Calculator(agent, seed=config.seed, wait=False),
        items,
        max_new_tokens=rollout.max_response_len,
        samples=4,
        temperature=rollout.temperature,
        seed=config.seed,
    )

    def weights() -> Any:
        return warm.weights(progress=progress)

    def checkpoint() -> str:
        return checkpoint_of(model, vocab, weights, key=f"warm-{warm.key}")

    return Task(
        kind="synthetic-agent",
        workload=workload,
        evaluator=evaluator,
        longest_prompt=max(workload.longest_prompt(), evaluator.longest_prompt()),
        # a turn ends at EOS (the answer) or at the call token (the calculator answers)
        eos_token_ids=(CharTokenizer.EOS, agent.call_id),
        pad_token_id=CharTokenizer.PAD,
        vocab_size=vocab,
        initial_weights=weights,
        checkpoint=checkpoint,
    )


class ReplayedCalculator(Calculator):
    """The calculator for an engine that replays lengths (the simulator, the fake engine): the policy
    is the worked transcript (a call turn is the ``?`` token, the last turn ``#`` + the answer + EOS),
    so turns, observations and latencies are the task's own; the action's ids are not read."""

    def __init__(self, task: AgentTask, *, seed: int, solve_rate: float) -> None:
        super().__init__(task, seed=seed)
        self.solve_rate = solve_rate

    def reset(self, prompt: Prompt, sample_index: int) -> EnvStep:
        first = super().reset(prompt, sample_index)
        return EnvStep((), {**first.state, "done_len": 0})

    def replay_len(self, state: Mapping[str, Any]) -> int | None:
        x, k = int(state["x"]), int(state["k"])
        return int(state["done_len"]) + (1 if x >= k else len(f"#{x}") + 1)

    async def step(self, state: Mapping[str, Any], action: Sequence[int]) -> EnvStep:
        x, k, calls = int(state["x"]), int(state["k"]), int(state["calls"])
        done_len = int(state["done_len"]) + len(action)
        if x < k:  # the answer turn: right with the seeded solve rate
            rng = random.Random(f"{self.seed}:reward:{state['uid']}:{state['sample']}")
            reward = 1.0 if rng.random() < self.solve_rate else 0.0
            return EnvStep((), {**state, "done_len": done_len}, reward=reward, done=True)
        await asyncio.sleep(self.latency(state))
        obs = self.task.observation(x, k)
        ids = tuple(self.task.tokenizer.encode(obs))
        last = int(obs.rstrip(",").rsplit(",", 1)[-1])
        return EnvStep(ids, {**state, "x": last, "calls": calls + 1, "done_len": done_len + len(ids)})


class ReplayedAgentWorkload(AgentWorkload):
    """The agent task's episodes with replayed turns (no model): for ``--engine sim`` and ``fake``."""

    def __init__(self, task: AgentTask, *, seed: int, solve_rate: float) -> None:
        super().__init__(task, seed=seed)
        self.name = "synthetic-agent (replayed turns)"
        self.environment = ReplayedCalculator(task, seed=seed, solve_rate=solve_rate)

    def reward(self, sample: Sample) -> float:
        return 0.0  # a truncated episode: never answered


#: Held-out accuracy of the agent warm start (tiny, seed 0, defaults): 0.83-0.86 over 4 steps of
#: ``run --dataset synthetic-agent`` (docs/agents.md); the replayed episodes' solve rate.
REPLAYED_SOLVE_RATE = 0.84


def build_replayed(
    config: ExperimentConfig, model: str, *, produces_tokens: bool = False, progress: bool = False
) -> Task:
    """The agent task on an engine without a model (simulator, fake): replayed episodes, no accuracy."""
    options = dict(config.task_args)
    solve_rate = float(options.pop("solve_rate", REPLAYED_SOLVE_RATE))
    if not 0 <= solve_rate <= 1:
        raise ConfigError(f"--task-arg solve_rate must be in [0, 1], got {solve_rate}")
    task = config_from(AgentTask.Config, options, where="--task-arg", owner="the synthetic-agent task")
    agent = AgentTask(task)
    workload = ReplayedAgentWorkload(agent, seed=config.seed, solve_rate=solve_rate)
    return Task(
        kind="synthetic-agent-replayed",
        workload=workload,
        evaluator=None,
        longest_prompt=workload.longest_prompt(),
        replay_lengths=True,
        eos_token_ids=(CharTokenizer.EOS, agent.call_id),
        pad_token_id=CharTokenizer.PAD,
        vocab_size=agent.tokenizer.vocab_size,
    )
