"""Tables: pure functions of a run's summary and config.  No metric is computed here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DECOMPOSITION_COLUMNS",
    "GAIN_TOLERANCE",
    "GPU_COLUMNS",
    "ITERATION_COLUMNS",
    "decomposition_table",
    "detail_columns",
    "detail_table",
    "gpu_table",
    "iteration_table",
    "paper_table",
    "render_markdown",
    "results_table",
    "wide_intervals",
]

#: A paired interval wider than this (half-width, in gain units) is flagged in the table.
GAIN_TOLERANCE = 0.10

PAPER_COLUMNS = (
    "Dataset",
    "Model",
    "Algorithm",
    "Hardware",
    "Strategy",
    "Throughput gain",
    "Paired median [95% CI]",
    "Useful-token gain",
    "Accuracy improvement (equal steps)",
    "Accuracy improvement (equal time)",
    "Source",
)


def _pct(value: float | None, *, baseline: bool = False) -> str:
    if baseline:
        return "baseline"
    return "n/a" if value is None else f"{value * 100:+.1f}%"


def paper_table(
    config: Mapping[str, Any], summary: Mapping[str, Mapping[str, Any]], simulated: bool
) -> list[list[str]]:
    """Rows of the paper-style table: throughput gain and accuracy improvement against the baseline arm."""
    source = "simulated" if simulated else "measured"
    if config.get("length_oracle"):
        source += " (forced lengths)"
    rows = []
    for arm, m in summary.items():
        is_base = arm == m.get("baseline")
        accuracy = [_accuracy(m, key, simulated, is_base) for key in ("accuracy", "accuracy_equal_time")]
        rows.append(
            [
                config["dataset"],
                config["model"],
                config["algorithm"].upper(),
                config["hardware"].upper() if config["hardware"] != "cpu" else "CPU",
                arm,
                _pct(m.get("throughput_gain"), baseline=is_base) + (" (!)" if _wasteful(m) else ""),
                "" if is_base else _paired(m.get("paired_gains", {}).get("throughput", {})),
                _pct(m.get("useful_gain"), baseline=is_base),
                *accuracy,
                source,
            ]
        )
    return rows


def results_table(
    config: Mapping[str, Any], summary: Mapping[str, Mapping[str, Any]], simulated: bool
) -> tuple[list[str], list[list[str]], str | None]:
    """The printed results table: :func:`paper_table` without the paired-interval column on a
    simulated run (deterministic: one pair says nothing), and with the paper's figure and the
    difference beside APRIL's gain when the run is one of the paper's rows.  The third item is the line
    saying what the simulator assumed, or None."""
    from april_bench.sim.length_evidence import MODEL_LENGTHS, length_profile
    from april_bench.sim.paper_settings import paper_reference

    columns = list(PAPER_COLUMNS)
    rows = [list(r) for r in paper_table(config, summary, simulated)]
    # APRIL logged tokens_throughput per step: its per-step mean's gain, beside the ratio of totals
    step_mean = columns.index("Throughput gain") + 1
    columns.insert(step_mean, "Per-step mean gain")
    for row, m in zip(rows, summary.values(), strict=True):
        is_base = m.get("baseline") is None or row[4] == m.get("baseline")
        row.insert(step_mean, _pct(m.get("throughput_gain_step_mean"), baseline=is_base))
    if simulated:
        drop = columns.index("Paired median [95% CI]")
        columns.pop(drop)
        for row in rows:
            row.pop(drop)
    reference = paper_reference(config) if simulated else None
    if reference is None:
        return columns, rows, None
    at = columns.index("Throughput gain") + 1
    columns[at:at] = ["Paper (APRIL README)", "Sim - paper"]
    for row, (arm, m) in zip(rows, summary.items(), strict=True):
        gain = m.get("throughput_gain")
        row[at:at] = (
            [f"{reference.paper_gain * 100:+.0f}%", f"{(gain - reference.paper_gain) * 100:+.1f} pt"]
            if arm == "april" and gain is not None
            else ["", ""]
        )
    lengths = MODEL_LENGTHS[reference.model]
    profile = length_profile(reference.model, reference.dataset)
    status = (
        f"; no published {reference.model} length statistic on {reference.dataset}: the profile is open, "
        "and results/benchmarks/paper_table.md shows the row over its range"
        if profile is not None and profile.status == "open"
        else ""
    )
    note = (
        "Paper: the APRIL README's Qwen3-4B figure for this row. The simulator assumes one response-length "
        f"model for {reference.model} from published evidence (right-answer median "
        f"{lengths.response_median:,.0f} tokens, log-sd {lengths.sigma:.1f}, wrong answers "
        f"x{lengths.incorrect_factor:g}, solve rate {lengths.solve_rate:g}; nothing fitted to the paper"
        f"{status}) and the scripts' baseline; sources, the misses and why: docs/calibration.md and "
        "results/benchmarks/paper_table.md."
    )
    return columns, rows, note


def _wasteful(m: Mapping[str, Any]) -> bool:
    from april_bench.results.headline import wasteful

    return wasteful(m)


def _paired(stats: Mapping[str, Any]) -> str:
    """'+41.2% [+33.0, +50.1] (12 pairs)', the median alone when there is one pair, and 'not
    distinguishable' when the interval contains 0."""
    from april_bench.results.headline import distinguishable, paired_cell

    cell = paired_cell(stats)
    return cell + ", not distinguishable" if distinguishable(stats) is False else cell


