"""Grader benchmark: agreement with reference solutions, time per call, and the worst case.

Rewards are graded on the rollout's critical path (every finished group is
scored before the step can end), so a grader must be cheap on real answers and
bounded on hostile ones.  For each style (dapo, deepscaler, math-verify):

1. **Agreement.**  Reference solutions graded against their labels, on the
   real samples in ``shared/data``: MATH-500 solutions, and the DeepScaleR
   human solutions whose last ``\\boxed{}`` holds a value (most of that sample
   is AMC, whose solutions box the choice letter; those rows are counted, not
   graded).  The dapo grader reads an ``Answer:`` line, so it is given each
   label written as ``Answer: <label>`` on the DAPO-Math-17k sample instead.
2. **Time.**  Median and p99 per call over those real pairs, and the maximum
   over adversarial inputs (power towers, a megabyte of text, 10,000 open
   braces, ``100000!``).

Measured on this machine by this script; nothing simulated.  Output:
``results/benchmarks/grader_bench.{json,md}`` (``--out`` to change).

    python benchmarks/grader_bench.py --data ../shared/data
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from april_bench.data import load
from april_bench.data.stats import is_choice_letter
from april_bench.graders import correct_value, score
from april_bench.graders.deepscaler import last_boxed
from april_bench.results.provenance import collect_provenance
from april_bench.results.table import render_markdown

HOSTILE = [
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{" + "{" * 10_000,
    "x" * 1_000_000,
    "\\boxed{(1+x)^{1000000}}",
    "\\boxed{10**10**10}",
    "\\boxed{100000!}",
    "\\boxed{" + "\\frac{1}{" * 2000 + "}" * 2000 + "}",
    "Answer: " + "(" * 5000,
]


def _pairs(data: Path) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """style -> data set -> (response, label) pairs, from the real samples."""
    math500 = load("math-500", data / "math-500" / "sample.jsonl").problems
    deepscaler = load("deepscaler", data / "deepscaler" / "sample.jsonl").problems
    dapo = load("dapo-math-17k", data / "dapo-math-17k" / "sample.jsonl").problems
    aime = load("aime-2024", data / "aime-2024" / "dapo-format.jsonl").problems
    boxed_value = [
        (p.metadata["solution"], p.answer)
        for p in deepscaler
        if (box := last_boxed(p.metadata.get("solution") or "")) is not None and not is_choice_letter(box)
    ]
    solutions = {
        "math-500 solutions": [(p.metadata["solution"], p.answer) for p in math500],
        "deepscaler solutions boxing a value": boxed_value,
    }
    return {
        "dapo": {
            name: [(f"Let me work it out.\nAnswer: {p.answer}", p.answer) for p in problems]
            for name, problems in (("dapo-math-17k labels", dapo), ("aime-2024 (DAPO copy) labels", aime))
        },
        "deepscaler": solutions,
        "math-verify": solutions,
    }


def _timed(fn: Callable[[], float]) -> tuple[float, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def bench(data: Path) -> list[dict[str, Any]]:
    rows = []
    for style, sets in _pairs(data).items():
        grade = partial(score, style)
        worst = 0.0
        for text in HOSTILE:
            for response, label in ((text, "1"), ("\\boxed{1}\nAnswer: 1", text[:5000])):
                worst = max(worst, _timed(partial(grade, response, label))[1])
        for name, pairs in sets.items():
            times, right = [], 0
            for response, label in pairs:
                value, elapsed = _timed(partial(grade, response, label))
                times.append(elapsed)
                right += value >= correct_value(style)
            times.sort()
            rows.append(
                {
                    "grader": style,
                    "pairs_from": name,
                    "pairs": len(times),
                    "graded_right": right,
                    "agreement": right / len(times),
                    "median_ms": statistics.median(times) * 1e3,
                    "p99_ms": times[int(0.99 * (len(times) - 1))] * 1e3,
                    "hostile_max_ms": worst * 1e3,
                }
            )
    return rows


def to_markdown(results: list[dict[str, Any]]) -> str:
    rows = [
        [
            r["grader"],
            r["pairs_from"],
            f"{r['graded_right']} / {r['pairs']} ({r['agreement']:.1%})",
            f"{r['median_ms']:.3f}",
            f"{r['p99_ms']:.2f}",
            f"{r['hostile_max_ms']:.1f}",
        ]
        for r in results
    ]
    header = ("Grader", "Pairs", "Graded right", "Median ms", "p99 ms", "Hostile max ms")
    return (
        "# Grader benchmark (measured)\n\n"
        + render_markdown(header, rows)
        + "\n\ndapo: each label written as an `Answer:` line. deepscaler and math-verify: reference "
        "solutions against their labels; a DeepScaleR miss is a solution that boxes something other than "
        "its label (label noise such as row 2: label 1, solution n = 4) or a form the grader rejects. "
        "The other DeepScaleR rows are AMC problems whose solutions box the choice letter. Hostile max: "
        "the slowest call over power towers, 1 MB of text, 10,000 open braces, `100000!` and friends.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    results = bench(args.data)
    markdown = to_markdown(results)
    print(markdown)
    args.out.mkdir(parents=True, exist_ok=True)
    provenance = collect_provenance(simulated=False, engine="none (graders only)")
    (args.out / "grader_bench.json").write_text(
        json.dumps({"results": results, "provenance": provenance}, indent=2) + "\n"
    )
    (args.out / "grader_bench.md").write_text(markdown)
    print(json.dumps({f"{r['grader']}: {r['pairs_from']}": round(r["agreement"], 4) for r in results}))


if __name__ == "__main__":
    main()
