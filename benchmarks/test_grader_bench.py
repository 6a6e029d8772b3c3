"""Micro-benchmark: one grader call per style on typical answers (``pytest benchmarks --benchmark-only``).

Rewards are scored on the rollout's critical path, so a grader's time per call matters.  Each case is
a response of a few hundred characters of reasoning that ends in the answer the style reads (an
``Answer:`` line for dapo, ``\\boxed{}`` for the others), graded right and wrong.  Agreement with real
labels and the adversarial worst case are ``benchmarks/grader_bench.py``'s job.
"""

from __future__ import annotations

from typing import Any

import pytest

from april_bench.graders import correct_value, score, wrong_value

REASONING = "We expand the product and collect terms; the quadratic has discriminant 49, so " * 4
CASES = {
    "dapo": (REASONING + "\nAnswer: 12", "12"),
    "deepscaler": (REASONING + "so the answer is \\boxed{\\frac{3}{4}}.", "0.75"),
    "math-verify": (REASONING + "so the answer is \\boxed{\\frac{3}{4}}.", "\\frac{3}{4}"),
}


@pytest.mark.benchmark(group="grader")
@pytest.mark.parametrize("style", list(CASES))
@pytest.mark.parametrize("right", [True, False], ids=["right", "wrong"])
def test_grader_call(benchmark: Any, style: str, right: bool) -> None:
    response, reference = CASES[style]
    if not right:
        reference = "13"
    reward = benchmark(score, style, response, reference)
    assert reward == (correct_value(style) if right else wrong_value(style))
