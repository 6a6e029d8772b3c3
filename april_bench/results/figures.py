"""Figures of one run: pure functions of its tables (:func:`april_bench.results.frames.load_runs`).

Each figure function takes the long tables of **one** run and returns a matplotlib
``Figure`` (or ``None`` when the run has no rows for it: no evaluations, say); it
reads no file and keeps no state.  Every title starts with MEASURED or SIMULATED,
from the run's provenance.  :func:`save_figures` writes each as a vector PDF (for a paper) and a PNG
(for the README), sized for a two-column paper: 7 in wide (a ``figure*`` spanning both columns),
8 pt text, the title wrapped so its MEASURED/SIMULATED label is never cut, legends below the axes so
they cover no data.

matplotlib (Agg backend, never a window) and seaborn are imported here only.
Checked against matplotlib 3.11.2, seaborn 0.13.2 and pandas 3.1.1.
"""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = [
    "FIGURES",
    "accuracy_figure",
    "figure_names",
    "kind_label",
    "length_figure",
    "occupancy_figure",
    "save_figures",
    "throughput_figure",
    "version_figure",
]

Tables = Mapping[str, "pd.DataFrame"]

#: Steps the occupancy figure shows (from the first): enough to see aborts and resumes, few
#: enough that each step's ramp and tail stay visible.
OCCUPANCY_STEPS = 6
#: PNG resolution: sharp on a screen and in a PDF viewer; the PDF beside it is vector.
DPI = 150
#: Full text width of a two-column paper (ACL/NeurIPS/ICML ``figure*``), inches.
WIDTH_IN = 7.0
#: Two-column papers set captions at 9 pt and figure text at 7-8 pt.
PAPER_RC: Mapping[str, Any] = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "figure.titlesize": 9,
    "pdf.fonttype": 42,  # TrueType: text stays text (searchable, editable), as publishers ask
    "svg.fonttype": "none",
}
#: The formats :func:`save_figures` writes, vector first.
FORMATS = ("pdf", "png")


def kind_label(tables: Tables) -> str:
    """``MEASURED``, ``SIMULATED`` (or both, joined, when the tables mix runs of both kinds)."""
    kinds = sorted(set(tables["runs"]["result_kind"]))
    return " + ".join(k.upper() for k in kinds) or "MEASURED"


def _title(tables: Tables, what: str) -> str:
    """``LABEL: what`` on the first line, the runs below; wrapped to the figure's width, never cut."""
    runs = ", ".join(tables["runs"]["run"])
    width = int(WIDTH_IN * 72 / (PAPER_RC["figure.titlesize"] * 0.55))  # characters at ~0.55 em each
    head = textwrap.fill(f"{kind_label(tables)}: {what}", width)
    return f"{head}\n" + textwrap.fill(f"(runs: {runs})", width)


def _paper_style(build: Callable[[Tables], Figure | None]) -> Callable[[Tables], Figure | None]:
    """Build the figure under :data:`PAPER_RC` (fonts are fixed when the artists are made)."""

    @functools.wraps(build)
    def styled(tables: Tables) -> Figure | None:
        import matplotlib

        with matplotlib.rc_context(dict(PAPER_RC)):  # type: ignore[arg-type]
            return build(tables)

    return styled


def _new_figure(
    rows: int, cols: int, *, height: float = 2.6, width: float = WIDTH_IN, sharex: bool = False
) -> tuple[Figure, Any]:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display is opened
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        rows, cols, figsize=(width, height * rows), squeeze=False, layout="constrained", sharex=sharex
    )
    return fig, axes


def _legend_columns(labels: list[str]) -> int:
    """As many columns as fit the figure's width: an entry is its label plus the handle, ~0.55 em a
    character at the legend's font size."""
    em = PAPER_RC["legend.fontsize"] / 72  # inches
    entry = (max(len(label) for label in labels) + 6) * 0.55 * em
    return max(1, min(len(labels), int(WIDTH_IN * 0.95 / entry)))


