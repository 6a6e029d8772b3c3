"""The math data sets april-bench knows: one row per data set, with its hub copy, template and grader.

This module imports nothing from the package, so loaders, templates, graders
and the CLI can all read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

__all__ = ["DATASETS", "DatasetSpec", "training_sets"]


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """A registered data set: where the hub copy lives and how its recipe prompts and grades it."""

    #: Registry name, e.g. ``"dapo-math-17k"``.
    name: str
    #: Hugging Face hub id loaded when no local ``path`` is given.
    hub_id: str
    #: Default hub split.
    split: str
    #: ``"train"`` (RL prompts) or ``"eval"`` (accuracy benchmarks).
    role: Literal["train", "eval"]
    #: Name of the recipe's prompt template in ``TEMPLATES``.
    template: str
    #: Which source field holds the reference answer (documentation only).
    answer_field: str
    #: One line on what the data set is.
    description: str
    #: The grader style its recipe used (``april_bench.graders``: dapo, deepscaler, math-verify).
    grader: str = "math-verify"
    #: Drop repeated problems by default (the DAPO parquets repeat each problem 32-100 times).
    dedupe: bool = True


DATASETS: Mapping[str, DatasetSpec] = MappingProxyType(
    {
        "dapo-math-17k": DatasetSpec(
            name="dapo-math-17k",
            grader="dapo",
            hub_id="BytedTsinghua-SIA/DAPO-Math-17k",
            split="train",
            role="train",
            template="dapo",
            answer_field="reward_model.ground_truth (open-r1: solution; slime: label)",
            description="DAPO's ~17.9k integer-answer problems (the hub parquet repeats each ~100 times)",
        ),
        "deepscaler": DatasetSpec(
            name="deepscaler",
            grader="deepscaler",
            hub_id="agentica-org/DeepScaleR-Preview-Dataset",
            split="train",
            role="train",
            template="deepscaler",
            answer_field="answer",
            description="DeepScaleR-Preview: 40,315 AMC/AIME/Omni-MATH/STILL/MATH problems",
            dedupe=False,  # the published file has a few repeated problems; keep it row for row
        ),
        "deepmath-103k": DatasetSpec(
            name="deepmath-103k",
            hub_id="zwhe99/DeepMath-103K",
            split="train",
            role="train",
            template="deepmath",
            answer_field="final_answer",
            description="DeepMath-103K: hard, decontaminated problems with three R1 solutions each",
            dedupe=False,
        ),
        # math-ai/aime24 is the sibling of math-ai/aime25 (which DeepMath evaluates on) and the copy slime's
        # eval preparation reads (split "test"; its `solution` column is "\boxed{N}", the answer is
        # unwrapped from it).  HuggingFaceH4/aime_2024 (split "train", an `answer` column) and
        # BytedTsinghua-SIA/AIME-2024 (the DAPO eval parquet) load too: pass hub_id= and split=.
        "aime-2024": DatasetSpec(
            name="aime-2024",
            hub_id="math-ai/aime24",
            split="test",
            role="eval",
            template="boxed",
            answer_field="answer (DAPO copy: reward_model.ground_truth; math-ai: \\boxed{} in solution)",
            description="AIME 2024 I and II: 30 problems, integer answers 0-999",
        ),
        "aime-2025": DatasetSpec(
            name="aime-2025",
            hub_id="math-ai/aime25",
            split="test",
            role="eval",
            template="boxed",
            answer_field="answer",
            description="AIME 2025 I and II: 30 problems, integer answers 0-999",
        ),
        "math-500": DatasetSpec(
            name="math-500",
            hub_id="HuggingFaceH4/MATH-500",
            split="test",
            role="eval",
            template="boxed",
            answer_field="answer",
            description="MATH-500: the 500-problem MATH test subset of 'Let's Verify Step by Step'",
        ),
    }
)


def training_sets() -> list[str]:
    """Names of the data sets RL trains on (the others are evaluation sets)."""
    return [name for name, spec in DATASETS.items() if spec.role == "train"]
