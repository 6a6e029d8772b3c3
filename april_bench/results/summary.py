"""Per-arm metrics: pure functions of the request, sample and step rows.

Definitions (all totals over the arm's steps, so long steps weigh more):

``generated_tokens_per_s``
    every token the engine produced (discarded ones included) / rollout time:
    APRIL's ``partial_rollout/tokens_throughput``.
``useful_tokens_per_s``
    response tokens of trained samples / rollout time.
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
    generated (trained) tokens per engine iteration: the hardware-neutral rates.  On a
    memory-bound accelerator a decode step costs about the same at any batch size, so these are
    the part of a strategy's throughput that its schedule buys (docs/measured.md: their limits).
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
    previous segment's tokens, and divides by (new tokens + those).
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
``wasted_tokens``
    tokens generated and never trained: dropped groups and restarts.  With the
    tokens still buffered at the end, generated = trained + wasted + buffered.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from april_bench.results.engine_report import engine_report
from april_bench.results.stats import latency_percentiles, paired_gains

__all__ = ["WORK_FIELDS", "default_baseline", "summarize"]

Row = Mapping[str, Any]


def summarize(
    tables: Mapping[str, Iterable[Row]], *, baseline: str | None = None, block_steps: int | None = None
) -> dict[str, dict[str, Any]]:
    """Metrics per arm, keyed by arm name (in the order arms appear in the ``steps`` table).

    ``tables`` maps table names (``requests``, ``samples``, ``steps``, ``evals``) to rows; missing
    tables are empty.  ``baseline`` defaults to :func:`default_baseline`.  ``block_steps`` sets the
    blocks of the paired gain statistics (:mod:`april_bench.results.stats`; default: one block).
    """
    by_arm = {name: _by_arm(tables.get(name, ())) for name in ("requests", "samples", "steps")}
    summary = {
        arm: _arm_metrics(arm_steps, by_arm["requests"].get(arm, []), by_arm["samples"].get(arm, []))
        for arm, arm_steps in by_arm["steps"].items()
    }
    _accuracy(summary, list(tables.get("evals", ())))
    baseline = baseline or default_baseline(list(summary))
    base = summary.get(baseline) if baseline is not None else None
    steps = list(tables.get("steps", ()))
    block = block_steps or max((s["step"] for s in steps), default=0) + 1
    paired = paired_gains(steps, baseline=baseline, block_steps=block) if baseline else {}
    latency = latency_percentiles(tables.get("requests", ()))
    for metrics in summary.values():
        metrics["baseline"] = baseline
        metrics["throughput_gain"] = _gain(metrics, base, "generated_tokens_per_s")
        metrics["useful_gain"] = _gain(metrics, base, "useful_tokens_per_s")
        metrics["end_to_end_gain"] = _gain(metrics, base, "trained_tokens_per_step_s")
        metrics["iteration_throughput_gain"] = _gain(metrics, base, "generated_tokens_per_iteration")
        metrics["iteration_useful_gain"] = _gain(metrics, base, "useful_tokens_per_iteration")
        metrics["accuracy_improvement"] = _accuracy_gain(metrics, base, "accuracy")
        metrics["accuracy_improvement_equal_time"] = _accuracy_gain(metrics, base, "accuracy_equal_time")
    engine = engine_report(tables)
    telemetry = list(tables.get("telemetry", ()))
    gpu = _gpu(tables, telemetry) if telemetry else {}
    for arm, metrics in summary.items():
        metrics["gpu"] = gpu.get(arm)
        metrics["engine"] = engine.get(arm)
        metrics["paired_gains"] = paired.get(arm, {})
        metrics["latency"] = latency.get(arm, {})
        metrics["repeats"] = len({s.get("repeat", 0) for s in steps if s["arm"] == arm})
    return summary


def default_baseline(arms: Sequence[str]) -> str | None:
    """The arm gains are measured against: ``sync`` when present, else the first arm."""
    if "sync" in arms:
        return "sync"
    return arms[0] if arms else None


def _by_arm(rows: Iterable[Row]) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[row["arm"]].append(row)
    return grouped


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


def _arm_metrics(steps: Sequence[Row], requests: Sequence[Row], samples: Sequence[Row]) -> dict[str, Any]:
    rollout = sum(s["rollout_time_s"] for s in steps)
    step_time = sum(s["step_time_s"] for s in steps)
    generated = sum(r["output_len"] for r in requests)
    trained = [s for s in samples if s["fate"] == "trained"]
    dropped = [s for s in samples if s["fate"] == "dropped"]
    buffered = [s for s in samples if s["fate"] == "buffered"]
    trained_tokens = sum(s["response_len"] for s in trained)
    wasted = sum(s["response_len"] for s in dropped) + sum(s["discarded_tokens"] for s in samples)
    off_policy = sum(s["off_policy_tokens"] for s in trained)
    n = len(steps)
    return {
        "steps": n,
        "rollout_time_s": rollout,
        "rollout_time_per_step_s": rollout / n if n else None,
        "step_time_s": step_time,
        "step_time_per_step_s": step_time / n if n else None,
        "train_time_per_step_s": sum(s["train_time_s"] for s in steps) / n if n else None,
        "weight_sync_time_per_step_s": sum(s["weight_sync_time_s"] for s in steps) / n if n else None,
        "generated_tokens": generated,
        "trained_tokens": trained_tokens,
        "wasted_tokens": wasted,
        "buffered_tokens_at_end": sum(s["response_len"] for s in buffered),
        "generated_tokens_per_s": generated / rollout if rollout else None,
        "useful_tokens_per_s": trained_tokens / rollout if rollout else None,
        "trained_tokens_per_step_s": trained_tokens / step_time if step_time else None,
        **_work(steps, generated, trained_tokens),
        "rollout_efficiency": _efficiency(steps, generated),
        "tail_time_share": _tail_share(steps, requests),
        "off_policy_token_ratio": off_policy / trained_tokens if trained_tokens else None,
        "off_policy_ratio_reference_def": _reference_off_policy(requests, generated),
        "max_version_span": max((_span(s["version_runs"]) for s in trained), default=0),
        "max_staleness": max((_staleness(s) for s in trained), default=0),
        "partial_samples": sum(s["partial_samples"] for s in steps),
        "restarted_samples": sum(s["restarted_samples"] for s in steps),
        "rejected_groups": sum(s["rejected_groups"] for s in steps),
        "dropped_groups": sum(s["dropped_groups"] for s in steps),
        "truncated_share": _share(trained, lambda s: s["status"] == "truncated"),
        "mean_response_len": trained_tokens / len(trained) if trained else None,
        "prompts": _prompt_accounting(samples),
        "abort_rounds": sum(s["abort_rounds"] for s in steps),
        "bookkeeping_s_per_step": sum(s["bookkeeping_s"] for s in steps) / n if n else None,
        "bookkeeping_share_of_engine_time": sum(s["bookkeeping_s"] for s in steps) / rollout
        if rollout
        else None,
    }


WORK_FIELDS = (
    "engine_iterations",
    "decode_iterations",
    "decode_tokens",
    "prefill_tokens",
    "reprefill_tokens",
)


def _work(steps: Sequence[Row], generated: int, trained: int) -> dict[str, Any]:
    """The engine's work totals and the per-iteration rates (``None`` unless every step counted it)."""
    counted = bool(steps) and all(s.get("engine_iterations") is not None for s in steps)
    totals: dict[str, Any] = {
        name: sum(int(s[name]) for s in steps) if counted else None for name in WORK_FIELDS
    }
    iterations = totals["engine_iterations"]
    decode = totals["decode_iterations"]
    return {
        **totals,
        "work_deterministic": all(bool(s.get("work_deterministic")) for s in steps) if counted else None,
        "mean_decode_batch": totals["decode_tokens"] / decode if decode else None,
        "generated_tokens_per_iteration": generated / iterations if iterations else None,
        "useful_tokens_per_iteration": trained / iterations if iterations else None,
    }


