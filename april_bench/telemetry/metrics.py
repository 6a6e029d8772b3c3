"""Where GPU time and energy go, per arm: pure functions of telemetry rows and event rows.

Rows are mappings (``dataclasses.asdict`` of :class:`TelemetryRecord` and of
:class:`~april_bench.results.records.EventRecord`, or rows read back from JSON
Lines), on one clock: the run's event clock.  Telemetry rows carry no arm; a
sample counts for an arm when it falls in one of that arm's windows (sessions take
turns on the GPUs, so their windows never overlap).

**How samples become functions of time.**  A utilisation sample describes the
driver's *last* sample period, so each sample's value is held *backwards*: the
sample at ``t_k`` covers ``(t_{k-1}, t_k]`` (piecewise constant; a device's first
sample covers nothing).  SM clock and power use the same rule, so every field is
attributed alike.  Energy comes from the cumulative counter: between two samples
it is interpolated linearly, i.e. constant power ``(E_k - E_{k-1}) / (t_k - t_{k-1})``
on ``(t_{k-1}, t_k]``, which is exact at sample instants and never integrates
sampled power (a counter that goes down - a new sampler after a resume - starts a
new series; that one interval counts nothing).  A window that falls between two
samples takes the covering sample's value; time after a device's last sample (or
where a field is ``None``) is *uncovered* and reported through ``{phase}_coverage``
rather than guessed.

**Phases**, per (arm, repeat, step) from the event kinds the driver emits, then
merged per arm so overlaps never count twice: ``rollout`` (rollout_start ..
rollout_end), ``tail`` (given, or :func:`tail_windows`), ``drain`` (rollout_stop,
when the N-th group is in and the abort begins, .. rollout_end), ``train``
(train_start, else rollout_end .. train_end, else weight_sync_start),
``weight_sync``, and ``step`` (rollout_start .. weight_sync_end: what the training
clock measures; evaluation excluded).  Per phase and arm:

``{phase}_busy_share``
    GPU-busy share: utilisation integrated over covered device-seconds.
``{phase}_idle_gpu_s``
    idle GPU-seconds: ``(1 - util) x dt`` summed over devices.
``{phase}_sm_clock_mhz``
    time-weighted mean SM (AMD: GFX) clock over devices.
``{phase}_energy_j``
    energy summed over devices (counter; power integral only where a device has no counter).
``{phase}_coverage``
    covered device-seconds of utilisation over (phase seconds x devices).
``{phase}_sm_active``, ``{phase}_dram_bw``
    GPM's share of SMs busy and of the DRAM bandwidth used (NVIDIA Hopper and newer), time-weighted
    over the device-seconds they cover (``None`` without GPM samples).  Unlike the busy share, these
    fall when a few long sequences decode alone: the tail's waste made visible.

plus ``energy_per_trained_token_j`` (step energy / trained response tokens),
``energy_source`` (``counter``, ``power``, or ``mixed`` when only some devices have a
counter) and ``gpus``.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "PHASES",
    "Window",
    "gpu_metrics",
    "gpu_summary",
    "integrate",
    "merge_windows",
    "phase_windows",
    "tail_windows",
    "window_metrics",
]

Row = Mapping[str, Any]
Window = tuple[float, float]
#: (start, end, value): a field held constant on (start, end].
Segment = tuple[float, float, float]

PHASES = ("rollout", "tail", "drain", "train", "weight_sync", "step")
#: phase -> (start kinds, end kinds): the first kind of each tuple that a step has is used.
_BOUNDS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "rollout": (("rollout_start",), ("rollout_end",)),
    "drain": (("rollout_stop",), ("rollout_end",)),
    "train": (("train_start", "rollout_end"), ("train_end", "weight_sync_start")),
    "weight_sync": (("weight_sync_start",), ("weight_sync_end",)),
    "step": (("rollout_start",), ("weight_sync_end",)),
    "eval": (("eval_start",), ("eval_end",)),
}
_Key = tuple[str, int, int]  # (arm, repeat, step)


def merge_windows(windows: Iterable[Window]) -> list[Window]:
    """Sorted, disjoint union of ``windows`` (empty and reversed windows dropped)."""
    merged: list[list[float]] = []
    for a, b in sorted(w for w in windows if w[1] > w[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def integrate(segments: Sequence[Segment], windows: Sequence[Window]) -> tuple[float, float]:
    """``(integral of value, covered seconds)`` of sorted disjoint ``segments`` over sorted disjoint
    ``windows`` (two pointers: linear in rows + windows)."""
    total = covered = 0.0
    i = j = 0
    while i < len(segments) and j < len(windows):
        s0, s1, value = segments[i]
        w0, w1 = windows[j]
        lo, hi = max(s0, w0), min(s1, w1)
        if hi > lo:
            total += value * (hi - lo)
            covered += hi - lo
        if s1 < w1:
            i += 1
        else:
            j += 1
    return total, covered


def phase_windows(events: Iterable[Row], phase: str) -> dict[str, list[Window]]:
    """Windows of ``phase`` per arm, from the boundary events of each (arm, repeat, step).
    A step missing either boundary (a crashed step) gives no window."""
    starts, ends = _BOUNDS[phase]
    seen: dict[_Key, dict[str, float]] = defaultdict(dict)
    for e in events:
        if e["kind"] in starts or e["kind"] in ends:
            seen[_key(e)].setdefault(e["kind"], e["t"])
    windows: dict[str, list[Window]] = defaultdict(list)
    for key, kinds in seen.items():
        t0 = next((kinds[k] for k in starts if k in kinds), None)
        t1 = next((kinds[k] for k in ends if k in kinds), None)
        if t0 is not None and t1 is not None:
            windows[key[0]].append((t0, t1))
    return {arm: merge_windows(ws) for arm, ws in windows.items()}


def tail_windows(
    steps: Iterable[Row], requests: Iterable[Row], events: Iterable[Row]
) -> dict[str, list[Window]]:
    """Each step's tail on the shared clock: from the completion of its ceil(0.9 n)-th finished request
    to the end of its rollout, as ``tail_time_share`` in :mod:`april_bench.results.summary` defines it.

    Step and request rows are on the arm's training clock (evaluations cut out), so the tail's
    *length* is taken from them and the window is anchored at the step's ``rollout_end`` event."""
    done: dict[_Key, list[float]] = defaultdict(list)
    for r in requests:
        if r["finish_reason"] != "abort":
            done[_key(r)].append(r["t_done"])
    rollout_end = {_key(e): e["t"] for e in events if e["kind"] == "rollout_end"}
    windows: dict[str, list[Window]] = defaultdict(list)
    for s in steps:
        key = _key(s)
        times = sorted(done.get(key, ()))
        if not times or key not in rollout_end:
            continue
        tail = s["t_start"] + s["rollout_time_s"] - times[math.ceil(0.9 * len(times)) - 1]
        windows[key[0]].append((rollout_end[key] - tail, rollout_end[key]))
    return {arm: merge_windows(ws) for arm, ws in windows.items()}


