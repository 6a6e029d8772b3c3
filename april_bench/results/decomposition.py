"""Where a strategy's gain comes from: the tail, fuller batches, concurrency, or not discarding work.

A pure function of two arms' summary metrics (themselves pure functions of the
run's rows, :mod:`april_bench.results.summary`), so a reader can see whether a
gain agrees with the paper *for the paper's reason*: APRIL's argument is the
long tail (a few long responses keep a step open while its batch empties and
the engine idles), which is ``tail`` (the last 10% of requests) and ``fill``
(the batch emptying before that); ``concurrency`` is what launching more
requests buys whatever the lengths.

The throughput gain ``G`` (generated tokens per rollout second, APRIL's
``tokens_throughput``, against the baseline) is an exact product of three
ratios, arm over baseline::

    1 + G = tail x fill x concurrency

``tail``
    ``(1 - tail_time_share)``: the share of rollout time *before* the last 10%
    of the step's requests (``tail_time_share``: after the ceil(0.9 n)-th
    finished).  Less time in the tail, more throughput.
``concurrency``
    the engine's saturated tokens/s at each step's peak concurrency and mean
    context, time-weighted (``generated_tokens_per_s / rollout_efficiency``):
    what more requests in flight buy, at the engine's cost curve.
``fill``
    ``rollout_efficiency / (1 - tail_time_share)``: how much of that saturated
    rate the time outside the tail reaches: batches below the step's peak while
    requests finish one by one (and the ramp-up, and the tail's own tokens);
    the rest of the product.

The useful-token gain ``U`` (trained tokens per rollout second) is ``1 + U =
(1 + G) x keep``, ``keep`` = the arm's trained share of its generated tokens
over the baseline's: **not discarding work**.  APRIL's headline metric counts
discarded tokens, so ``keep`` moves ``U``, never ``G``.

Points: each factor gets the share of the gain its logarithm has
(``G x ln f / ln(1 + G)``), so ``tail + fill + concurrency == G`` exactly and
``discard == U - G``.  Without a saturated rate (a measured engine that reports
none) ``concurrency`` is ``None`` and ``fill`` holds everything but the tail.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["DECOMPOSITION_FIELDS", "decompose"]

#: The fields of :func:`decompose`'s answer (points as fractions of the baseline: 0.05 = 5 points).
DECOMPOSITION_FIELDS = (
    "throughput_gain",
    "tail",
    "fill",
    "concurrency",
    "useful_gain",
    "discard",
    "tail_factor",
    "fill_factor",
    "concurrency_factor",
    "keep_factor",
)


def decompose(arm: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, float | None] | None:
    """The decomposition of ``arm``'s gains over ``base`` (two arms' summary metrics), or ``None``
    when a rate, a tail share or a token count it needs is missing (or a tail fills a whole rollout)."""
    rate, base_rate = arm.get("generated_tokens_per_s"), base.get("generated_tokens_per_s")
    tail, base_tail = arm.get("tail_time_share"), base.get("tail_time_share")
    if not rate or not base_rate or tail is None or base_tail is None or tail >= 1 or base_tail >= 1:
        return None
    ratio = rate / base_rate
    tail_factor = (1 - tail) / (1 - base_tail)
    efficiency, base_efficiency = arm.get("rollout_efficiency"), base.get("rollout_efficiency")
    concurrency_factor: float | None = None
    if efficiency and base_efficiency:
        concurrency_factor = (rate / efficiency) / (base_rate / base_efficiency)
    fill_factor = ratio / tail_factor / (concurrency_factor or 1.0)
    gain = ratio - 1

    def points(factor: float | None) -> float | None:
        if factor is None:
            return None
        log_ratio = math.log(ratio)
        if abs(log_ratio) < 1e-12:  # no gain: the shares are the log factors themselves (they sum to ~0)
            return math.log(factor)
        return gain * math.log(factor) / log_ratio

    keep_factor = None
    useful_gain = None
    generated, base_generated = arm.get("generated_tokens"), base.get("generated_tokens")
    trained, base_trained = arm.get("trained_tokens"), base.get("trained_tokens")
    if generated and base_generated and trained is not None and base_trained:
        keep_factor = (trained / generated) / (base_trained / base_generated)
        useful_gain = ratio * keep_factor - 1
    return {
        "throughput_gain": gain,
        "tail": points(tail_factor),
        "fill": points(fill_factor),
        "concurrency": points(concurrency_factor),
        "useful_gain": useful_gain,
        "discard": None if useful_gain is None else useful_gain - gain,
        "tail_factor": tail_factor,
        "fill_factor": fill_factor,
        "concurrency_factor": concurrency_factor,
        "keep_factor": keep_factor,
    }
