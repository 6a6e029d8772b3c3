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
import collections
import functools
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from april_bench.config import ConfigError
from april_bench.envs.protocol import EnvStep
from april_bench.types import Prompt, Sample
from april_bench.vtime import hops
from april_bench.workload import PromptStream

__all__ = ["AGENT_ARGS", "AgentToolEpisodes", "EpisodePlan", "ToolSandbox", "ToolShape"]

#: What :meth:`ToolSandbox.step_then` hands its continuation: the answer, or what the call raised.
Answer = EnvStep | Exception

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


class _Slots:
    """The sandbox's slots: ``asyncio.Semaphore`` as CPython 3.11 has it (FIFO waiters; a woken waiter
    wakes the next one if a slot is still free), plus :meth:`acquire_then`, which takes a slot in the
    loop passes in which a task awaiting :meth:`acquire` would, and then calls a function instead of
    resuming a task (the simulator's hot path: :meth:`ToolSandbox.step_then`).

    ``acquire``, ``release`` and ``_wake_up_next`` follow CPython 3.11's ``asyncio.locks.Semaphore``
    (PSF licence) step for step, on purpose: the slots must wake waiters in the passes 3.11's did, on
    every Python version, or the simulated schedule (and the committed paper table) would move with the
    interpreter."""

    __slots__ = ("_value", "_waiters")

    def __init__(self, value: int) -> None:
        self._value = value
        self._waiters: collections.deque[asyncio.Future[bool]] = collections.deque()

    def locked(self) -> bool:
        return self._value == 0 or any(not w.cancelled() for w in self._waiters)

    async def acquire(self) -> bool:
        if not self.locked():
            self._value -= 1
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            try:
                await fut
            finally:
                self._waiters.remove(fut)
        except asyncio.CancelledError:
            if not fut.cancelled():
                self._value += 1
                self._wake_up_next()
            raise
        if self._value > 0:
            self._wake_up_next()
        return True

    def acquire_then(self, then: Callable[[], None]) -> None:
        """Take a slot, then call ``then``: now if one is free (as ``acquire`` returns without
        suspending), else in the pass after a release wakes this waiter (where the waiting task's
        wake-up runs: the future's done callback is scheduled as the task's would be)."""
        if not self.locked():
            self._value -= 1
            then()
            return
        # the loop's create_future(), a call less (a call per tool call waits here)
        fut: asyncio.Future[bool] = asyncio.Future(loop=asyncio.get_running_loop())
        self._waiters.append(fut)
        fut.add_done_callback(functools.partial(self._woken, then))

    def _woken(self, then: Callable[[], None], fut: asyncio.Future[bool]) -> None:
        self._waiters.remove(fut)
        if self._value > 0:
            self._wake_up_next()
        then()

    def release(self) -> None:
        self._value += 1
        self._wake_up_next()

    def _wake_up_next(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                self._value -= 1
                fut.set_result(True)
                return

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class ToolSandbox:
    """The tool: waits each call's planned latency in one of ``tool_slots`` slots (slime's semaphore)."""

    name = "tool-sandbox"

    def __init__(self, episodes: AgentToolEpisodes) -> None:
        self._episodes = episodes
        #: One per event loop (one per arm's run), held no longer than the loop: a run that ended with
        #: calls queued (an arm that failed mid-step) leaves no taken slot to a later loop.
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slots] = (
            weakref.WeakKeyDictionary()
        )
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
        return self._turn(state)[2]

    def _turn(self, state: Mapping[str, Any]) -> tuple[EpisodePlan, int, int]:
        """The episode's plan, the turn now, and the response's length once this turn is generated."""
        plan, turn = self._plan(state), int(state["turn"])
        ends = plan.turn_ends
        return plan, turn, int(state["done_len"]) + ends[turn] - (ends[turn - 1] if turn else 0)

    @staticmethod
    def _final(state: Mapping[str, Any], turn: int, done_len: int) -> EnvStep:
        """The answer turn's step: no call, the episode is done (graded by the length workload)."""
        return EnvStep((), {**state, "turn": turn + 1, "done_len": done_len}, done=True)

    async def step(self, state: Mapping[str, Any], action: Sequence[int]) -> EnvStep:
        plan, turn, done_len = self._turn(state)
        if turn + 1 == len(plan.turn_ends):
            return self._final(state, turn, done_len)
        async with self._slots_here():
            await asyncio.sleep(plan.latencies[turn])
        return self._observation(state, turn, plan, done_len)

    def step_then(
        self, state: Mapping[str, Any], action: Sequence[int], then: Callable[[Answer], None]
    ) -> None:
        """What ``then(await step(state, action))`` does in a task, without the task and its coroutines,
        in the same loop passes: ``then`` runs now for the answer turn, else where the awaiting task
        would resume after the call's latency (a slot taken as ``acquire`` takes it, the latency
        waited as ``asyncio.sleep`` waits it: a timer whose callback schedules the wake-up).  An
        exception goes to ``then`` as the task's ``await`` would raise it.  The simulator's hot path
        (the rollout loop calls it for each tool call: :mod:`april_bench.rollout.episodes`)."""
        try:
            plan, turn, done_len = self._turn(state)
            if turn + 1 == len(plan.turn_ends):
                answer: Answer = self._final(state, turn, done_len)
            else:
                slots = self._slots_here()
                slots.acquire_then(functools.partial(self._wait, slots, state, turn, plan, done_len, then))
                return
        except Exception as exc:
            answer = exc
        then(answer)

    def _wait(
        self,
        slots: _Slots,
        state: Mapping[str, Any],
        turn: int,
        plan: EpisodePlan,
        done_len: int,
        then: Callable[[Answer], None],
    ) -> None:
        resume = functools.partial(self._answered, slots, state, turn, plan, done_len, then)
        loop = asyncio.get_running_loop()
        push = hops(loop)
        if plan.latencies[turn] <= 0:  # asyncio.sleep(0): the task yields for one pass
            push((resume, ()))
        else:  # asyncio.sleep: a timer that sets a future, whose waiting task wakes in the next pass
            loop.call_later(plan.latencies[turn], push, (resume, ()))

    def _answered(
        self,
        slots: _Slots,
        state: Mapping[str, Any],
        turn: int,
        plan: EpisodePlan,
        done_len: int,
        then: Callable[[Answer], None],
    ) -> None:
        slots.release()
        try:
            answer: Answer = self._observation(state, turn, plan, done_len)
        except Exception as exc:
            answer = exc
        then(answer)

    def _slots_here(self) -> _Slots:
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = _Slots(self._episodes.shape.tool_slots)
        return slots

    def _observation(self, state: Mapping[str, Any], turn: int, plan: EpisodePlan, done_len: int) -> EnvStep:
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
