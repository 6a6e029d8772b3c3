"""Regenerate ``tests/data/math`` from a full copy of the math data samples.

    python tests/data/vendor.py [SOURCE]          # SOURCE defaults to ../shared/data from the repo root
    python tests/data/vendor.py --check [SOURCE]  # exit 1 if tests/data/math is not what SOURCE gives

The tests need a few hundred KB of the 1.8 MB sample, so each file keeps the rows chosen by the rules in
``RULES`` below (code, so the selection is reproducible and reviewable). Kept lines are copied byte for
byte, in source order, and never re-serialised. ``README.md`` (the provenance of the full sample) is copied
as is; ``VENDORED.md`` is written from the same rules and lists which source rows each file keeps and why.
The tests derive their expectations from the rows they read, so they also run on the full copy
(``APRIL_BENCH_SHARED_DATA=/path/to/full/copy``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(__file__).resolve().parent / "math"
DEFAULT_SOURCE = REPO_ROOT.parent / "shared" / "data"

# Rows of deepscaler/sample.jsonl whose human solution boxes a value that the graders do not accept
# against the label (tests/test_graders.py, DEEPSCALER_SOLUTION_EXCEPTIONS); the ones under
# DEEPSCALER_HEAD are kept by the head rule already.
DEEPSCALER_HEAD = 50
DEEPSCALER_GRADER_EXCEPTIONS = (2, 13, 24, 56, 98, 162, 205, 266, 310, 390)
DAPO_HEAD = 20
DAPO_CHINESE_ROWS = 3
HAN = re.compile("[\u4e00-\u9fff]")

Rows = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Rule:
    """Which rows of one source file are kept: ``select`` maps the decoded rows to sorted row indices."""

    path: str
    why: str
    select: Callable[[Rows], list[int]]


def every_row(rows: Rows) -> list[int]:
    return list(range(len(rows)))


def head(k: int) -> Callable[[Rows], list[int]]:
    return lambda rows: list(range(min(k, len(rows))))


def dapo_rows(rows: Rows) -> list[int]:
    """The head, every row with the form feed of a mangled ``\\frac``, and a few Chinese-language rows."""
    form_feed = {i for i, r in enumerate(rows) if "\x0c" in r["prompt"]}
    chinese = [i for i, r in enumerate(rows) if HAN.search(r["prompt"])][:DAPO_CHINESE_ROWS]
    return sorted(set(range(min(DAPO_HEAD, len(rows)))) | form_feed | set(chinese))


def deepscaler_rows(rows: Rows) -> list[int]:
    return sorted(set(range(min(DEEPSCALER_HEAD, len(rows)))) | set(DEEPSCALER_GRADER_EXCEPTIONS))


DAPO_WHY = (
    f"the first {DAPO_HEAD} rows (row 0 is the known first row, UUID 9a9b6eb4-…, answer 34), every row "
    "whose problem holds a form feed (the mangled `\\x0crac{m}{n}` the LaTeX repair fixes), and the first "
    f"{DAPO_CHINESE_ROWS} Chinese-language rows"
)
RULES = (
    Rule("dapo-math-17k/sample.jsonl", DAPO_WHY, dapo_rows),
    Rule(
        "dapo-math-17k/original-schema.jsonl",
        "the same rows as `sample.jsonl` (the two files are row-aligned; checked on `extra_info.index`), "
        "so the two schemas can be compared row by row",
        lambda rows: [],  # replaced by the sample's selection in `vendor`
    ),
    Rule(
        "deepscaler/sample.jsonl",
        f"the first {DEEPSCALER_HEAD} rows (row 0 is the official dataset's first row, row 2 the known "
        "label noise), plus the rows whose human solution does not grade against its label "
        f"({', '.join(map(str, DEEPSCALER_GRADER_EXCEPTIONS))}; see DEEPSCALER_SOLUTION_EXCEPTIONS in "
        "tests/test_graders.py)",
        deepscaler_rows,
    ),
    Rule("deepscaler/component-aime.jsonl", "the first 10 rows: schema and loader coverage", head(10)),
    Rule("deepscaler/component-math.jsonl", "the first 20 rows: schema and loader coverage", head(20)),
    Rule(
        "aime-2024/sample.jsonl",
        "every row: the tests pair the 30 problems with the DAPO-format copy",
        every_row,
    ),
    Rule("aime-2024/dapo-format.jsonl", "every row: the pair of `sample.jsonl`", every_row),
    Rule(
        "aime-2025/sample.jsonl",
        "every row: small, and rows 18, 19 and 27 carry the mangled LaTeX the repair fixes",
        every_row,
    ),
    Rule(
        "math-500/sample.jsonl",
        "the first 60 rows: grader agreement, formats and length statistics on real problems",
        head(60),
    ),
)


def read_lines(path: Path) -> list[bytes]:
    """The file's lines, each with its ``\\n`` (in JSON Lines only a raw newline ends a row)."""
    return re.findall(rb"[^\n]*\n|[^\n]+\Z", path.read_bytes())


