"""The headline of a measured run, and the engine-work table: pure functions of a run's summary.

A measured gain is led by the **paired median** of interleaved (repetition, block) gains with its
bootstrap 95% interval (:mod:`april_bench.results.stats`); the ratio of totals follows as a
secondary number, because one burst of load on a shared machine moves it by tens of points.  When
the interval contains 0 the arms are **not distinguishable** and the table says so.

Beside it stand the **iteration-unit gains**: generated and trained tokens per engine iteration
(forward pass) against the baseline's.  They are counted, not timed, so they are exact for
april-bench's engines at any load; on a memory-bound accelerator, where a decode step costs about
the same at any batch size, they are the part of the gain the schedule buys (docs/measured.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "HEADLINE_COLUMNS",
    "MIN_PAIRS_FOR_VERDICT",
    "WORK_COLUMNS",
    "distinguishable",
    "has_work",
    "headline_table",
    "paired_cell",
    "wasteful",
    "work_table",
]

HEADLINE_COLUMNS = (
    "Strategy",
    "Throughput gain: paired median [95% CI]",
    "Verdict",
    "Useful gain: paired median [95% CI]",
    "End-to-end gain: paired median [95% CI]",
    "Throughput gain: ratio of totals",
    "Gain per engine iteration: generated / useful (exact)",
)

WORK_COLUMNS = (
    "Strategy",
    "Engine iterations/step",
    "Mean decode batch",
    "Gen tok/iteration",
    "Useful tok/iteration",
    "Prefill tok/step",
    "Re-prefill tok/step",
    "Gain/iteration: gen",
    "Gain/iteration: useful",
    "Schedule",
)


#: Fewer pairs than this give no verdict: a bootstrap over two pairs is their range, not an interval.
MIN_PAIRS_FOR_VERDICT = 3


def distinguishable(stats: Mapping[str, Any]) -> bool | None:
    """Whether a paired interval excludes 0 (``None``: no interval, or fewer than
    :data:`MIN_PAIRS_FOR_VERDICT` pairs, too few to say)."""
    ci = stats.get("ci")
    if ci is None or stats.get("pairs", 0) < MIN_PAIRS_FOR_VERDICT:
        return None
    return not ci[0] <= 0.0 <= ci[1]


def wasteful(m: Mapping[str, Any]) -> bool:
    """An arm that generates more tokens per rollout second than the baseline but trains fewer: its
    throughput gain (the paper's metric, which counts discarded tokens) is waste, flagged ``(!)``."""
    generated, useful = m.get("throughput_gain"), m.get("useful_gain")
    return generated is not None and useful is not None and generated > 0 > useful


def paired_cell(stats: Mapping[str, Any]) -> str:
    """'+41.2% [+33.0, +50.1] (12 pairs)', or the median alone when there is one pair."""
    median, ci, pairs = stats.get("median"), stats.get("ci"), stats.get("pairs", 0)
    if median is None:
        return "n/a"
    if pairs < 2 or ci is None:
        return f"{median * 100:+.1f}% (1 pair: no interval)"
    return f"{median * 100:+.1f}% [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}] ({pairs} pairs)"


def _verdict(stats: Mapping[str, Any], baseline: str) -> str:
    apart = distinguishable(stats)
    if apart is None:
        pairs = stats.get("pairs", 0)
        return (
            f"no verdict: {pairs} pair{'s' if pairs != 1 else ''} (a verdict needs {MIN_PAIRS_FOR_VERDICT}; "
            "rerun with more --repeats or steps)"
        )
    if not apart:
        return f"not distinguishable from {baseline} (the interval contains 0)"
    return f"{'faster' if stats['median'] > 0 else 'slower'} than {baseline} (the interval excludes 0)"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%"


def headline_table(summary: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """One row per non-baseline arm, the paired median first."""
    rows = []
    for arm, m in summary.items():
        baseline = m.get("baseline")
        if arm == baseline:
            continue
        paired = m.get("paired_gains", {})
        rows.append(
            [
                arm,
                paired_cell(paired.get("throughput", {})) + (" (!)" if wasteful(m) else ""),
                _verdict(paired.get("throughput", {}), str(baseline)),
                paired_cell(paired.get("useful", {})),
                paired_cell(paired.get("end_to_end", {})),
                _pct(m.get("throughput_gain")),
                f"{_pct(m.get('iteration_throughput_gain'))} / {_pct(m.get('iteration_useful_gain'))}",
            ]
        )
    return rows


def has_work(summary: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether the run's engine counted its work (every arm has engine iterations)."""
    return bool(summary) and all(m.get("engine_iterations") for m in summary.values())


def work_table(summary: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """Per arm: the engine's counted work and the iteration-unit rates and gains."""
    rows = []
    for arm, m in summary.items():
        steps = m.get("steps") or 0
        is_base = arm == m.get("baseline")
        deterministic = m.get("work_deterministic")
        rows.append(
            [
                arm,
                _per(m.get("engine_iterations"), steps),
                _num(m.get("mean_decode_batch"), "{:.1f}"),
                _num(m.get("generated_tokens_per_iteration"), "{:.2f}"),
                _num(m.get("useful_tokens_per_iteration"), "{:.2f}"),
                _per(m.get("prefill_tokens"), steps),
                _per(m.get("reprefill_tokens"), steps),
                "baseline" if is_base else _pct(m.get("iteration_throughput_gain")),
                "baseline" if is_base else _pct(m.get("iteration_useful_gain")),
                "deterministic" if deterministic else "timing-dependent" if deterministic is False else "n/a",
            ]
        )
    return rows


def _per(total: float | None, steps: int) -> str:
    return "n/a" if total is None or not steps else f"{total / steps:,.0f}"


def _num(value: Any, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)
