"""``readings.json``: a paper row simulated under each reading of its uncertain algorithm.

The record and its table are pure functions of the run's summary and the other
readings' summaries; :mod:`april_bench.experiment.readings` simulates the
readings and writes the file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["READINGS_FILE", "readings_record", "render_readings"]

READINGS_FILE = "readings.json"


def _reading(config: Mapping[str, Any], summary: Mapping[str, Mapping[str, Any]], *, as_run: bool) -> dict:
    arms = {}
    for arm, m in summary.items():
        if arm == m.get("baseline"):
            continue
        arms[arm] = {
            "throughput_gain": m.get("throughput_gain"),
            "throughput_gain_step_mean": m.get("throughput_gain_step_mean"),
            "useful_gain": m.get("useful_gain"),
            "gain_decomposition": m.get("gain_decomposition"),
        }
    baseline = next(iter(summary.values()), {}).get("baseline")
    base = summary.get(baseline, {}) if baseline else {}
    return {
        "algorithm": config["algorithm"],
        "as_run": as_run,
        "baseline": baseline,
        "baseline_tail_time_share": base.get("tail_time_share"),
        "baseline_mean_response_len": base.get("mean_response_len"),
        "baseline_truncated_share": base.get("truncated_share"),
        "baseline_rejected_groups_per_step": base["rejected_groups"] / base["steps"]
        if base.get("steps")
        else None,
        "arms": arms,
    }


def readings_record(
    config: Mapping[str, Any],
    summary: Mapping[str, Mapping[str, Any]],
    others: Sequence[tuple[Mapping[str, Any], Mapping[str, Mapping[str, Any]]]],
) -> dict[str, Any] | None:
    """``readings.json``'s content: the row, why its algorithm is uncertain, and each reading's gains
    (the run's own first), from the run's summary and the other readings' ``(config, summary)``."""
    from april_bench.sim.paper_settings import paper_reference

    setting = paper_reference(config)
    if setting is None or not others:
        return None
    return {
        "result_kind": "simulated",
        "row": setting.key,
        "dataset": setting.dataset,
        "model": setting.model,
        "paper_algorithm": setting.algorithm,
        "paper_gain": setting.paper_gain,
        "why": setting.reading_note,
        "evidence": "docs/calibration.md, 'Two readings of the DAPO row'",
        "readings": [
            _reading(config, summary, as_run=True),
            *(_reading(c, s, as_run=False) for c, s in others),
        ],
    }


def render_readings(record: Mapping[str, Any]) -> str:
    """The readings as a markdown section: each reading's APRIL gain beside the paper's figure."""
    from april_bench.results.table import render_markdown

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 100:+.1f}%"

    def pts(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 100:+.1f}"

    rows = []
    for reading in record["readings"]:
        april = reading["arms"].get("april")
        if april is None:
            continue
        parts = april.get("gain_decomposition") or {}
        rows.append(
            [
                reading["algorithm"].upper() + (" (as run)" if reading["as_run"] else " (other reading)"),
                pct(april["throughput_gain"]),
                pct(april["throughput_gain_step_mean"]),
                f"{record['paper_gain'] * 100:+.0f}%",
                "n/a"
                if april["throughput_gain"] is None
                else f"{(april['throughput_gain'] - record['paper_gain']) * 100:+.1f} pt",
                pct(april["useful_gain"]),
                " / ".join(pts(parts.get(k)) for k in ("tail", "fill", "concurrency")),
                "n/a"
                if reading["baseline_tail_time_share"] is None
                else f"{reading['baseline_tail_time_share']:.0%}",
            ]
        )
    table = render_markdown(
        (
            "Reading",
            "APRIL throughput gain",
            "Per-step mean gain",
            "Paper",
            "Sim - paper",
            "Useful-token gain",
            "Points from tail / fuller batches / peak concurrency",
            "Baseline tail share",
        ),
        rows,
    )
    return (
        f"### Both readings of the {record['dataset']} row (simulated; {READINGS_FILE})\n\n{table}\n\n"
        f"Why two: {record['why']} ({record['evidence']})."
    )
