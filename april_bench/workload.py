"""The workload: where prompts, replayed response lengths and rewards come from.

Every arm of a comparison gets a fresh :class:`PromptStream` over the *same*
prompt order and the same per-(prompt, sample) random draws, so the arms differ
in the strategy alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from april_bench.types import Prompt, Sample

__all__ = ["EpochOrder", "PromptStream", "ScriptedWorkload", "Workload"]


class PromptStream:
    """A deterministic stream of prompts; ``make(uid)`` builds the prompt drawn at position ``uid``."""

    def __init__(self, make: Callable[[int], Prompt], limit: int | None = None) -> None:
        self._make = make
        self._limit = limit
        self.consumed = 0

    def take(self, n: int) -> list[Prompt]:
        if self._limit is not None and self.consumed + n > self._limit:
            raise RuntimeError(
                f"the prompt stream is exhausted ({self._limit} prompts); "
                "lower --steps or allow more epochs over the data set"
            )
        prompts = [self._make(self.consumed + i) for i in range(n)]
        self.consumed += n
        return prompts


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

    def replay_len(self, prompt: Prompt, sample_index: int, start_step: int) -> int | None:
        return self._length(prompt.uid, sample_index)

    def reward(self, sample: Sample) -> float:
        return self._reward(sample.prompt.uid, sample.index)