def _legend_below(fig: Figure, axes: Any) -> None:
    """One legend for the figure, below every axes (so it covers no data), entries from all axes once."""
    entries: dict[str, Any] = {}
    title = None
    for ax in axes.flat:
        legend = ax.get_legend()
        if legend is not None:  # seaborn draws its own legend; its handles are not on the axes
            handles, labels = legend.legend_handles, [t.get_text() for t in legend.get_texts()]
            title = title or legend.get_title().get_text() or None
            legend.remove()
        else:
            handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels, strict=False):
            if label and not label.startswith("_"):
                entries.setdefault(label, handle)
    if entries:
        fig.legend(
            list(entries.values()),
            list(entries),
            loc="outside lower center",
            ncols=_legend_columns(list(entries)),
            frameon=False,
            title=None if title == "arm" else title,
        )


def _first_repeat(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of each arm's first repetition: repetitions have clocks of their own."""
    if frame.empty:
        return frame
    first = frame.groupby("arm", sort=False)["repeat"].transform("min")
    return frame[frame["repeat"] == first]


def _arms(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["arm"]))


def _occupancy_requests(tables: Tables, steps: int = OCCUPANCY_STEPS) -> pd.DataFrame:
    requests = _first_repeat(tables["requests"])
    return requests[requests["step"] < steps]


def _trained(tables: Tables) -> pd.DataFrame:
    samples = tables["samples"]
    return samples[(samples["fate"] == "trained") & samples["train_version"].notna()]


#: The rows each figure draws: a figure whose rows are empty is not drawn.
_ROWS: Mapping[str, Callable[[Tables], pd.DataFrame]] = {
    "occupancy": _occupancy_requests,
    "throughput": lambda tables: tables["steps"],
    "lengths": _trained,
    "accuracy": lambda tables: tables["evals"],
    "versions": _trained,
}


def figure_names(tables: Tables) -> list[str]:
    """The figures :func:`save_figures` would write for these tables, without drawing them."""
    return [name for name in FIGURES if not _ROWS[name](tables).empty]


def occupancy_figure(tables: Tables, *, steps: int = OCCUPANCY_STEPS) -> Figure | None:
    """Requests in flight on each arm's engine over the first ``steps`` steps, with the moments the
    abort began (N groups in); GPU utilisation below when telemetry was recorded.  Every panel is on
    the run clock (the one telemetry samples and events are stamped with), so a request and the GPU
    samples taken while it ran line up; a run without rollout events keeps each arm's own clock."""
    import numpy as np

    requests = _occupancy_requests(tables, steps)
    if requests.empty:
        return None
    step_rows = _first_repeat(tables["steps"])
    telemetry = tables["telemetry"]
    offsets = _run_clock_offsets(step_rows, tables["events"])
    clock = "arm clock (s)" if offsets is None else "run clock (s)"
    arms = _arms(requests)
    fig, axes = _new_figure(
        len(arms) + (0 if telemetry.empty else 1), 1, height=1.9, sharex=offsets is not None
    )
    for ax, arm in zip(axes[:, 0], arms, strict=False):
        rows = requests[requests["arm"] == arm]
        shift = _shift(rows, offsets)
        times = np.concatenate(
            [rows["t_submit"].to_numpy(float) + shift, rows["t_done"].to_numpy(float) + shift]
        )
        change = np.concatenate([np.ones(len(rows)), -np.ones(len(rows))])
        order = np.lexsort((change, times))  # at equal times a request ends before the next starts
        ax.step(times[order], np.cumsum(change[order]), where="post", lw=0.8, label="in flight")
        arm_steps = step_rows[(step_rows["arm"] == arm) & (step_rows["step"] < steps)]
        aborts = arm_steps[arm_steps["aborted_requests"] > 0]
        stop = aborts["t_start"] + aborts["rollout_time_s"] - aborts["drain_time_s"] + _shift(aborts, offsets)
        for i, t in enumerate(stop):
            ax.axvline(t, color="tab:red", ls="--", lw=0.8, label="abort (N groups in)" if i == 0 else None)
        ax.set_ylabel("requests")
        ax.set_title(arm, loc="left")
    axes[len(arms) - 1, 0].set_xlabel(clock)
    if not telemetry.empty:
        _gpu_panel(axes[-1, 0], tables)
    _legend_below(fig, axes)
    last = int(requests["step"].max())
    fig.suptitle(_title(tables, f"engine occupancy, steps 0-{last}"))
    return fig


