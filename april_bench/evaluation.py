"""Held-out evaluation through the engine: the accuracy curves are real evaluations of the policy.

Like APRIL's ``eval/aime`` (avg@16, the mean reward of 16 samples per
problem), accuracy is avg@k: every evaluation problem is sampled ``k`` times at
the evaluation temperature and graded; a problem's score is its share of
correct samples, a set's accuracy the mean over its problems, and the run's
accuracy the mean over sets.  ``temperature=0`` with ``k=1`` gives greedy
pass@1.  The same seeds are drawn at every evaluation, so accuracy moves only
because the policy does.

One evaluator, :class:`AvgAtK`, serves every task: a task supplies the items
(prompt token ids and a reference) and a :class:`Grader` that scores a response.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from april_bench.engines.protocol import Engine, GenerateRequest, SamplingParams
from april_bench.seeding import sample_seed

__all__ = [
    "AvgAtK",
    "EvalItem",
    "EvalResult",
    "EvalRow",
    "Evaluator",
    "Grader",
    "check_eval_sampling",
    "mean_and_stderr",
]


@dataclass(frozen=True, slots=True)
class EvalResult:
    accuracy: float
    #: Standard error of ``accuracy`` over problems (each problem's avg@k is one observation).
    stderr: float
    n: int
    mean_response_len: float
    #: Per evaluation set: ``{name: {"accuracy", "stderr", "problems"}}``.
    by_dataset: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: One tidy row per evaluation sample.
    rows: Sequence[Any] = ()


@runtime_checkable
class Evaluator(Protocol):
    async def evaluate(self, engine: Engine) -> EvalResult:
        """Generate and grade every evaluation sample with ``engine``'s current weights."""
        ...

    def longest_prompt(self) -> int:
        """Tokens of the longest evaluation prompt (sizes the engine's context)."""
        ...


@dataclass(frozen=True, slots=True)
class EvalItem:
    """One evaluation problem: its set, id, prompt token ids and reference answer."""

    dataset: str
    source_id: str
    prompt_ids: tuple[int, ...]
    reference: Any


@dataclass(frozen=True, slots=True)
class EvalRow:
    """One evaluation sample: tidy, for the eval rows file."""

    dataset: str
    source_id: str
    sample: int
    score: float
    correct: bool
    response_len: int


class Grader(Protocol):
    def __call__(self, item: EvalItem, output_ids: Sequence[int]) -> tuple[float, bool]:
        """``(score, correct)`` of one response to ``item``."""
        ...


def check_eval_sampling(samples: int, temperature: float) -> None:
    if samples < 1 or (temperature == 0 and samples > 1):
        raise ValueError("evaluation needs samples >= 1, and exactly 1 when greedy (temperature 0)")


def mean_and_stderr(scores: Sequence[float]) -> tuple[float, float]:
    """The mean of per-problem avg@k scores and its standard error over problems."""
    mean = sum(scores) / len(scores)
    spread = sum((s - mean) ** 2 for s in scores) / max(1, len(scores) - 1)
    return mean, math.sqrt(spread / len(scores))


class AvgAtK:
    """avg@k accuracy over one or more evaluation sets, in one engine pass."""

    def __init__(
        self,
        items: Sequence[EvalItem],
        grade: Grader,
        *,
        max_new_tokens: int,
        samples: int = 4,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> None:
        if not items:
            raise ValueError("evaluation needs at least one problem")
        check_eval_sampling(samples, temperature)
        self.items = list(items)
        self.grade = grade
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.sets = list(dict.fromkeys(item.dataset for item in self.items))
        self._calls = 0

    def longest_prompt(self) -> int:
        return max(len(item.prompt_ids) for item in self.items)

    def requests(self) -> tuple[list[GenerateRequest], dict[str, tuple[EvalItem, int]]]:
        """This evaluation's requests, and each request id's item and sample index."""
        self._calls += 1
        requests, where = [], {}
        index: dict[str, int] = {}
        for item in self.items:
            i = index[item.dataset] = index.get(item.dataset, -1) + 1  # position within its set
            for j in range(self.samples):
                rid = f"eval{self._calls:04d}-{item.dataset}-{i:06d}-{j:03d}"
                sampling = SamplingParams(
                    temperature=self.temperature, top_p=self.top_p, seed=sample_seed(self.seed, -1 - i, j)
                )
                ids = item.prompt_ids
                requests.append(GenerateRequest(rid, len(ids), self.max_new_tokens, sampling, input_ids=ids))
                where[rid] = (item, j)
        return requests, where

    async def evaluate(self, engine: Engine) -> EvalResult:
        requests, where = self.requests()
        rows: list[EvalRow] = []
        async for c in engine.generate(requests):
            item, j = where[c.request_id]
            score, correct = self.grade(item, c.output_ids or ())
            rows.append(EvalRow(item.dataset, item.source_id, j, score, correct, c.num_tokens))
        return self.summarise(rows)

    def summarise(self, rows: Sequence[EvalRow]) -> EvalResult:
        per_problem: dict[tuple[str, str], list[bool]] = {}
        for item in self.items:
            per_problem.setdefault((item.dataset, item.source_id), [])
        for row in rows:
            per_problem[row.dataset, row.source_id].append(row.correct)
        details: dict[str, dict[str, float]] = {}
        for name in self.sets:
            scores = [sum(v) / self.samples for (d, _), v in per_problem.items() if d == name]
            mean, stderr = mean_and_stderr(scores)
            details[name] = {"accuracy": mean, "stderr": stderr, "problems": len(scores)}
        accuracies = [d["accuracy"] for d in details.values()]
        stderr = math.sqrt(sum(d["stderr"] ** 2 for d in details.values())) / len(details)
        return EvalResult(
            accuracy=sum(accuracies) / len(accuracies),
            stderr=stderr,
            n=len(rows),
            mean_response_len=sum(r.response_len for r in rows) / max(1, len(rows)),
            by_dataset=details,
            rows=rows,
        )