def _efficiency(steps: Sequence[Row], generated: int) -> float | None:
    bound = 0.0
    for s in steps:
        rate = s.get("saturated_tokens_per_s")
        if rate is None:
            return None
        bound += s["rollout_time_s"] * rate
    return generated / bound if bound else None


def _tail_share(steps: Sequence[Row], requests: Sequence[Row]) -> float | None:
    done_by_step: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in requests:
        if r["finish_reason"] != "abort":
            done_by_step[r.get("repeat", 0), r["step"]].append(r["t_done"])
    tail = total = 0.0
    for s in steps:
        times = sorted(done_by_step.get((s.get("repeat", 0), s["step"]), ()))
        end = s["t_start"] + s["rollout_time_s"]
        total += s["rollout_time_s"]
        if times:
            tail += end - times[math.ceil(0.9 * len(times)) - 1]
    return tail / total if total else None


def _reference_off_policy(requests: Sequence[Row], generated: int) -> float | None:
    """As slime/APRIL: each resume adds the previous call's completion tokens; ratio = off / (total + off)."""
    last: dict[tuple[int, int], int] = {}
    off = 0
    for r in sorted(requests, key=lambda r: r["t_submit"]):
        key = (r["group_uid"], r["sample_index"])
        if r["prefix_len"] and key in last:
            off += last[key]
        last[key] = r["output_len"]
    return off / (generated + off) if generated + off else None


def _span(runs: Sequence[Sequence[int]]) -> int:
    versions = [v for v, _ in runs]
    return max(versions) - min(versions) if versions else 0


def _staleness(sample: Row) -> int:
    versions = [v for v, _ in sample["version_runs"]]
    return sample["train_version"] - min(versions) if versions else 0


def _share(rows: Sequence[Row], predicate: Any) -> float | None:
    return sum(1 for r in rows if predicate(r)) / len(rows) if rows else None


def _prompt_accounting(samples: Sequence[Row]) -> dict[str, int]:
    """Every launched prompt ends trained, dropped or buffered - exactly one of them."""
    fates: dict[int, set[str]] = defaultdict(set)
    for s in samples:
        fates[s["group_uid"]].add(s["fate"])
    counts = {"launched": len(fates), "trained": 0, "dropped": 0, "buffered": 0, "inconsistent": 0}
    for seen in fates.values():
        if len(seen) == 1:
            counts[next(iter(seen))] += 1
        else:
            counts["inconsistent"] += 1
    return counts


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
