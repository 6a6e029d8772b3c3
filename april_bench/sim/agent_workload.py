"""A multi-turn tool-use workload for the simulator: the paper's fourth row (agent tasks).

Each sample of a length workload (:class:`~april_bench.sim.workload.SimWorkload`) becomes an episode
of a code-interpreter agent in the style of slime's ``examples/retool``: the policy's response of
``L`` generated tokens (the length model's draw, unchanged) is cut into ``C + 1`` turns of equal
length, and each of the first ``C`` turns ends with a tool call that waits a log-normal latency in
one of ``tool_slots`` sandbox slots and appends ``observation_tokens`` (masked, prefilled by the next
turn).  The last turn ends the episode, which the length workload grades as usual.

The plan is a pure function of (seed, prompt uid, sample index): ``C`` is a Poisson draw of mean
``calls`` capped at ``max_calls`` (and at ``L - 1``: every turn generates at least one token); call
``i`` waits ``latency_s * exp(latency_sigma * z)``, at most ``timeout_s``.  So both arms of a
comparison, and a resumed episode, see the same episode.  Every parameter and its source:
``docs/calibration.md``, "The fourth row".  The environment waits on the loop's clock: virtual time
under the simulator.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from april_bench.config import ConfigError
from april_bench.envs.protocol import EnvStep
from april_bench.types import Prompt, Sample
from april_bench.workload import PromptStream

__all__ = ["AGENT_ARGS", "AgentToolEpisodes", "EpisodePlan", "ToolSandbox", "ToolShape"]

#: ``--workload-arg`` names that turn a length workload into tool episodes (``agent_`` + field).
AGENT_ARGS = ("agent_calls", "agent_max_calls", "agent_latency_s", "agent_latency_sigma",
              "agent_observation_tokens", "agent_tool_slots", "agent_timeout_s")  # fmt: skip


@dataclass(frozen=True, slots=True)
class ToolShape:
    """The episode shape: tool calls per episode, their latency, observations, sandbox slots."""

    calls: float = 2.0
    max_calls: int = 16
    latency_s: float = 0.5
    latency_sigma: float = 1.0
    observation_tokens: int = 32
    tool_slots: int = 32
    #: A call is cut at this many seconds (slime's ``python_timeout``).
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.calls < 0 or self.max_calls < 0 or self.latency_s < 0 or self.latency_sigma < 0:
            raise ConfigError(f"tool episode parameters must be >= 0: {self}")
        if self.observation_tokens < 1 or self.tool_slots < 1:
            raise ConfigError(f"observation_tokens and tool_slots must be >= 1: {self}")

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> ToolShape | None:
        """The shape named by ``agent_*`` entries of ``args`` (popped), or ``None`` if there are none."""
        found = {k[len("agent_") :]: args.pop(k) for k in AGENT_ARGS if k in args}
        if not found:
            return None
        ints = ("max_calls", "observation_tokens", "tool_slots")
        values: dict[str, Any] = {k: int(v) if k in ints else float(v) for k, v in found.items()}
        return cls(**values)


@dataclass(frozen=True, slots=True)
class EpisodePlan:
    """One episode: where each turn's generation ends (generated tokens, cumulative) and each call's wait."""

    turn_ends: tuple[int, ...]
    latencies: tuple[float, ...]


def plan_episode(shape: ToolShape, seed: int, uid: int, index: int, length: int) -> EpisodePlan:
    rng = np.random.default_rng([seed, uid, index, 0x7001])
    calls = min(int(rng.poisson(shape.calls)), shape.max_calls, max(0, length - 1))
    turns = calls + 1
    ends = tuple(length * (i + 1) // turns for i in range(turns))
    latencies = tuple(
        min(shape.timeout_s, shape.latency_s * math.exp(shape.latency_sigma * float(z)))
        for z in rng.standard_normal(calls)
    )
    return EpisodePlan(ends, latencies)


class ToolSandbox:
    """The tool: waits each call's planned latency in one of ``tool_slots`` slots (slime's semaphore)."""

    name = "tool-sandbox"

    def __init__(self, episodes: AgentToolEpisodes) -> None:
        self._episodes = episodes
        self._slots: dict[int, asyncio.Semaphore] = {}  # one per event loop (one per arm's run)
        #: (uid, sample, call, latency) of every call, in the order they returned: what the tests read.
        self.calls: list[tuple[int, int, int, float]] = []
        #: Observation ids 3 + j % 97 for j < 97 + observation_tokens: each observation is a slice (a
        #: call builds no tuple token by token; the simulator's hot path).
        n = episodes.shape.observation_tokens
        self._cycle = tuple(3 + j % 97 for j in range(97 + n))

    def _plan(self, state: Mapping[str, Any]) -> EpisodePlan:
        return self._episodes.plan(int(state["uid"]), int(state["sample"]), int(state["length"]))

    def reset(self, prompt: Prompt, sample_index: int) -> EnvStep:
        length = self._episodes.base.replay_len(prompt, sample_index, 0)
        return EnvStep(
            (), {"uid": prompt.uid, "sample": sample_index, "length": length, "turn": 0, "done_len": 0}
        )

    def replay_len(self, state: Mapping[str, Any]) -> int | None:
        ends, turn = self._plan(state).turn_ends, int(state["turn"])
        return int(state["done_len"]) + ends[turn] - (ends[turn - 1] if turn else 0)

    async def step(self, state: Mapping[str, Any], action: Sequence[int]) -> EnvStep:
        plan, turn = self._plan(state), int(state["turn"])
        generated = plan.turn_ends[turn] - (plan.turn_ends[turn - 1] if turn else 0)
        done_len = int(state["done_len"]) + generated
        if turn + 1 == len(plan.turn_ends):  # the answer: graded by the length workload
            return EnvStep((), {**state, "turn": turn + 1, "done_len": done_len}, done=True)
        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(id(loop), asyncio.Semaphore(self._episodes.shape.tool_slots))
        async with slots:
            await asyncio.sleep(plan.latencies[turn])
        self.calls.append((int(state["uid"]), int(state["sample"]), turn, plan.latencies[turn]))
        n = self._episodes.shape.observation_tokens
        start = (int(state["uid"]) * 31 + turn * 7) % 97
        obs = self._cycle[start : start + n]  # = tuple(3 + (start + i) % 97 for i in range(n))
        return EnvStep(obs, {**state, "turn": turn + 1, "done_len": done_len + n})


class AgentToolEpisodes:
    """An :class:`~april_bench.envs.protocol.EpisodeWorkload`: ``base``'s prompts, lengths and grader,
    its responses cut into tool-calling turns (:func:`plan_episode`)."""

    def __init__(self, base: Any, shape: ToolShape, *, seed: int) -> None:
        self.base = base
        self.shape = shape
        self.seed = seed
        self.name = f"{base.name}+tool-episodes"
        self.environment = ToolSandbox(self)
        self._plans: dict[tuple[int, int], EpisodePlan] = {}

    def plan(self, uid: int, index: int, length: int) -> EpisodePlan:
        plan = self._plans.get((uid, index))
        if plan is None:
            plan = self._plans[(uid, index)] = plan_episode(self.shape, self.seed, uid, index, length)
        return plan

    @property
    def has_rewards(self) -> bool:
        return bool(getattr(self.base, "has_rewards", True))

    @property
    def load_report(self) -> Any:
        return getattr(self.base, "load_report", None)

    def prompt_stream(self) -> PromptStream:
        return self.base.prompt_stream()

    def longest_prompt(self) -> int:
        return int(self.base.longest_prompt())

    def replay_len(self, prompt: Prompt, sample_index: int, start_step: int) -> int | None:
        return None  # per turn: the environment's replay_len

    def reward(self, sample: Sample) -> float:
        return float(self.base.reward(sample))
