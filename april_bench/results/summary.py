"""Per-arm metrics: pure functions of the request, sample and step rows.

Definitions (all totals over the arm's steps, so long steps weigh more):

``generated_tokens_per_s``
    every token the engine produced (discarded ones included) / rollout time:
    APRIL's ``partial_rollout/tokens_throughput``.
``useful_tokens_per_s``
    response tokens of trained samples / rollout time.
``tokens_throughput_step_mean``, ``throughput_gain_step_mean``
    APRIL's ``tokens_throughput`` as the paper logged it, per step (the step's
    generated tokens / its rollout time), averaged over the arm's steps, and its
    ratio to the baseline's minus 1: beside the ratio of totals, where long
    steps weigh more.
``gain_decomposition``
    where the throughput and useful-token gains over the baseline come from
    (the tail, concurrency, the body, not discarding work;
    :mod:`april_bench.results.decomposition`); ``None`` for the baseline.
``baseline``
    the arm every gain is measured against: ``sync`` when the run has it,
    else the first arm (or the one asked for).
``throughput_gain``
    ``generated_tokens_per_s`` / the baseline arm's - 1 (``None`` for the
    baseline itself is not special: it is 0).
``useful_gain``, ``end_to_end_gain``
    the same ratio for useful tokens per rollout second, and for trained tokens
    per step second (rollout + train + weight sync).
``engine_iterations``, ``decode_iterations``, ``decode_tokens``, ``prefill_tokens``, ``reprefill_tokens``
    the engine's own work over the arm's rollouts (step rows; ``None`` when the engine does not
    count it): forward passes, decode steps, tokens they sampled, input tokens prefilled, and of
    them those of resumed requests.  ``work_deterministic``: the counts depend on the requests and
    seeds alone (april-bench's engines), not on timing (vLLM).
``mean_decode_batch``
    decode tokens / decode iterations: the batch occupancy of the average decode step.
``generated_tokens_per_iteration``, ``useful_tokens_per_iteration``
    generated (trained) tokens per engine iteration: rates that become time only where every
    iteration costs the same.  On a memory-bound accelerator a decode step costs about the same
    at any batch size, so these are the part of a strategy's throughput that its schedule buys
    (docs/measured.md: their limits).
``iteration_throughput_gain``, ``iteration_useful_gain``
    the same ratio against the baseline arm, in those units: exact for deterministic engines.
``rollout_efficiency``
    generated tokens / sum over steps of (rollout time x the engine's saturated
    tokens/s at the step's peak concurrency and mean context): 1 means no tail.
``tail_time_share``
    time from the completion of the ceil(0.9 n)-th finished request to the end
    of the rollout, over rollout time (Seer's "last 10%").
``off_policy_token_ratio``
    trained response tokens produced by a policy older than the one trained,
    over trained response tokens, from per-token versions (correct for
    samples resumed several times).
``off_policy_ratio_reference_def``
    APRIL's own ``partial_rollout/off_policy_ratio``, bugs included, to compare
    with its README's "about 40%": per resumed request it counts only the
    previous segment's tokens, and divides by (new tokens + those).  (Each
    repetition's samples are their own: before the summary was accumulated
    row by row, a run with ``--repeats`` mixed the repetitions' segments.)
``max_version_span``
    over trained samples, newest minus oldest version among its tokens.
``paired_gains``
    ``{throughput|useful|end_to_end: {median, ci, half_width, pairs}}``: the
    same gains from interleaved (repetition, block) pairs, with a bootstrap
    interval (:mod:`april_bench.results.stats`).
``gpu``
    with telemetry rows (measured runs on a GPU): per phase (rollout, tail,
    drain, train, weight_sync, step) the GPU-busy share, idle GPU-seconds,
    mean SM clock and energy, and energy per trained token
    (:mod:`april_bench.telemetry.metrics`); ``None`` without telemetry.
``latency``
    percentiles of time to first token, time per output token and end-to-end
    latency of the arm's finished requests.
``accuracy_improvement``, ``accuracy_improvement_equal_time``
    accuracy minus the baseline's, in absolute terms (points / 100).
``accuracy``, ``accuracy_equal_time``
    held-out accuracy after the last step (every arm runs the same number of
    steps, so this is the equal-steps comparison), and at the largest training
    time every arm reached (the last evaluation at or before it): equal
    wall-clock.  ``None`` when nothing was evaluated (always, for a simulated run).
``failures``
    replica failures and what they cost, from the events table (``None``: none):
    :mod:`april_bench.results.faults`.
``wasted_tokens``
    tokens generated and never trained: dropped groups and restarts.  With the
    tokens still buffered at the end, generated = trained + wasted + buffered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from april_bench.results.accumulate import WORK_FIELDS, SummaryAccumulator
from april_bench.results.decomposition import decompose
from april_bench.results.stats import paired_gains

__all__ = ["WORK_FIELDS", "default_baseline", "summarize", "summary_of"]

Row = Mapping[str, Any]


def summarize(
    tables: Mapping[str, Iterable[Row]], *, baseline: str | None = None, block_steps: int | None = None
) -> dict[str, dict[str, Any]]:
    """Metrics per arm, keyed by arm name (in the order arms appear in the ``steps`` table).

    ``tables`` maps table names (``requests``, ``samples``, ``steps``, ``evals``) to rows; missing
    tables are empty.  ``baseline`` defaults to :func:`default_baseline`.  ``block_steps`` sets the
    blocks of the paired gain statistics (:mod:`april_bench.results.stats`; default: one block).
    The rows go through a :class:`~april_bench.results.accumulate.SummaryAccumulator` once, table by
    table, so ``tables`` may stream them (a run directory's files are read row by row).
    """
    accumulator = SummaryAccumulator()
    for name in ("requests", "samples", "steps", "evals", "engine_metrics", "events", "iterations"):
        for row in tables.get(name, ()):
            accumulator.add(name, row)
    telemetry = list(tables.get("telemetry", ()))
    gpu = _gpu(tables, telemetry) if telemetry else {}
    return summary_of(accumulator, baseline=baseline, block_steps=block_steps, gpu=gpu)


def summary_of(
    accumulator: SummaryAccumulator,
    *,
    baseline: str | None = None,
    block_steps: int | None = None,
    gpu: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """The per-arm metrics of the rows ``accumulator`` has seen (see :func:`summarize`)."""
    summary = {arm: accumulator.arm_metrics(arm) for arm in accumulator.arms()}
    _accuracy(summary, list(accumulator.evals))
    baseline = baseline or default_baseline(list(summary))
    base = summary.get(baseline) if baseline is not None else None
    steps = accumulator.step_rows()
    block = block_steps or accumulator.max_step + 1
    paired = paired_gains(steps, baseline=baseline, block_steps=block) if baseline else {}
    for metrics in summary.values():
        metrics["baseline"] = baseline
        metrics["throughput_gain"] = _gain(metrics, base, "generated_tokens_per_s")
        metrics["throughput_gain_step_mean"] = _gain(metrics, base, "tokens_throughput_step_mean")
        metrics["useful_gain"] = _gain(metrics, base, "useful_tokens_per_s")
        metrics["end_to_end_gain"] = _gain(metrics, base, "trained_tokens_per_step_s")
        metrics["iteration_throughput_gain"] = _gain(metrics, base, "generated_tokens_per_iteration")
        metrics["iteration_useful_gain"] = _gain(metrics, base, "useful_tokens_per_iteration")
        metrics["accuracy_improvement"] = _accuracy_gain(metrics, base, "accuracy")
        metrics["accuracy_improvement_equal_time"] = _accuracy_gain(metrics, base, "accuracy_equal_time")
    for arm, metrics in summary.items():
        metrics["gain_decomposition"] = None if base is None or arm == baseline else decompose(metrics, base)
        metrics["gpu"] = (gpu or {}).get(arm)
        metrics["engine"] = accumulator.engine(arm)
        metrics["paired_gains"] = paired.get(arm, {})
        metrics["latency"] = accumulator.latency(arm)
        metrics["repeats"] = accumulator.repeats(arm)
        episodes = accumulator.episodes(arm)
        if episodes is not None:  # multi-turn runs only (docs/agents.md)
            metrics["episodes"] = episodes
    return summary


def default_baseline(arms: Sequence[str]) -> str | None:
    """The arm gains are measured against: ``sync`` when present, else the first arm."""
    if "sync" in arms:
        return "sync"
    return arms[0] if arms else None


def _accuracy(summary: dict[str, dict[str, Any]], evals: list[Row]) -> None:
    by_arm: dict[str, list[Row]] = defaultdict(list)
    for row in evals:
        by_arm[row["arm"]].append(row)
    finished = [max(r["train_time_s"] for r in rows) for rows in by_arm.values() if rows]
    budget = min(finished) if finished else None
    for arm, metrics in summary.items():
        rows = sorted(by_arm.get(arm, []), key=lambda r: r["train_time_s"])
        metrics["accuracy_start"] = rows[0]["accuracy"] if rows else None
        metrics["accuracy"] = rows[-1]["accuracy"] if rows else None
        metrics["accuracy_stderr"] = rows[-1].get("accuracy_stderr") if rows else None
        within = [r for r in rows if budget is not None and r["train_time_s"] <= budget * (1 + 1e-9)]
        metrics["accuracy_equal_time"] = within[-1]["accuracy"] if within else None
        metrics["accuracy_equal_time_stderr"] = within[-1].get("accuracy_stderr") if within else None
        metrics["equal_time_budget_s"] = budget if rows else None
        metrics["accuracy_curve"] = [[r["step"], round(r["train_time_s"], 3), r["accuracy"]] for r in rows]


def _gain(metrics: Mapping[str, Any], base: Mapping[str, Any] | None, key: str) -> float | None:
    if base is None or not base.get(key) or metrics.get(key) is None:
        return None
    return metrics[key] / base[key] - 1


def _accuracy_gain(metrics: Mapping[str, Any], base: Mapping[str, Any] | None, key: str) -> float | None:
    """Absolute accuracy difference against the baseline (percentage points / 100)."""
    if base is None or metrics.get(key) is None or base.get(key) is None:
        return None
    return metrics[key] - base[key]


def _gpu(tables: Mapping[str, Iterable[Row]], telemetry: list[Row]) -> dict[str, Any]:
    """Per-arm GPU busy share, idle GPU-seconds and energy (:func:`april_bench.telemetry.gpu_summary`)."""
    from april_bench.telemetry.metrics import gpu_summary

    return gpu_summary(
        telemetry,
        tables.get("events", ()),
        tables.get("steps", ()),
        tables.get("requests", ()),
        tables.get("samples", ()),
    )