def _run_clock_offsets(steps: pd.DataFrame, events: pd.DataFrame) -> dict[tuple[str, int], float] | None:
    """``(arm, step) -> run clock - arm clock`` during that step's rollout: its ``rollout_start`` event
    (run clock, what telemetry samples are stamped with) less its step row's ``t_start`` (the arm's
    clock, which evaluations and other arms' blocks are cut out of).  ``None``: no such events (a run
    written before them), so requests stay on their arm's clock."""
    if steps.empty or events.empty or "kind" not in events:
        return None
    starts = _first_repeat(events[events["kind"] == "rollout_start"])
    if starts.empty:
        return None
    run_t = {(str(r.arm), int(r.step)): float(r.t) for r in starts.itertuples()}
    offsets = {
        (str(r.arm), int(r.step)): run_t[(str(r.arm), int(r.step))] - float(r.t_start)
        for r in steps.itertuples()
        if (str(r.arm), int(r.step)) in run_t
    }
    return offsets or None


def _shift(rows: pd.DataFrame, offsets: dict[tuple[str, int], float] | None) -> Any:
    """Per row, the seconds that move its arm-clock times onto the run clock (0 without offsets)."""
    import numpy as np

    if offsets is None:
        return np.zeros(len(rows))
    return np.array(
        [offsets.get((str(a), int(s)), 0.0) for a, s in zip(rows["arm"], rows["step"], strict=True)]
    )


def _gpu_panel(ax: Any, tables: Tables) -> None:
    """GPU utilisation per device on the run clock, each arm's rollout windows shaded."""
    telemetry = tables["telemetry"].sort_values("t")
    for device, rows in telemetry.groupby("device"):
        ax.plot(rows["t"], rows["util_gpu"], lw=0.8, label=f"GPU {device}")
    events = tables["events"]
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")
    for i, arm in enumerate(_arms(events)):
        rows = events[events["arm"] == arm]
        starts = rows[rows["kind"] == "rollout_start"]["t"].to_numpy(float)
        ends = rows[rows["kind"] == "rollout_end"]["t"].to_numpy(float)
        for j, (a, b) in enumerate(zip(starts, ends, strict=False)):
            ax.axvspan(
                a,
                b,
                color=colors[i % len(colors)],
                alpha=0.15,
                lw=0,
                label=f"{arm} rollout" if not j else None,
            )
        for t in rows[rows["kind"] == "rollout_stop"]["t"]:
            ax.axvline(t, color="tab:red", ls="--", lw=0.5)
    ax.set_ylabel("GPU util (%)")
    ax.set_xlabel("run clock (s)")
    ax.set_ylim(0, 105)


def throughput_figure(tables: Tables) -> Figure | None:
    """Generated and useful (trained) tokens per rollout second, step by step, per arm."""
    import seaborn as sns

    steps = tables["steps"]
    if steps.empty:
        return None
    rollout = steps["rollout_time_s"].where(steps["rollout_time_s"] > 0)
    data = steps.assign(
        generated=steps["generated_tokens"] / rollout, useful=steps["trained_tokens"] / rollout
    )
    fig, axes = _new_figure(1, 2, height=3.0)
    for ax, column, label in zip(
        axes[0], ("generated", "useful"), ("generated", "useful (trained)"), strict=True
    ):
        sns.lineplot(data=data, x="step", y=column, hue="arm", ax=ax, errorbar=None, lw=1)
        ax.set_ylabel(f"{label} tok/s")
        ax.set_ylim(bottom=0)
    _legend_below(fig, axes)
    fig.suptitle(_title(tables, "tokens per rollout second, per step (mean over repeats)"))
    return fig


def length_figure(tables: Tables) -> Figure | None:
    """Response lengths of trained samples per arm, with the response-length cap."""
    import seaborn as sns

    trained = _trained(tables)
    if trained.empty:
        return None
    fig, axes = _new_figure(1, 1, height=3.0)
    ax = axes[0, 0]
    sns.histplot(data=trained, x="response_len", hue="arm", element="step", fill=False, bins=40, ax=ax)
    cap = tables["runs"]["max_response_len"].dropna()
    if not cap.empty:
        ax.axvline(float(cap.max()), color="tab:red", ls="--", lw=1)
        ax.annotate("cap", (float(cap.max()), 1), xycoords=("data", "axes fraction"), ha="right", va="top")
    ax.set_xlabel("response tokens")
    ax.set_ylabel("trained samples")
    _legend_below(fig, axes)
    fig.suptitle(_title(tables, "response length of trained samples"))
    return fig