def vendor(source: Path, target: Path) -> dict[str, list[int]]:
    """Write the kept rows of every file under ``source`` to ``target``; returns the kept row indices."""
    kept: dict[str, list[int]] = {}
    for rule in RULES:
        lines = read_lines(source / rule.path)
        rows = [json.loads(line) for line in lines]
        if rule.path == "dapo-math-17k/original-schema.jsonl":
            chosen = kept["dapo-math-17k/sample.jsonl"]
            processed = [json.loads(line) for line in read_lines(source / "dapo-math-17k/sample.jsonl")]
            ids = [processed[i]["extra_info"]["index"] for i in chosen]
            if len(rows) != len(processed) or ids != [rows[i]["extra_info"]["index"] for i in chosen]:
                raise SystemExit(f"{source / rule.path}: not row-aligned with dapo-math-17k/sample.jsonl")
        else:
            chosen = rule.select(rows)
        if not chosen or max(chosen) >= len(rows):
            raise SystemExit(f"{source / rule.path}: {len(rows)} rows, too few for the rule: {rule.why}")
        kept[rule.path] = chosen
        out = target / rule.path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"".join(lines[i] for i in chosen))
    shutil.copyfile(source / "README.md", target / "README.md")
    (target / "VENDORED.md").write_text(vendored_md(source, target, kept), encoding="utf-8")
    return kept


def ranges(indices: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0–2, 5``."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)


def vendored_md(source: Path, target: Path, kept: dict[str, list[int]]) -> str:
    lines = [
        "# Vendored math data rows",
        "",
        "A subset of the math data samples described in `README.md` (which is the provenance of the full",
        "sample, copied unchanged: its row counts, sizes and length statistics describe the full files, not",
        "these). Written by `tests/data/vendor.py`; do not edit by hand. Rebuild or check with",
        "",
        "    python tests/data/vendor.py [FULL_COPY]          # default: ../shared/data",
        "    python tests/data/vendor.py --check [FULL_COPY]",
        "",
        "Every kept line is byte-identical to its source line, in source order. Row numbers count from 0.",
        "The tests derive their expectations from the rows they read; point them at the full copy with",
        "`APRIL_BENCH_SHARED_DATA=/path/to/full/copy`.",
        "",
        "| file | rows kept / source | bytes | source rows kept | why |",
        "|---|---|---|---|---|",
    ]
    for rule in RULES:
        total = len(read_lines(source / rule.path))
        size = (target / rule.path).stat().st_size
        chosen = kept[rule.path]
        lines.append(
            f"| `{rule.path}` | {len(chosen)} / {total} | {size:,} | {ranges(chosen)} | {rule.why} |"
        )
    lines.append("")
    return "\n".join(lines)


def differences(expected: Path, actual: Path) -> list[str]:
    names = {p.relative_to(expected) for p in expected.rglob("*") if p.is_file()}
    names |= {p.relative_to(actual) for p in actual.rglob("*") if p.is_file()}
    return sorted(
        str(n)
        for n in names
        if not ((expected / n).is_file() and (actual / n).is_file())
        or (expected / n).read_bytes() != (actual / n).read_bytes()
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE, help="full copy of the data")
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a change")
    args = parser.parse_args(argv)
    if not (args.source / "README.md").is_file():
        print(
            f"error: no math data samples at {args.source}: pass the full copy's directory", file=sys.stderr
        )
        return 2
    if not args.check:
        kept = vendor(args.source, TARGET)
        print(f"wrote {sum(map(len, kept.values()))} rows to {TARGET}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        vendor(args.source, Path(tmp))
        changed = differences(Path(tmp), TARGET)
    for name in changed:
        print(f"differs: {name}", file=sys.stderr)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
