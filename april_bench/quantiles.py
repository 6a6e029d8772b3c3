"""The one quantile of april-bench: linear interpolation between closest ranks (numpy's default).

A neutral fact (it imports nothing of the package): the run summary's latency percentiles
(:mod:`april_bench.results.accumulate`), the bootstrap intervals (:mod:`april_bench.results.stats`)
and a data set's length percentiles (:mod:`april_bench.data.stats`) all read it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["quantile"]


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (``0 <= q <= 1``) of ``ordered`` (sorted, not empty)."""
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
