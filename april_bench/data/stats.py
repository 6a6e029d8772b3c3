"""Data-set statistics: prompt-length distribution, answer types, and what the loader skipped.

Prompt lengths are the rendered prompt (recipe template, through the tokenizer's chat
template when a tokenizer is given) in tokens, or estimated as characters / 3.5 without a
tokenizer.  The simulator uses :func:`prompt_lengths` for per-data-set prompt lengths; the
CLI prints :func:`format_stats` (``python -m april_bench data stats DATASET --path ...``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from april_bench.data.records import LoadedDataset
from april_bench.data.templates import render
from april_bench.quantiles import quantile

__all__ = [
    "ANSWER_TYPES",
    "DatasetStats",
    "answer_type",
    "format_stats",
    "is_choice_letter",
    "percentile",
    "prompt_lengths",
    "stats",
]

#: Every value :func:`answer_type` returns, in the order :func:`format_stats` lists them.
ANSWER_TYPES = (
    "integer",
    "zero-padded integer",
    "decimal",
    "fraction",
    "tuple/interval",
    "LaTeX expression",
    "expression",
    "text",
    "empty",
)

_INTEGER = re.compile(r"[+-]?(\d+|\d{1,3}(,(\\!)?\d{3})+)")
_DECIMAL = re.compile(r"[+-]?(\d+\.\d*|\.\d+)")
_FRACTION = re.compile(r"[+-]?(\d+\s*/\s*\d+|\\[dt]?frac\s*(\{\s*\d+\s*\}|\d)\s*(\{\s*\d+\s*\}|\d))")
_TEXT = re.compile(r"\\text(bf|rm|it)?\{[^{}]*\}|\(?[A-Z]\)?|[A-Za-z]{2,}\.?( [A-Za-z]{2,}\.?)*")
_LATEX = re.compile(r"[\\^_{}]")


_CHOICE = re.compile(r"\([A-E]\)|^\s*(\\text(bf|rm)?\{|\\mathrm\{)?\s*[A-E]\s*\}?\s*$")


def is_choice_letter(text: str) -> bool:
    """Whether ``text`` (e.g. a solution's last ``\\boxed{}``) names a multiple-choice option - ``A``,
    ``\\text{(C)}``, ``\\textbf{(B) }26`` - rather than a value.  DeepScaleR's AMC rows box the letter
    in their human solutions while the label holds the value."""
    return bool(_CHOICE.search(text))


def _top_level_comma(s: str) -> bool:
    depth = 0
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            return True
    return False


def answer_type(answer: str) -> str:
    """Classify a reference answer; the first matching rule wins.

    1. ``"empty"``: blank.  Surrounding ``$...$`` is then removed.
    2. ``"zero-padded integer"``: digits with a leading 0 and more than one digit (AIME ``"025"``).
    3. ``"integer"``: optionally signed digits, or digits with thousands commas (``"1,234"``,
       ``"10,\\!080"``).
    4. ``"decimal"``: ``"1.25"``, ``"-.5"``.
    5. ``"fraction"``: numeric ``a/b``, ``\\frac{a}{b}`` (also ``\\dfrac``, ``\\tfrac``, ``\\frac12``).
    6. ``"tuple/interval"``: a comma outside brackets (``"1,-2"``, ``"3, 5, 7"``) or a bracketed
       comma list (``"(6,31,-1)"``, ``"[2, 5)"``, ``"\\left( 3, \\frac{\\pi}{2} \\right)"``).
    7. ``"text"``: a lone ``\\text{...}``, a capital letter choice (``"C"``, ``"(C)"``), or words of two
       or more letters (``"Evelyn"``, ``"all"``); a single lowercase letter is an expression.
    8. ``"LaTeX expression"``: anything else with a backslash, ``^``, ``_`` or braces (``"3\\sqrt{13}"``).
    9. ``"expression"``: anything else (``"p - q"``, ``"x=5"``, ``"6 - 5i"``).
    """
    s = answer.strip()
    if not s:
        return "empty"
    if len(s) > 1 and s.startswith("$") and s.endswith("$"):
        s = s.strip("$").strip()
    if _INTEGER.fullmatch(s):
        digits = s.lstrip("+-")
        return "zero-padded integer" if len(digits) > 1 and digits.startswith("0") else "integer"
    if _DECIMAL.fullmatch(s):
        return "decimal"
    if _FRACTION.fullmatch(s):
        return "fraction"
    bare = s.replace("\\left", "").replace("\\right", "").strip()
    if _top_level_comma(s) or (bare[:1] in "([" and bare[-1:] in ")]" and _top_level_comma(bare[1:-1])):
        return "tuple/interval"
    if _TEXT.fullmatch(s):
        return "text"
    if _LATEX.search(s):
        return "LaTeX expression"
    return "expression"


def prompt_lengths(
    dataset: LoadedDataset,
    tokenizer: Any = None,
    template: str | None = None,
    *,
    chars_per_token: float = 3.5,
) -> tuple[list[int], str]:
    """Per-problem rendered prompt length, and its unit.

    With a tokenizer: the number of ``input_ids`` of ``render(p, tokenizer, template)`` tokenized with
    ``add_special_tokens=False``, in ``"tokens"``.  Without: the rendered characters divided by
    ``chars_per_token``, rounded, in ``"est. tokens (chars/3.5)"``.
    """
    if chars_per_token <= 0:
        raise ValueError(f"chars_per_token must be positive, got {chars_per_token}")
    if tokenizer is not None:
        lengths = [
            len(tokenizer(render(p, tokenizer, template), add_special_tokens=False)["input_ids"])
            for p in dataset.problems
        ]
        return lengths, "tokens"
    lengths = [round(len(render(p, None, template)) / chars_per_token) for p in dataset.problems]
    return lengths, f"est. tokens (chars/{chars_per_token:g})"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolating linearly between order statistics (numpy's default)."""
    return quantile(sorted(values), q / 100) if values else math.nan


@dataclass(slots=True)
class DatasetStats:
    """What :func:`stats` measures on one loaded data set."""

    name: str
    source: str
    rows_read: int
    kept: int
    skipped: dict[str, int]
    repaired: int
    notes: dict[str, int]
    #: Prompt template the lengths were measured with (the data set's recipe template by default).
    template: str
    #: Unit of the length fields: "tokens" or "est. tokens (chars/3.5)".
    unit: str
    mean: float
    min: int
    p50: float
    p90: float
    p99: float
    max: int
    #: Count of answers per :func:`answer_type`.
    answer_types: dict[str, int] = field(default_factory=dict)


def stats(dataset: LoadedDataset, tokenizer: Any = None, template: str | None = None) -> DatasetStats:
    """Rows, skips, repairs, prompt-length percentiles and answer-type counts of ``dataset``."""
    from april_bench.data.loaders import DATASETS

    lengths, unit = prompt_lengths(dataset, tokenizer, template)
    spec = DATASETS.get(dataset.name)
    used = template or (spec.template if spec is not None else "boxed")
    types = Counter(answer_type(p.answer) for p in dataset.problems)
    report = dataset.report
    return DatasetStats(
        name=dataset.name,
        source=report.source,
        rows_read=report.rows_read,
        kept=report.kept,
        skipped=dict(report.skipped),
        repaired=report.repaired,
        notes=dict(report.notes),
        template=used,
        unit=unit,
        mean=sum(lengths) / len(lengths) if lengths else math.nan,
        min=min(lengths, default=0),
        p50=percentile(lengths, 50),
        p90=percentile(lengths, 90),
        p99=percentile(lengths, 99),
        max=max(lengths, default=0),
        answer_types={t: types[t] for t in ANSWER_TYPES if types[t]},
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def format_stats(s: DatasetStats) -> str:
    """A markdown card: provenance, row accounting, prompt-length percentiles, answer types, skips, notes."""
    lines = [f"## {s.name}", "", f"source: {s.source}  ", f"template: {s.template}", ""]
    skipped = sum(s.skipped.values())
    lines += _table(
        ("rows read", "kept", "skipped", "repaired"), [(s.rows_read, s.kept, skipped, s.repaired)]
    )
    lines += ["", f"Prompt length ({s.unit})", ""]
    lines += _table(
        ("n", "mean", "min", "p50", "p90", "p99", "max"),
        [(s.kept, f"{s.mean:.1f}", s.min, f"{s.p50:.0f}", f"{s.p90:.0f}", f"{s.p99:.0f}", s.max)],
    )
    total = sum(s.answer_types.values()) or 1
    lines += ["", "Answer types", ""]
    lines += _table(
        ("type", "count", "share"), [(t, n, f"{n / total:.1%}") for t, n in s.answer_types.items()]
    )
    if s.skipped:
        lines += ["", "Skipped rows", ""]
        lines += _table(("reason", "rows"), _by_count(s.skipped))
    if s.notes:
        lines += ["", "Notes (kept rows)", ""]
        lines += _table(("note", "rows"), _by_count(s.notes))
    return "\n".join(lines)


def _by_count(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Most frequent first (ties keep their order)."""
    return sorted(counts.items(), key=lambda kv: -kv[1])