def gpu_metrics(
    telemetry: Iterable[Row],
    events: Iterable[Row],
    *,
    tail: Mapping[str, Sequence[Window]] | None = None,
    trained_tokens: Mapping[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per-arm GPU metrics (see the module docstring), for every arm that has events, in order."""
    events = list(events)
    series = _series(telemetry)
    windows = {phase: phase_windows(events, phase) for phase in PHASES if phase != "tail"}
    windows["tail"] = {arm: merge_windows(ws) for arm, ws in (tail or {}).items()}
    arms = list(dict.fromkeys(e["arm"] for e in events))
    return {
        arm: _arm_metrics(
            series, {p: windows[p].get(arm, []) for p in PHASES}, (trained_tokens or {}).get(arm)
        )
        for arm in arms
    }


def gpu_summary(
    telemetry: Iterable[Row],
    events: Iterable[Row],
    steps: Iterable[Row],
    requests: Iterable[Row],
    samples: Iterable[Row],
) -> dict[str, dict[str, Any]]:
    """:func:`gpu_metrics` with tail windows and trained tokens taken from the run's other tables."""
    events = list(events)
    trained: dict[str, int] = defaultdict(int)
    for s in samples:
        if s["fate"] == "trained":
            trained[s["arm"]] += s["response_len"]
    return gpu_metrics(
        telemetry, events, tail=tail_windows(steps, requests, events), trained_tokens=dict(trained)
    )


def window_metrics(telemetry: Iterable[Row], windows: Iterable[Window]) -> dict[str, Any]:
    """Busy share, idle GPU-seconds, mean SM clock, energy and coverage of all devices in ``telemetry``
    over ``windows`` (merged first), plus ``energy_source`` and ``gpus``: one phase of one arm."""
    return _window_metrics(_series(telemetry), merge_windows(windows))


def _key(row: Row) -> _Key:
    return (row["arm"], row.get("repeat", 0), row["step"])


def _series(telemetry: Iterable[Row]) -> dict[int, list[Row]]:
    """Rows per device, sorted by time."""
    series: dict[int, list[Row]] = defaultdict(list)
    for row in telemetry:
        series[row["device"]].append(row)
    return {d: sorted(rows, key=lambda r: r["t"]) for d, rows in series.items()}


def _arm_metrics(
    series: Mapping[int, list[Row]], windows: Mapping[str, list[Window]], trained_tokens: int | None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase in PHASES:
        metrics = _window_metrics(series, windows[phase])
        out["gpus"], out["energy_source"] = metrics.pop("gpus"), metrics.pop("energy_source")
        out.update({f"{phase}_{key}": value for key, value in metrics.items()})
    energy = out["step_energy_j"]
    out["energy_per_trained_token_j"] = (
        energy / trained_tokens if energy is not None and trained_tokens else None
    )
    return out


def _window_metrics(series: Mapping[int, list[Row]], windows: list[Window]) -> dict[str, Any]:
    """``series``: rows per device, sorted by time; ``windows``: merged."""
    span = sum(b - a for a, b in windows)
    busy = covered = clock = clock_covered = energy = 0.0
    sources = set()
    for rows in series.values():
        b, c = integrate(_held(rows, "util_gpu", 0.01), windows)
        busy, covered = busy + b, covered + c
        k, kc = integrate(_held(rows, "sm_clock_mhz"), windows)
        clock, clock_covered = clock + k, clock_covered + kc
        has_counter = sum(r.get("energy_j") is not None for r in rows) >= 2
        sources.add("counter" if has_counter else "power")
        energy += integrate(_counter_power(rows) if has_counter else _held(rows, "power_w"), windows)[0]
    return {
        **{name: _field_mean(series, field, windows) for name, field in _GPM_FIELDS},
        "busy_share": busy / covered if covered else None,
        "idle_gpu_s": covered - busy if covered else None,
        "sm_clock_mhz": clock / clock_covered if clock_covered else None,
        "energy_j": energy if series and span else None,
        "coverage": covered / (span * len(series)) if span and series else None,
        "energy_source": (sources.pop() if len(sources) == 1 else "mixed") if sources else None,
        "gpus": len(series),
    }


#: (metric name, telemetry field) of the GPM shares, as fractions of 1.
_GPM_FIELDS = (("sm_active", "sm_active_pct"), ("dram_bw", "dram_bw_pct"))


def _field_mean(series: Mapping[int, list[Row]], field: str, windows: list[Window]) -> float | None:
    """Time-weighted mean of ``field`` (a %) as a fraction, over the device-seconds it covers."""
    total = covered = 0.0
    for rows in series.values():
        t, c = integrate(_held(rows, field, 0.01), windows)
        total, covered = total + t, covered + c
    return total / covered if covered else None


def _held(rows: Sequence[Row], field: str, scale: float = 1.0) -> list[Segment]:
    """Each sample's value held back to the previous sample: (t_{k-1}, t_k] -> value_k.  Rows written
    before a field existed (GPM's) count as not covered."""
    return [
        (prev["t"], row["t"], row[field] * scale)
        for prev, row in itertools.pairwise(rows)
        if row.get(field) is not None and row["t"] > prev["t"]
    ]


def _counter_power(rows: Sequence[Row]) -> list[Segment]:
    """Constant power between consecutive energy-counter readings (linear cumulative energy)."""
    readings = [r for r in rows if r.get("energy_j") is not None]
    return [
        (a["t"], b["t"], (b["energy_j"] - a["energy_j"]) / (b["t"] - a["t"]))
        for a, b in itertools.pairwise(readings)
        if b["t"] > a["t"] and b["energy_j"] >= a["energy_j"]
    ]
