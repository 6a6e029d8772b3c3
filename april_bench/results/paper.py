"""The paper's tables from run directories, as Markdown, LaTeX and CSV; README sections between markers.

Layout (APRIL's Table 1, plus the useful-token gain, which the paper does not report): the run and
its steps, data set, model, algorithm, hardware, strategy, throughput gain, useful-token gain,
accuracy improvement.  A measured table shows each gain's paired interval beside it; a simulated one
the paper's figure and the difference for a paper row.  One table per result kind: measured and
simulated rows never share a table, and each table says which it is.  Cells are
:func:`april_bench.results.table.results_table`'s (the same text ``run`` and ``report``
print) and CSV values are :func:`april_bench.results.summary.summarize`'s: nothing is recomputed
here.  No pandas: tables need only the standard library.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import ConfigError
from april_bench.results.fitness import incomplete
from april_bench.results.store import RunDirectory
from april_bench.results.table import render_markdown, results_table

__all__ = [
    "CSV_COLUMNS",
    "PAPER_LAYOUT",
    "PaperTable",
    "latex_escape",
    "layout",
    "marked_sections",
    "paper_tables",
    "render_csv",
    "render_latex",
    "render_paper_markdown",
    "replace_between_markers",
    "replace_sections",
]

#: Columns of the paper's layout, by their names in the run's results table
#: (:func:`april_bench.results.table.results_table`), plus the run and its steps.
PAPER_LAYOUT = (
    "Run",
    "Steps",
    "Dataset",
    "Model",
    "Algorithm",
    "Hardware",
    "Strategy",
    "Throughput gain",
    "Useful-token gain",
    "Accuracy improvement (equal steps)",
    "Accuracy improvement (equal time)",
)
#: What each kind adds after the throughput gain: a measured gain's paired interval; a simulated
#: paper row's published figure and the difference (empty cells for a row that is not the paper's).
_BESIDE_GAIN = {
    "measured": ("Paired median [95% CI]",),
    "simulated": ("Paper (APRIL README)", "Sim - paper"),
}


def layout(result_kind: str) -> tuple[str, ...]:
    """The columns of a ``measured`` or ``simulated`` paper table."""
    at = PAPER_LAYOUT.index("Throughput gain") + 1
    return (*PAPER_LAYOUT[:at], *_BESIDE_GAIN[result_kind], *PAPER_LAYOUT[at:])


#: CSV columns: run facts, then the summary's raw values (gains as fractions, ``1.0`` = +100%).
CSV_COLUMNS = (
    "result_kind",
    "run",
    "steps",
    "dataset",
    "model",
    "algorithm",
    "hardware",
    "strategy",
    "baseline",
    "throughput_gain",
    "useful_gain",
    "accuracy_improvement",
    "accuracy_improvement_equal_time",
    "generated_tokens_per_s",
    "useful_tokens_per_s",
    "accuracy",
    "accuracy_equal_time",
)
_SUMMARY_VALUES = CSV_COLUMNS[CSV_COLUMNS.index("baseline") :]


@dataclass(frozen=True, slots=True)
class PaperTable:
    """The rows of one result kind: formatted cells (Markdown, LaTeX) and raw values (CSV)."""

    #: ``measured`` or ``simulated``.
    result_kind: str
    columns: tuple[str, ...]
    runs: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]
    values: tuple[dict[str, Any], ...]

    @property
    def label(self) -> str:
        return self.result_kind.upper()


def paper_tables(runs: Sequence[RunDirectory]) -> list[PaperTable]:
    """One table per result kind (measured first), rows in the order of ``runs`` then arms."""
    grouped: dict[str, list[tuple[RunDirectory, dict[str, dict[str, Any]]]]] = {}
    for run in runs:
        grouped.setdefault("simulated" if run.simulated else "measured", []).append((run, run.summary()))
    tables = []
    for kind in sorted(grouped, key=("measured", "simulated").index):
        columns = layout(kind)
        cells: list[tuple[str, ...]] = []
        values: list[dict[str, Any]] = []
        for run, summary in grouped[kind]:
            why = incomplete(run)  # only with --allow-incomplete: never an unmarked partial gain
            names, rows, _ = results_table(run.config, summary, run.simulated)
            facts = {"Run": run.path.name, "Steps": str(run.config.get("steps", ""))}
            for row in rows:
                by_name = {**facts, **dict(zip(names, row, strict=True))}
                cell = [by_name.get(name, "") for name in columns]
                if why is not None:
                    cell[columns.index("Strategy")] += f" (INCOMPLETE: {why})"
                cells.append(tuple(cell))
            for arm, metrics in summary.items():
                values.append(
                    {
                        "result_kind": kind,
                        "run": run.path.name,
                        **{
                            key: run.config.get(key)
                            for key in ("steps", "dataset", "model", "algorithm", "hardware")
                        },
                        "strategy": arm if why is None else f"{arm} (INCOMPLETE: {why})",
                        **{key: metrics.get(key) for key in _SUMMARY_VALUES},
                    }
                )
        run_names = tuple(run.path.name for run, _ in grouped[kind])
        tables.append(PaperTable(kind, columns, run_names, tuple(cells), tuple(values)))
    return tables


def _caption(table: PaperTable) -> str:
    return (
        f"{table.label}: gains against each run's baseline arm "
        f"(runs: {', '.join(table.runs)}; generated by `python -m april_bench paper`)"
    )


def render_paper_markdown(tables: Sequence[PaperTable]) -> str:
    """Each table under a bold MEASURED / SIMULATED caption."""
    parts = [f"**{_caption(t)}**\n\n{render_markdown(t.columns, t.cells)}" for t in tables]
    return "\n\n".join(parts)


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(c, c) for c in text)


def render_latex(table: PaperTable) -> str:
    """A booktabs ``table`` environment (``\\usepackage{booktabs}``), labelled ``tab:april-<kind>``."""
    first_number = table.columns.index("Throughput gain")
    spec = "l" * first_number + "r" * (len(table.columns) - first_number)

    def line(cells: Sequence[str]) -> str:
        return " & ".join(latex_escape(c) for c in cells) + r" \\"

    return "\n".join(
        [
            "% Generated by `python -m april_bench paper` from the runs' rows; do not edit.",
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{latex_escape(_caption(table).replace('`', ''))}}}",
            rf"\label{{tab:april-{table.result_kind}}}",
            rf"\begin{{tabular}}{{{spec}}}",
            r"\toprule",
            line(table.columns),
            r"\midrule",
            *(line(row) for row in table.cells),
            r"\bottomrule",
            r"\end{tabular}",
            r"\end{table}",
        ]
    )


def render_csv(table: PaperTable) -> str:
    """Raw values, one row per (run, arm); empty cells where the summary has ``None``."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in table.values:
        writer.writerow({key: "" if row.get(key) is None else row[key] for key in CSV_COLUMNS})
    return out.getvalue()


