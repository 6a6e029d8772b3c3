"""``result.json``: one flat file per run with its headline numbers, in the spirit of
``vllm bench serve --save-result`` (one JSON per run, the run's metadata in it) and prime-rl's
per-configuration baselines (mean, std, min and max).

A pure function of the run directory's config, provenance, summary and step rows
(:func:`result_record`); ``write_summary`` writes it beside ``summary.json``.  Fields:
docs/results-schema.md.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["FORMAT", "VERSION", "gpus_of", "result_record", "step_stats"]

FORMAT, VERSION = "april-bench-result", 1

#: Per step and arm: the rates a reader compares across runs, from one step row each.
_PER_STEP = {
    "generated_tokens_per_s": lambda r: _rate(r.get("generated_tokens"), r.get("rollout_time_s")),
    "useful_tokens_per_s": lambda r: _rate(r.get("trained_tokens"), r.get("rollout_time_s")),
    "rollout_time_s": lambda r: r.get("rollout_time_s"),
    "step_time_s": lambda r: r.get("step_time_s"),
}
#: The summary's per-arm numbers that go into the file as they are.
_HEADLINE = (
    "throughput_gain",
    "useful_gain",
    "end_to_end_gain",
    "generated_tokens_per_s",
    "useful_tokens_per_s",
    "rollout_time_per_step_s",
    "step_time_per_step_s",
    "accuracy",
    "accuracy_improvement",
    "off_policy_token_ratio",
    "wasted_tokens",
)


def _rate(tokens: Any, seconds: Any) -> float | None:
    if not isinstance(tokens, int | float) or not isinstance(seconds, int | float) or seconds <= 0:
        return None
    return float(tokens) / float(seconds)


def step_stats(values: Sequence[float]) -> dict[str, float | int | None]:
    """mean, std (sample, 0 for one value), min, max and n of one metric over steps."""
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def gpus_of(config: Mapping[str, Any], provenance: Mapping[str, Any]) -> int | None:
    """The GPUs the run's rollout used: the simulated node (``num_gpus`` or one node of the hardware
    profile), or the GPUs the measured machine had; ``None`` for a CPU run (no GPU to divide by)."""
    if provenance.get("result_kind") == "simulated":
        from april_bench.profiles.hardware import hardware_profile

        hardware = str(config.get("hardware"))
        return config.get("num_gpus") or hardware_profile(hardware).gpus_per_node
    gpus = (provenance.get("machine") or {}).get("gpus") or []
    return len(gpus) or None


def result_record(
    name: str,
    config: Mapping[str, Any],
    provenance: Mapping[str, Any],
    summary: Mapping[str, Mapping[str, Any]],
    steps: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The run's ``result.json``: per arm the headline gains and rates, the paired intervals, each rate's
    mean/std/min/max over the arm's steps (warm-up steps left out, as the gains leave them out), tokens
    per GPU per second, and the run's metadata and provenance digest."""
    gpus = gpus_of(config, provenance)
    arms: dict[str, Any] = {}
    for arm, m in summary.items():
        rows = [r for r in steps if r.get("arm") == arm and not r.get("warmup")]
        per_step = {}
        for key, value_of in _PER_STEP.items():
            values = [float(v) for v in (value_of(r) for r in rows) if isinstance(v, int | float)]
            per_step[key] = step_stats(values)
        generated = m.get("generated_tokens_per_s")
        arms[arm] = {
            **{key: m.get(key) for key in _HEADLINE},
            "generated_tokens_per_gpu_per_s": None if gpus is None or generated is None else generated / gpus,
            "paired": {
                gain: {k: stats.get(k) for k in ("median", "ci", "pairs")}
                for gain, stats in (m.get("paired_gains") or {}).items()
            },
            "per_step": per_step,
        }
    digest = hashlib.sha256(json.dumps(provenance, sort_keys=True).encode()).hexdigest()
    git = provenance.get("git") or {}
    return {
        "format": FORMAT,
        "version": VERSION,
        "run": name,
        "result_kind": provenance.get("result_kind"),
        "date": provenance.get("utc_end") or provenance.get("utc"),
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        "config": {
            key: config.get(key)
            for key in ("hardware", "model", "dataset", "algorithm", "engine", "trainer", "steps", "repeats")
        }
        | {"rollout": config.get("rollout")},
        "gpus": gpus,
        "baseline": next(iter(summary.values()), {}).get("baseline"),
        "metadata": provenance.get("metadata", {}),
        "provenance_sha256": digest,
        "arms": arms,
    }
