"""The environment protocol: ``reset`` starts an episode, ``step`` answers one action.

An environment holds no per-episode state of its own: the state is plain JSON data that
``reset`` and ``step`` return and the rollout loop keeps on the sample (``Sample.env_state``), so a
buffered episode, a checkpoint and ``--resume`` carry it like any other partial, and an episode
resumed steps later continues with exactly the state it had.  ``step`` must not mutate the state it
is given: a cancelled call then leaves the episode where it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from april_bench.types import Prompt
from april_bench.workload import Workload

__all__ = ["EnvStep", "Environment", "EpisodeWorkload", "ThenStep"]


@dataclass(frozen=True, slots=True)
class EnvStep:
    """What the environment answers: observation tokens, the new state, and whether the episode ended.

    ``reward`` is read only when ``done`` (``None``: the workload's grader scores the episode).
    """

    token_ids: tuple[int, ...]
    state: dict[str, Any] = field(default_factory=dict)
    reward: float | None = None
    done: bool = False


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment (a tool, a game, a sandbox)."""

    name: str

    def reset(self, prompt: Prompt, sample_index: int) -> EnvStep:
        """Start the episode of sample ``sample_index`` of ``prompt``: its first state and the first
        observation's tokens (appended after the prompt; often empty, the prompt being the first)."""
        ...

    async def step(self, state: Mapping[str, Any], action: Sequence[int]) -> EnvStep:
        """Answer one action (the token ids the policy generated in this turn, its stop token
        included).  Awaits whatever the call costs (a tool's real latency); never mutates ``state``."""
        ...

    def replay_len(self, state: Mapping[str, Any]) -> int | None:
        """For an engine that replays lengths (the fake engine, the simulator): the response length
        (all turns so far included) at which this turn's action ends; ``None``: the model decides."""
        ...


@runtime_checkable
class EpisodeWorkload(Workload, Protocol):
    """A workload whose samples are episodes in ``environment``."""

    environment: Environment


@runtime_checkable
class ThenStep(Protocol):
    """An environment that can answer through a continuation (``then(await step(...))`` in the same
    loop passes, without a task): :meth:`~april_bench.sim.agent_workload.ToolSandbox.step_then`."""

    def step_then(
        self, state: Mapping[str, Any], action: Sequence[int], then: Callable[[EnvStep | Exception], None]
    ) -> None: ...