_MARKER = re.compile(r"<!-- paper:([\w-]+):start -->")


def _markers(key: str) -> tuple[str, str]:
    return f"<!-- paper:{key}:start -->", f"<!-- paper:{key}:end -->"


def marked_sections(text: str) -> list[str]:
    """Keys of the ``<!-- paper:KEY:start -->`` markers in ``text``, in order."""
    return _MARKER.findall(text)


def replace_between_markers(text: str, key: str, content: str) -> str:
    """``text`` with everything between ``<!-- paper:KEY:start -->`` and ``<!-- paper:KEY:end -->``
    replaced by ``content`` (on lines of its own).  The markers stay; a missing or unpaired marker
    is a ``ConfigError``."""
    start, end = _markers(key)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ConfigError(f"expected one {start} followed by one {end}; fix the markers in the file")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{content.strip()}\n{end}{tail}"


def replace_sections(text: str, sections: Mapping[str, str]) -> str:
    """Every marked section of ``text`` that ``sections`` has content for; unknown keys are an error."""
    unknown = [key for key in marked_sections(text) if key not in sections]
    if unknown:
        raise ConfigError(
            f"unknown section marker(s) {', '.join(unknown)}; the sections are {', '.join(sections)}"
        )
    for key in marked_sections(text):
        text = replace_between_markers(text, key, sections[key])
    return text
