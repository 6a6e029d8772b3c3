"""Held-out evaluation through the engine: the accuracy curves are real evaluations of the policy.

Like APRIL's ``eval/aime`` (avg@16, the mean reward of 16 samples per
problem), accuracy is avg@k: every held-out problem is sampled ``k`` times at
the evaluation temperature and the rewards are averaged.  ``temperature=0``
with ``k=1`` gives greedy pass@1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from april_bench.engines.protocol import Engine, GenerateRequest, SamplingParams
from april_bench.seeding import sample_seed
from april_bench.tasks.synthetic import Problem, SyntheticTask

__all__ = ["EvalResult", "TaskEvaluator", "check_eval_sampling", "mean_and_stderr"]


@dataclass(frozen=True, slots=True)
class EvalResult:
    accuracy: float
    #: Standard error of ``accuracy`` over problems (each problem's avg@k is one observation).
    stderr: float
    n: int
    mean_response_len: float
    #: Per evaluation set, when there are several: ``{name: {"accuracy", "stderr", "problems"}}``.
    by_dataset: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: One tidy row per evaluation sample, when the evaluator keeps them.
    rows: Sequence[Any] = ()


def check_eval_sampling(samples: int, temperature: float) -> None:
    if samples < 1 or (temperature == 0 and samples > 1):
        raise ValueError("evaluation needs samples >= 1, and exactly 1 when greedy (temperature 0)")


def mean_and_stderr(scores: Sequence[float]) -> tuple[float, float]:
    """The mean of per-problem avg@k scores and its standard error over problems."""
    mean = sum(scores) / len(scores)
    spread = sum((s - mean) ** 2 for s in scores) / max(1, len(scores) - 1)
    return mean, math.sqrt(spread / len(scores))


class TaskEvaluator:
    """avg@k accuracy on every held-out problem of the synthetic task."""

    def __init__(
        self,
        task: SyntheticTask,
        *,
        max_new_tokens: int,
        samples: int = 4,
        temperature: float = 1.0,
        seed: int = 0,
        limit: int | None = None,
    ) -> None:
        check_eval_sampling(samples, temperature)
        self.task = task
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.temperature = temperature
        self.seed = seed
        self.problems = task.heldout_problems[:limit] if limit else task.heldout_problems
        self._calls = 0

    async def evaluate(self, engine: Engine) -> EvalResult:
        self._calls += 1
        requests, problems = [], {}
        for i, problem in enumerate(self.problems):
            ids = tuple(self.task.prompt_ids(problem))
            for j in range(self.samples):
                rid = f"eval{self._calls:04d}-{i:06d}-{j:03d}"
                # the same draws at every evaluation: accuracy moves only because the policy does
                sampling = SamplingParams(
                    temperature=self.temperature, seed=sample_seed(self.seed, -1 - i, j)
                )
                requests.append(GenerateRequest(rid, len(ids), self.max_new_tokens, sampling, input_ids=ids))
                problems[rid] = problem
        per_problem: dict[Problem, float] = {}
        tokens = 0
        async for c in engine.generate(requests):
            problem = problems[c.request_id]
            per_problem[problem] = per_problem.get(problem, 0.0) + self.task.grade(
                problem, c.output_ids or ()
            )
            tokens += c.num_tokens
        scores = [per_problem.get(p, 0.0) / self.samples for p in self.problems]
        mean, stderr = mean_and_stderr(scores)
        return EvalResult(
            accuracy=mean,
            stderr=stderr,
            n=len(requests),
            mean_response_len=tokens / len(requests),
        )
