"""A verifiable task whose long tail comes from the task itself: division by repeated subtraction.

A problem ``n-k=`` asks for ``n mod k``, worked out by subtracting ``k`` until
less than ``k`` is left, writing every intermediate result::

    prompt   73-7=
    answer   66,59,52,45,38,31,24,17,10,3#3

The worked answer has ``n // k`` steps, so problems with a small divisor are
long, and every step is a chance to slip: harder problems need longer answers,
as in math RL.  A response is right when the number after ``#`` is ``n mod k``
(the steps themselves are not graded).  Divisors are drawn with weight ``k``,
so small divisors - long answers - are rare: the length distribution has a
heavy right tail (p99 about 5x the median with the defaults).

The ``(n, k)`` space is split deterministically three ways, as real pipelines
keep their data apart: one problem in ``heldout_every`` is held out for
evaluation; of the rest, a share ``sft_share`` is used only by the supervised
warm start and the remainder only as RL prompts.  RL therefore trains on
problems the warm start never saw, and evaluation on problems neither saw.
The tokenizer is a character vocabulary built here, with ``<pad>``, ``<bos>``,
``<eos>``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.evaluation import AvgAtK, EvalItem

__all__ = ["CharTokenizer", "Problem", "SyntheticTask", "synthetic_evaluator"]


class CharTokenizer:
    """One token per character, plus ``<pad>`` (0), ``<bos>`` (1) and ``<eos>`` (2)."""

    PAD, BOS, EOS = 0, 1, 2
    SPECIALS = ("<pad>", "<bos>", "<eos>")

    def __init__(self, alphabet: str) -> None:
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("alphabet characters must be unique")
        self.alphabet = alphabet
        self._ids = {ch: i + len(self.SPECIALS) for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.SPECIALS) + len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the alphabet {self.alphabet!r}") from None

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, stopping at ``<eos>`` and skipping other special tokens."""
        out = []
        for i in ids:
            if i == self.EOS:
                break
            if i >= len(self.SPECIALS):
                out.append(self.alphabet[i - len(self.SPECIALS)])
        return "".join(out)


@dataclass(frozen=True, slots=True)
class Problem:
    n: int
    k: int

    @property
    def prompt(self) -> str:
        return f"{self.n}-{self.k}="

    @property
    def answer(self) -> int:
        return self.n % self.k

    @property
    def steps(self) -> int:
        return self.n // self.k

    @property
    def solution(self) -> str:
        chain = [str(x) for x in range(self.n - self.k, -1, -self.k)]
        return ",".join(chain) + f"#{self.answer}"

    def grade(self, response: str) -> float:
        """1.0 if the text after the last ``#`` is ``n mod k``, else 0.0 (never raises)."""
        head, sep, tail = response.rpartition("#")
        del head
        return 1.0 if sep and tail.strip() == str(self.answer) else 0.0


class SyntheticTask(Configurable):
    """Problems, prompts, solutions and grading for the embedded default."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        min_n: int = param(10, help="smallest dividend")
        max_n: int = param(99, help="largest dividend")
        min_k: int = param(2, help="smallest divisor")
        max_k: int = param(19, help="largest divisor")
        heldout_every: int = param(5, help="one problem in this many is held out for evaluation")
        sft_share: float = param(0.5, help="share of the other problems kept for the warm start (rest: RL)")
        seed: int = param(0, help="seed of the training-problem order")

        def __post_init__(self) -> None:
            if not (2 <= self.min_k <= self.max_k < self.max_n and self.min_n <= self.max_n):
                raise ConfigError("need 2 <= min_k <= max_k < max_n and min_n <= max_n")
            if self.heldout_every < 2:
                raise ConfigError("heldout_every must be >= 2")
            if not 0 < self.sft_share < 1:
                raise ConfigError("sft_share must be in (0, 1)")

    ALPHABET = "0123456789-=,#"

    def __init__(self, config: Config) -> None:
        self.config = config
        self.tokenizer = CharTokenizer(self.ALPHABET)

    @cached_property
    def _split(self) -> dict[str, list[Problem]]:
        cfg = self.config
        parts: dict[str, list[Problem]] = {"sft": [], "rl": [], "heldout": []}
        for k in range(cfg.min_k, cfg.max_k + 1):
            for n in range(max(cfg.min_n, k + 1), cfg.max_n + 1):
                # a fixed pseudo-random split of the (n, k) space, independent of the seed
                h = (n * 7919 + k * 104729) * 2654435761 % (1 << 32)
                if h % cfg.heldout_every == 0:
                    parts["heldout"].append(Problem(n, k))
                else:
                    parts["sft" if (h >> 8) % 1000 < cfg.sft_share * 1000 else "rl"].append(Problem(n, k))
        return parts

    @property
    def sft_problems(self) -> list[Problem]:
        return self._split["sft"]

    @property
    def rl_problems(self) -> list[Problem]:
        return self._split["rl"]

    @property
    def heldout_problems(self) -> list[Problem]:
        return self._split["heldout"]

    def draw(self, split: str, index: int) -> Problem:
        """The ``index``-th draw from a split: divisors weighted by ``k`` (long answers are rare)."""
        rng = random.Random(f"{self.config.seed}:{split}:{index}")
        problems = self._split[split]
        return rng.choices(problems, weights=[p.k for p in problems])[0]

    def prompt_ids(self, problem: Problem) -> list[int]:
        return [CharTokenizer.BOS, *self.tokenizer.encode(problem.prompt)]

    def solution_ids(self, problem: Problem) -> list[int]:
        return [*self.tokenizer.encode(problem.solution), CharTokenizer.EOS]

    def grade(self, problem: Problem, response_ids: Sequence[int]) -> float:
        return problem.grade(self.tokenizer.decode(response_ids))


def synthetic_evaluator(
    task: SyntheticTask,
    *,
    max_new_tokens: int,
    samples: int = 4,
    temperature: float = 1.0,
    seed: int = 0,
    limit: int | None = None,
) -> AvgAtK:
    """avg@k on every held-out problem of the synthetic task (graded by its exact rule)."""
    problems = task.heldout_problems[:limit] if limit else task.heldout_problems
    items = [EvalItem("synthetic-heldout", p.prompt, tuple(task.prompt_ids(p)), p) for p in problems]

    def grade(item: EvalItem, output_ids: Sequence[int]) -> tuple[float, bool]:
        value = task.grade(item.reference, output_ids)
        return value, value >= 1.0

    return AvgAtK(
        items, grade, max_new_tokens=max_new_tokens, samples=samples, temperature=temperature, seed=seed
    )
