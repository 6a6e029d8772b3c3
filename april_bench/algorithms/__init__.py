"""Policy-optimisation algorithms.

Each algorithm is named by an :class:`AlgorithmSpec` that fixes what matters to
the rollout (DAPO's dynamic sampling) and the clip ranges of its loss
(``shared/docs/algorithms.md``; the values are those of APRIL's scripts).
"""

from __future__ import annotations

from dataclasses import dataclass

from april_bench.registry import Registry

__all__ = ["ALGORITHMS", "AlgorithmSpec"]


@dataclass(frozen=True, slots=True)
class AlgorithmSpec:
    name: str
    #: DAPO dynamic sampling: drop groups whose rewards are all equal and refill.
    dynamic_sampling: bool
    eps_clip_low: float
    eps_clip_high: float
    description: str


ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm")
ALGORITHMS.register(
    "grpo",
    AlgorithmSpec("grpo", False, 0.2, 0.28, "GRPO group-normalised advantages, clipped surrogate"),
    "GRPO (APRIL scripts: eps-clip 0.2 / 0.28)",
)
ALGORITHMS.register(
    "dapo",
    AlgorithmSpec("dapo", True, 0.2, 0.28, "GRPO + DAPO dynamic sampling (check_reward_nonzero_std)"),
    "DAPO: GRPO with clip-higher and dynamic sampling",
)
ALGORITHMS.register(
    "gspo",
    AlgorithmSpec("gspo", False, 0.2, 0.28, "GSPO sequence-level ratio (APRIL scripts keep 0.2 / 0.28)"),
    "GSPO: sequence-level importance ratio",
)
