"""What partial rollouts cost a real engine: re-prefilled tokens on resume, and log-prob agreement.

Computed from a run's rows only:

* **re-prefill** (``requests`` rows): a resumed request (``prefix_len > 0``)
  sends the prompt and the partial response again, and the engine prefills all
  ``prompt_len + prefix_len`` of them unless its prefix cache still holds them
  (weight updates flush it, so after a step boundary it mostly does not).  The
  engine's own prefix-cache counters, where it reports them (``engine_metrics``
  rows), say how much of all prompt work the cache saved;
* **log-prob gap** (``steps`` rows, the trainer's ``engine_logprob_gap_*``
  metrics): for tokens sampled by the weights the trainer holds, the mean and
  largest ``|engine log-prob - trainer log-prob|``, i.e. how far the engine's
  numerics (kernels, dtype, batching) are from the trainer's for the same tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["ENGINE_COLUMNS", "engine_report", "engine_table", "prefix_cache"]

Row = Mapping[str, Any]


def engine_report(tables: Mapping[str, Iterable[Row]]) -> dict[str, dict[str, Any]]:
    """Per arm: re-prefilled tokens, prefix-cache hit rate, and the engine-trainer log-prob gap."""
    requests = _by_arm(tables.get("requests", ()))
    steps = _by_arm(tables.get("steps", ()))
    metrics = _by_arm(tables.get("engine_metrics", ()))
    return {
        arm: {
            **_reprefill(requests.get(arm, []), len(arm_steps)),
            **prefix_cache(metrics.get(arm, [])),
            **_logprob_gap(arm_steps),
        }
        for arm, arm_steps in steps.items()
    }


def _reprefill(requests: Sequence[Row], steps: int) -> dict[str, Any]:
    # rows from older runs (or hand-written ones) may lack the lengths: they count as fresh, empty
    resumed = [r for r in requests if r.get("prefix_len", 0) > 0]
    prefilled = sum(_input_len(r) for r in requests)
    again = sum(_input_len(r) for r in resumed)
    return {
        "resumed_requests": len(resumed),
        "reprefilled_tokens": again,
        "reprefilled_partial_tokens": sum(r["prefix_len"] for r in resumed),
        "reprefilled_tokens_per_step": again / steps if steps else None,
        "reprefill_share_of_prefill": again / prefilled if prefilled else None,
    }


def _input_len(request: Row) -> int:
    return int(request.get("prompt_len", 0)) + int(request.get("prefix_len", 0))


def prefix_cache(rows: Sequence[Row]) -> dict[str, Any]:
    """Hits over queries of the engine's monotonic counters, summed over its repeats (one engine each)."""
    last: dict[int, Mapping[str, float]] = {}
    for row in sorted(rows, key=lambda r: r.get("t", 0.0)):
        last[row.get("repeat", 0)] = row["metrics"]
    queries = sum(m.get("prefix_cache_queries", 0.0) for m in last.values())
    hits = sum(m.get("prefix_cache_hits", 0.0) for m in last.values())
    return {"prefix_cache_hit_rate": hits / queries if queries else None}


def _logprob_gap(steps: Sequence[Row]) -> dict[str, Any]:
    measured = [
        s["train_metrics"] for s in steps if "engine_logprob_tokens" in (s.get("train_metrics") or {})
    ]
    tokens = sum(m["engine_logprob_tokens"] for m in measured)
    if not tokens:
        return {"logprob_gap_mean": None, "logprob_gap_max": None, "logprob_gap_tokens": 0}
    mean = sum(m["engine_logprob_gap_mean"] * m["engine_logprob_tokens"] for m in measured) / tokens
    return {
        "logprob_gap_mean": mean,
        "logprob_gap_max": max(m["engine_logprob_gap_max"] for m in measured),
        "logprob_gap_tokens": int(tokens),
    }


def _by_arm(rows: Iterable[Row]) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[row["arm"]].append(row)
    return grouped


ENGINE_COLUMNS = (
    "Arm",
    "Resumed requests",
    "Re-prefilled tok",
    "of them partial",
    "Re-prefilled/step",
    "Share of prefill",
    "Prefix-cache hits",
    "Logprob gap mean",
    "Logprob gap max",
)


def engine_table(summary: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """One row per arm from ``summary[arm]["engine"]`` (what :func:`engine_report` computed)."""
    rows = []
    for arm, m in summary.items():
        e = m.get("engine") or {}
        rows.append(
            [
                arm,
                _num(e.get("resumed_requests"), "{:,}"),
                _num(e.get("reprefilled_tokens"), "{:,}"),
                _num(e.get("reprefilled_partial_tokens"), "{:,}"),
                _num(e.get("reprefilled_tokens_per_step"), "{:,.0f}"),
                _num(e.get("reprefill_share_of_prefill"), "{:.0%}"),
                _num(e.get("prefix_cache_hit_rate"), "{:.0%}"),
                _num(e.get("logprob_gap_mean"), "{:.2e}"),
                _num(e.get("logprob_gap_max"), "{:.2e}"),
            ]
        )
    return rows


def _num(value: Any, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)