def accuracy_figure(tables: Tables) -> Figure | None:
    """Held-out accuracy (± standard error) against training steps and training time; ``None``
    without evaluations (a simulated run has none)."""
    evals = tables["evals"]
    if evals.empty:
        return None
    fig, axes = _new_figure(1, 2, height=3.0)
    repeats = evals["repeat"].nunique() > 1
    for (arm, repeat), rows in evals.groupby(["arm", "repeat"], sort=False):
        rows = rows.sort_values("step")
        label = f"{arm} (repeat {repeat})" if repeats else str(arm)
        for ax, x in zip(axes[0], ("step", "train_time_s"), strict=True):
            ax.errorbar(rows[x], rows["accuracy"], yerr=rows["accuracy_stderr"], lw=1, capsize=2, label=label)
    axes[0, 0].set_xlabel("training steps")
    axes[0, 1].set_xlabel("training time (s, evaluations excluded)")
    for ax in axes[0]:
        ax.set_ylabel("held-out accuracy")
    _legend_below(fig, axes)
    fig.suptitle(_title(tables, "accuracy against steps and wall time"))
    return fig


def version_figure(tables: Tables) -> Figure | None:
    """How stale trained tokens are: the share of trained tokens by policy-version lag (trained version
    minus the version that generated the token), and of trained samples by version span."""
    import pandas as pd
    import seaborn as sns

    trained = _trained(tables)
    if trained.empty:
        return None
    lags: dict[tuple[str, int], int] = {}
    spans: dict[tuple[str, int], int] = {}
    for arm, train_version, runs in zip(
        trained["arm"], trained["train_version"], trained["version_runs"], strict=True
    ):
        versions = [v for v, _ in runs]
        for version, n in runs:
            key = (arm, int(train_version) - version)
            lags[key] = lags.get(key, 0) + n
        span = (arm, max(versions) - min(versions) if versions else 0)
        spans[span] = spans.get(span, 0) + 1
    fig, axes = _new_figure(1, 2, height=3.0)
    for ax, counts, x, ylabel in (
        (axes[0, 0], lags, "version lag", "share of trained tokens"),
        (axes[0, 1], spans, "version span", "share of trained samples"),
    ):
        frame = pd.DataFrame([(a, k, n) for (a, k), n in counts.items()], columns=["arm", x, "count"])
        frame["share"] = frame["count"] / frame.groupby("arm")["count"].transform("sum")
        sns.barplot(data=frame, x=x, y="share", hue="arm", ax=ax)
        ax.set_ylabel(ylabel)
    _legend_below(fig, axes)
    fig.suptitle(_title(tables, "policy versions of trained tokens"))
    return fig


#: Every figure of a run, by file stem.
FIGURES: Mapping[str, Callable[[Tables], Figure | None]] = {
    "occupancy": _paper_style(occupancy_figure),
    "throughput": _paper_style(throughput_figure),
    "lengths": _paper_style(length_figure),
    "accuracy": _paper_style(accuracy_figure),
    "versions": _paper_style(version_figure),
}


#: No software or date metadata: the same rows give the same bytes, so regenerated figures diff clean.
_METADATA: Mapping[str, Mapping[str, Any]] = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
    "svg": {"Creator": None, "Date": None},
}


def save_figures(tables: Tables, out: Path, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Write every figure the run has rows for as ``out/<name>.<format>`` (PDF and PNG by default);
    the paths written, in order."""
    import matplotlib
    import matplotlib.pyplot as plt

    from april_bench.fsio import record, write_atomic

    record(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in FIGURES.items():
        fig = build(tables)
        if fig is None:
            continue
        with matplotlib.rc_context(dict(PAPER_RC)):  # type: ignore[arg-type]
            for fmt in formats:
                path = out / f"{name}.{fmt}"
                options: dict[str, Any] = {
                    "format": fmt,
                    "dpi": DPI,
                    "metadata": dict(_METADATA.get(fmt, {})),
                }
                write_atomic(path, functools.partial(fig.savefig, **options))
                written.append(path)
        plt.close(fig)
    return written
