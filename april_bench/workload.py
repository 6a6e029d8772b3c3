"""The workload: where prompts, replayed response lengths and rewards come from.

Every arm of a comparison gets a fresh :class:`PromptStream` over the *same*
prompt order and the same per-(prompt, sample) random draws, so the arms differ
in the strategy alone.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from april_bench.types import Prompt, Sample

__all__ = ["EpochOrder", "PromptStream", "ScriptedWorkload", "Workload"]


class PromptStream:
    """A deterministic stream of prompts; ``make(uid)`` builds the prompt drawn at position ``uid``.

    Prompts a strategy looked at and did not launch are given back and come out first next time,
    in uid order, so no prompt is skipped.  ``limit`` bounds the stream (``None``: endless).
    """

    def __init__(self, make: Callable[[int], Prompt], limit: int | None = None) -> None:
        self.make = make
        self._limit = limit
        self._next = 0
        self._returned: deque[Prompt] = deque()

    @property
    def position(self) -> int:
        """The uid the next new prompt will have."""
        return self._next

    def take(self, n: int) -> list[Prompt]:
        """Up to ``n`` prompts: given-back ones first, then new ones (fewer only at the limit)."""
        prompts = [self._returned.popleft() for _ in range(min(n, len(self._returned)))]
        fresh = n - len(prompts)
        if self._limit is not None:
            fresh = max(0, min(fresh, self._limit - self._next))
        prompts += [self.make(self._next + i) for i in range(fresh)]
        self._next += fresh
        return prompts

    def give_back(self, prompts: Iterable[Prompt]) -> None:
        """Return prompts that were taken but not launched; they come out first, oldest first."""
        merged = sorted([*self._returned, *prompts], key=lambda p: p.uid)
        self._returned = deque(merged)

    def restore(self, position: int, returned: Iterable[int]) -> None:
        """Continue a stream saved as (:attr:`position`, uids given back): for resuming a run."""
        self._next = position
        self._returned = deque(self.make(uid) for uid in sorted(returned))

    def returned_uids(self) -> list[int]:
        return [p.uid for p in self._returned]


class EpochOrder:
    """Prompt ``uid`` -> row of an ``n``-row data set: a seeded shuffle, reshuffled every epoch, so each
    epoch uses every row once and every arm sees the same order."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def index(self, uid: int) -> int:
        epoch, position = divmod(uid, self.n)
        order = self._orders.get(epoch)
        if order is None:
            order = self._orders[epoch] = list(range(self.n))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order[position]


@runtime_checkable
class Workload(Protocol):
    """Prompts, replayed lengths and rewards for one experiment."""

    name: str

    def prompt_stream(self) -> PromptStream:
        """A fresh stream, starting at the first prompt (one per arm)."""
        ...

    def longest_prompt(self) -> int:
        """Tokens of the longest prompt this workload can produce (sizes a real engine's context)."""
        ...

    def replay_len(self, prompt: Prompt, sample_index: int, start_step: int) -> int | None:
        """Total response length at which this sample ends with EOS, or ``None`` if the
        engine decides (real generation).  May exceed the response limit (then it is truncated)."""
        ...

    def reward(self, sample: Sample) -> float:
        """The reward of a finished sample."""
        ...


class ScriptedWorkload:
    """A workload whose lengths and rewards are plain functions: for tests and what-ifs.

    ``length(uid, sample_index)`` is the response length at which a sample ends;
    ``reward(uid, sample_index)`` its reward.  Prompts have ``prompt_len`` tokens
    with ids ``[uid, uid, ...]``, so a fake engine's output depends on the prompt.
    """

    def __init__(
        self,
        length: Callable[[int, int], int],
        reward: Callable[[int, int], float] = lambda uid, i: float(i % 2),
        prompt_len: int = 4,
        name: str = "scripted",
    ) -> None:
        self.name = name
        self._length = length
        self._reward = reward
        self._prompt_len = prompt_len

    def _prompt(self, uid: int) -> Prompt:
        return Prompt(
            uid=uid, source_id=f"p{uid}", length=self._prompt_len, token_ids=(uid,) * self._prompt_len
        )

    def prompt_stream(self) -> PromptStream:
        return PromptStream(self._prompt)

    def longest_prompt(self) -> int:
        return self._prompt_len

    def replay_len(self, prompt: Prompt, sample_index: int, start_step: int) -> int | None:
        return self._length(prompt.uid, sample_index)

    def reward(self, sample: Sample) -> float:
        return self._reward(sample.prompt.uid, sample.index)
