"""Group filters applied during rollout (torch-free)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["keep_group"]


def keep_group(rewards: Sequence[float]) -> bool:
    """DAPO dynamic sampling: keep a group only if its rewards are not all equal
    (unbiased float64 std > 1e-6, slime ``check_reward_nonzero_std``)."""
    if len(rewards) < 2:
        return True
    mean = sum(rewards) / len(rewards)
    var = sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)
    return math.sqrt(var) > 1e-6
