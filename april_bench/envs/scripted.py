"""A fake environment with scripted turns and latencies, and the episode workload around it.

``turns(uid, sample_index)`` gives the episode of each sample as a list of
``(action_tokens, latency_s, observation_tokens)``: the policy generates ``action_tokens`` (the
fake engine replays that length), the environment waits ``latency_s`` on the loop's clock (virtual
time under the simulator's loop, so schedules are exact) and appends ``observation_tokens``.  The
last turn's observation is ignored: its call ends the episode with the workload's reward.
Observation token ids are a pure function of (uid, sample, turn), so a resumed episode appends the
same tokens an uninterrupted one would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from april_bench.envs.protocol import EnvStep
from april_bench.types import Prompt, Sample
from april_bench.workload import PromptStream, ScriptedWorkload

__all__ = ["ScriptedEnvironment", "ScriptedEpisodes", "Turn"]

#: One turn: (tokens the policy generates, environment latency in seconds, observation tokens).
Turn = tuple[int, float, int]


class ScriptedEnvironment:
    """Waits each turn's scripted latency, then answers with its scripted observation."""

    name = "scripted"

    def __init__(self, turns: Callable[[int, int], Sequence[Turn]]) -> None:
        self._turns = turns
        #: (uid, sample, turn) of every call, in the order they returned: what the tests read.
        self.calls: list[tuple[int, int, int]] = []

    def reset(self, prompt: Prompt, sample_index: int) -> EnvStep:
        return EnvStep((), {"uid": prompt.uid, "sample": sample_index, "turn": 0, "done_len": 0})

    async def step(self, state: Mapping[str, Any], action: Sequence[int]) -> EnvStep:
        uid, index, turn = int(state["uid"]), int(state["sample"]), int(state["turn"])
        script = self._turns(uid, index)
        tokens, latency, observed = script[turn]
        if len(action) != tokens:
            raise ValueError(
                f"episode {uid}/{index} turn {turn}: action of {len(action)} tokens, script {tokens}"
            )
        await asyncio.sleep(latency)
        self.calls.append((uid, index, turn))
        done = turn + 1 == len(script)
        obs = (
            () if done else tuple(1000 + (uid * 31 + index * 7 + turn * 3 + i) % 97 for i in range(observed))
        )
        new = {**state, "turn": turn + 1, "done_len": int(state["done_len"]) + tokens + len(obs)}
        return EnvStep(obs, new, done=done)

    def replay_len(self, state: Mapping[str, Any]) -> int | None:
        script = self._turns(int(state["uid"]), int(state["sample"]))
        turn = int(state["turn"])
        return int(state["done_len"]) + script[min(turn, len(script) - 1)][0]


class ScriptedEpisodes:
    """An :class:`~april_bench.envs.protocol.EpisodeWorkload` over :class:`ScriptedEnvironment`:
    prompts as :class:`~april_bench.workload.ScriptedWorkload`'s, rewards ``reward(uid, sample)``."""

    def __init__(
        self,
        turns: Callable[[int, int], Sequence[Turn]],
        reward: Callable[[int, int], float] = lambda uid, i: float(i % 2),
        prompt_len: int = 4,
    ) -> None:
        self.name = "scripted-episodes"
        self.environment = ScriptedEnvironment(turns)
        self._prompts = ScriptedWorkload(lambda uid, i: 0, reward, prompt_len)
        self._reward = reward

    def prompt_stream(self) -> PromptStream:
        return self._prompts.prompt_stream()

    def longest_prompt(self) -> int:
        return self._prompts.longest_prompt()

    def replay_len(self, prompt: Prompt, sample_index: int, start_step: int) -> int | None:
        return None  # per turn: the environment's replay_len

    def reward(self, sample: Sample) -> float:
        return self._reward(sample.prompt.uid, sample.index)