def wide_intervals(summary: Mapping[str, Mapping[str, Any]], tolerance: float = GAIN_TOLERANCE) -> list[str]:
    """Arms whose paired throughput-gain interval is wider than +-``tolerance``."""
    wide = []
    for arm, m in summary.items():
        half = m.get("paired_gains", {}).get("throughput", {}).get("half_width")
        if arm != m.get("baseline") and half is not None and half > tolerance:
            wide.append(f"{arm} (+-{half * 100:.1f} pts)")
    return wide


def _accuracy(m: Mapping[str, Any], key: str, simulated: bool, is_base: bool) -> str:
    """'17.1% ± 1.2 (+3.5 pts)': held-out accuracy, its standard error, and the difference to sync."""
    if simulated:
        return "n/a (simulated)"
    value = m.get(key)
    if value is None:
        return "n/a (not evaluated)"
    stderr = m.get(f"{key}_stderr")
    text = f"{value:.1%}" + (f" ± {stderr * 100:.1f}" if stderr is not None else "")
    if is_base:
        return f"{text} (baseline)"
    gain = m.get("accuracy_improvement" if key == "accuracy" else "accuracy_improvement_equal_time")
    return f"{text} ({gain * 100:+.1f} pts)" if gain is not None else text


DETAIL_COLUMNS = (
    "Strategy",
    "Rollout s/step",
    "Step s/step",
    "Gen tok/s",
    "Useful tok/s",
    "Useful gain",
    "Efficiency",
    "Tail share",
    "Off-policy",
    "Max span",
    "Wasted tok",
    "Partial",
)


def detail_columns(gpus: int | None) -> tuple[str, ...]:
    """:data:`DETAIL_COLUMNS`, with generated tokens per GPU per second after the rate when the run's
    GPU count is known (a simulated node)."""
    if gpus is None:
        return DETAIL_COLUMNS
    at = DETAIL_COLUMNS.index("Gen tok/s") + 1
    return (*DETAIL_COLUMNS[:at], "Gen tok/s/GPU", *DETAIL_COLUMNS[at:])


def detail_table(summary: Mapping[str, Mapping[str, Any]], gpus: int | None = None) -> list[list[str]]:
    """Where time and tokens go, per arm (:func:`detail_columns` ``gpus`` names the columns)."""
    rows = []
    for arm, m in summary.items():
        rate = m.get("generated_tokens_per_s")
        per_gpu = [] if gpus is None else [_num(None if rate is None else rate / gpus, "{:,.0f}")]
        rows.append(
            [
                arm,
                _num(m.get("rollout_time_per_step_s"), "{:.1f}"),
                _num(m.get("step_time_per_step_s"), "{:.1f}"),
                _num(rate, "{:,.0f}"),
                *per_gpu,
                _num(m.get("useful_tokens_per_s"), "{:,.0f}"),
                _pct(m.get("useful_gain"), baseline=arm == m.get("baseline")),
                _num(m.get("rollout_efficiency"), "{:.0%}"),
                _num(m.get("tail_time_share"), "{:.0%}"),
                _num(m.get("off_policy_token_ratio"), "{:.0%}"),
                str(m.get("max_version_span", "")),
                _num(m.get("wasted_tokens"), "{:,}"),
                str(m.get("partial_samples", "")),
            ]
        )
    return rows


