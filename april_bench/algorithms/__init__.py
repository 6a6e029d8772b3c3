"""Policy-optimisation algorithms.

Each algorithm is named by an :class:`AlgorithmSpec` that fixes what matters to
the rollout (DAPO's dynamic sampling).  The losses, their clip ranges and
aggregations are the presets of :mod:`april_bench.algorithms.losses`
(``LossConfig.for_algorithm``), which imports torch and is loaded only to train.
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
    description: str


ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm")
ALGORITHMS.register(
    "grpo",
    AlgorithmSpec("grpo", False, "group-normalised advantages, clipped surrogate, clip 0.2 / 0.28"),
    "GRPO (APRIL scripts: eps-clip 0.2 / 0.28)",
)
ALGORITHMS.register(
    "dapo",
    AlgorithmSpec("dapo", True, "clip-higher, token-mean loss, overlong penalty, dynamic sampling"),
    "DAPO: GRPO with clip-higher and dynamic sampling",
)
ALGORITHMS.register(
    "gspo",
    AlgorithmSpec("gspo", False, "sequence-level length-normalised ratio, clip 3e-4 / 4e-4"),
    "GSPO: sequence-level importance ratio",
)
