"""Measurement statistics: paired block gains with bootstrap intervals, and latency percentiles.

A single wall-clock ratio on a shared machine means little: a burst of load that
lands on one arm moves it by tens of points.  Measured sessions therefore run
interleaved in blocks of steps (ABBA), and the gain of an arm is estimated from
*pairs*: block ``b`` of repetition ``r`` of the arm against the same block of
the baseline, which ran next to it in time.  Reported per gain:

``median``
    the median over pairs of ``rate(arm) / rate(baseline) - 1``;
``ci``
    its 95% percentile-bootstrap interval (pairs resampled with replacement,
    2,000 resamples, a fixed seed: the interval is a pure function of the rows);
``half_width``
    half the interval's width, in the same units (0.05 = 5 points);
``pairs``
    how many (repetition, block) pairs there were; warm-up steps are left out.

Rates per block: ``throughput`` = generated tokens / rollout seconds, ``useful``
= trained tokens / rollout seconds, ``end_to_end`` = trained tokens / step
seconds - the block versions of the summary's ratio-of-totals gains, which are
reported beside them.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from april_bench.quantiles import quantile

__all__ = ["BOOTSTRAP_RESAMPLES", "block_rates", "bootstrap_median", "latency_percentiles", "paired_gains"]

Row = Mapping[str, Any]
BOOTSTRAP_RESAMPLES = 2000
_RATES = {
    "throughput": ("generated_tokens", "rollout_time_s"),
    "useful": ("trained_tokens", "rollout_time_s"),
    "end_to_end": ("trained_tokens", "step_time_s"),
}


def block_rates(steps: Iterable[Row], block_steps: int) -> dict[tuple[str, int, int], dict[str, float]]:
    """``(arm, repeat, block) -> {rate name: value}`` over the non-warm-up steps of each block."""
    sums: dict[tuple[str, int, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in steps:
        if s.get("warmup"):
            continue
        key = (s["arm"], s.get("repeat", 0), s["step"] // block_steps)
        for field in ("generated_tokens", "trained_tokens", "rollout_time_s", "step_time_s"):
            sums[key][field] += s.get(field, 0.0)
    rates: dict[tuple[str, int, int], dict[str, float]] = {}
    for key, total in sums.items():
        rates[key] = {name: total[num] / total[den] for name, (num, den) in _RATES.items() if total[den] > 0}
    return rates


def paired_gains(
    steps: Sequence[Row], *, baseline: str, block_steps: int, seed: int = 0
) -> dict[str, dict[str, dict[str, Any]]]:
    """``arm -> rate name -> {median, ci, half_width, pairs}`` against ``baseline``."""
    rates = block_rates(steps, block_steps)
    arms = list(dict.fromkeys(s["arm"] for s in steps))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for arm in arms:
        out[arm] = {}
        for name in _RATES:
            ratios = [
                value[name] / base[name] - 1
                for (a, repeat, block), value in sorted(rates.items())
                if a == arm
                and (base := rates.get((baseline, repeat, block))) is not None
                and name in value
                and base.get(name)
            ]
            median, low, high = bootstrap_median(ratios, seed=seed)
            out[arm][name] = {
                "median": median,
                "ci": None if low is None else [low, high],
                "half_width": None if low is None or high is None else (high - low) / 2,
                "pairs": len(ratios),
            }
    return out


def bootstrap_median(
    values: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95
) -> tuple[float | None, float | None, float | None]:
    """The median of ``values`` and its percentile-bootstrap interval (``None`` without data)."""
    if not values:
        return None, None, None
    median = _median(values)
    if len(values) == 1:
        return median, median, median
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(_median([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1 - level) / 2
    return median, quantile(medians, tail), quantile(medians, 1 - tail)


def latency_percentiles(requests: Iterable[Row], qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, Any]:
    """Time to first token, time per output token and end-to-end latency of finished requests,
    per arm: ``{arm: {"ttft_s": {"p50": ...}, "tpot_s": {...}, "e2e_s": {...}, "requests": n}}``."""
    by_arm: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in requests:
        if r["finish_reason"] == "abort":
            continue
        lat = by_arm[r["arm"]]
        lat["e2e_s"].append(r["t_done"] - r["t_submit"])
        if r.get("t_first_token") is not None:
            lat["ttft_s"].append(r["t_first_token"] - r["t_submit"])
            if r["output_len"] > 1:
                lat["tpot_s"].append((r["t_done"] - r["t_first_token"]) / (r["output_len"] - 1))
    out: dict[str, Any] = {}
    for arm, lat in by_arm.items():
        out[arm] = {"requests": len(lat["e2e_s"])}
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            values = sorted(lat.get(name, []))
            out[arm][name] = {f"p{round(q * 100)}": quantile(values, q) if values else None for q in qs}
    return out


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