#: Columns of :func:`gpu_table`.
GPU_COLUMNS = (
    "Strategy",
    "Phase",
    "Busy share",
    "Idle GPU-s",
    "Energy (J)",
    "J per trained token",
    "SM clock (MHz)",
    "SM active",
    "DRAM BW",
    "Coverage",
)
#: Phases of the GPU table, in order (``april_bench.telemetry.metrics.PHASES`` less ``drain``, which
#: the tail already shows): where GPU time goes within a step, then the whole step.
GPU_PHASES = ("rollout", "tail", "train", "weight_sync", "step")


def gpu_table(summary: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """Where GPU time and energy go, per arm and phase, from the run's telemetry samples
    (``summary[arm]["gpu"]``, :mod:`april_bench.telemetry.metrics`): busy share (NVML/AMD SMI
    utilisation: a kernel ran, not how full the GPU was), idle GPU-seconds, energy, energy per trained
    token (whole steps), SM clock, GPM's SM activity and DRAM bandwidth share where the GPU has them
    (blank elsewhere: they, not the busy share, drop in a batch-1 tail) and the share of the phase the
    samples cover.  Empty without telemetry."""
    rows = []
    for arm, m in summary.items():
        gpu = m.get("gpu")
        if not gpu:
            continue
        for phase in GPU_PHASES:
            if gpu.get(f"{phase}_coverage") is None:
                continue
            rows.append(
                [
                    arm,
                    phase,
                    _num(gpu.get(f"{phase}_busy_share"), "{:.0%}"),
                    _num(gpu.get(f"{phase}_idle_gpu_s"), "{:,.1f}"),
                    _num(gpu.get(f"{phase}_energy_j"), "{:,.0f}"),
                    _num(gpu.get("energy_per_trained_token_j"), "{:.4f}") if phase == "step" else "",
                    _num(gpu.get(f"{phase}_sm_clock_mhz"), "{:,.0f}"),
                    _num(gpu.get(f"{phase}_sm_active"), "{:.0%}"),
                    _num(gpu.get(f"{phase}_dram_bw"), "{:.0%}"),
                    _num(gpu.get(f"{phase}_coverage"), "{:.0%}"),
                ]
            )
    return rows


#: Columns of :func:`iteration_table`.
ITERATION_COLUMNS = (
    "Strategy",
    "Decode steps",
    "Mean step ms",
    "Largest batch",
    "Decode time at <= 1/4 of it",
    "Prefill s",
)


def iteration_table(summary: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """The engine's rounds per arm (``summary[arm]["iterations"]``, from the ``iterations`` table):
    decode steps, their mean wall time, the largest batch, and the share of decode time spent at a
    quarter of it or less - the tail at low batch, which a busy-share reading cannot see.  Empty for
    engines that keep no round log."""
    rows = []
    for arm, m in summary.items():
        r = m.get("iterations")
        if not r:
            continue
        rows.append(
            [
                arm,
                f"{r['decode_steps']:,}",
                _num(r.get("decode_step_ms"), "{:.2f}"),
                str(r.get("max_decode_batch", "")),
                _num(r.get("low_batch_decode_share"), "{:.0%}"),
                _num(r.get("prefill_s"), "{:.2f}"),
            ]
        )
    return rows


DECOMPOSITION_COLUMNS = (
    "Strategy",
    "Throughput gain",
    "from the tail (last 10%)",
    "from fuller batches",
    "from peak concurrency",
    "Useful-token gain",
    "from not discarding",
)


def decomposition_table(summary: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """Where each arm's gain comes from (:mod:`april_bench.results.decomposition`), in points; arms
    without a decomposition (the baseline, missing rates) are left out."""
    rows = []
    for arm, m in summary.items():
        d = m.get("gain_decomposition")
        if not d:
            continue
        rows.append(
            [
                arm,
                _pct(d["throughput_gain"]),
                _pts(d["tail"]),
                _pts(d["fill"]),
                _pts(d["concurrency"]),
                _pct(d["useful_gain"]),
                _pts(d["discard"]),
            ]
        )
    return rows


def _pts(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} pt"


def _num(value: Any, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def md_cell(value: object) -> str:
    """``value`` as one Markdown table cell: a ``|`` (an arm name read from a row file may hold one)
    is escaped, a line break flattened, so the columns stay where they are."""
    return str(value).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def render_markdown(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table with aligned columns (cells escaped: :func:`md_cell`)."""
    columns = [md_cell(c) for c in columns]
    rows = [[md_cell(c) for c in r] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(columns), sep, *(line(r) for r in rows)])
