"""``compare BASE NEW``: the regression gate (exit 1 when a gain regressed)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parsers", "cmd_compare"]

#: Config fields that must match for two runs to measure the same thing.
_SAME = ("hardware", "algorithm", "dataset", "model", "steps", "seed", "rollout")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="compare the gains of two runs; exit 1 if NEW regressed (the CI gate)",
        description="Compare every arm's gains in NEW against BASE. Default rules: total:0 for simulated "
        "runs (deterministic); for measured ones iterations:0 (the gains in tokens per engine iteration, "
        "which "
        "april-bench's engines make schedule-deterministic: exact at any load) and median:ci (NEW's paired "
        "median below BASE's 95% interval, or NEW's interval below BASE's median). A CI on a shared "
        "machine gates on iterations:0 alone.",
    )
    p.add_argument("base", type=Path, help="the reference run directory")
    p.add_argument("new", type=Path, help="the run to check")
    p.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="VIEW:TOL",
        help="fail when a gain drops by more than TOL: total:5%%, median:5%%, total:0, median:ci (wall-clock "
        "gains); iterations:0 (the tokens-per-engine-iteration gains); iterations:exact (every arm's engine "
        "work and iteration gains identical, up or down: the gate of a forced-length run)",
    )
    p.add_argument(
        "--gains",
        default="throughput,useful,end_to_end",
        metavar="LIST",
        help="which gains to compare, comma-separated: throughput (generated tokens per rollout second), "
        "useful (trained tokens per rollout second), end_to_end (trained tokens per step wall time) "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print only the verdicts, as one JSON document on stdout (for jq; default: the table)",
    )
    p.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="compare even an interrupted run, or one whose rows do not add up or repeat, with a "
        "note saying so (default: off)",
    )
    p.set_defaults(handler=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from april_bench.config import ConfigError
    from april_bench.results.compare import GAINS, compare_runs, default_rules, parse_rule, render_comparison
    from april_bench.results.fitness import check_fit
    from april_bench.results.store import load_run

    base, new = load_run(args.base), load_run(args.new)
    for which, run in (("BASE", base), ("NEW", new)):
        for note in check_fit(run, allow_incomplete=args.allow_incomplete, doing=f"compare it as {which}"):
            print(f"note: {which} {note}", file=sys.stderr)
    if base.simulated != new.simulated:
        raise ConfigError("one run is simulated and the other measured: compare like with like")
    gains = [g.strip() for g in args.gains.split(",") if g.strip()]
    unknown = sorted(set(gains) - set(GAINS))
    if unknown:
        raise ConfigError(f"--gains {', '.join(unknown)}: choose from {', '.join(GAINS)}")
    from april_bench.results.compare import config_differences

    differ = config_differences(base.config, new.config, _SAME)
    if differ:
        print(
            f"note: the runs differ in {'; '.join(differ)}; their gains may not be comparable",
            file=sys.stderr,
        )
    rules = [parse_rule(r) for r in args.fail] or default_rules(base.simulated)
    if any(r.exact for r in rules) and not (
        base.config.get("length_oracle") and new.config.get("length_oracle")
    ):
        print(
            "note: iterations:exact on a run without --length-oracle: its lengths are the model's samples, "
            "which follow the CPU's float arithmetic, so the counts hold only on the machine that wrote BASE",
            file=sys.stderr,
        )
    rows = compare_runs(base.summary(), new.summary(), rules, gains)
    regressed = [r for r in rows if r.regressed]
    if not args.json:
        print(render_comparison(rows))
        print(f"\n{len(regressed)} regression(s) in {len(rows)} comparison(s)")
        if any(r.rule.exact for r in regressed):
            command = " ".join(base.provenance.get("command", [])[1:]) or "run ..."
            print(
                "an exact gate fails on any change of the schedule, better or worse: if the change is "
                f"meant, regenerate BASE from a clean commit with `python -m april_bench {command}` "
                "(its provenance's command) and commit it with the change"
            )
    else:
        print(
            json.dumps(
                {
                    "regressions": len(regressed),
                    "rows": [
                        {
                            "arm": r.arm,
                            "gain": r.gain,
                            "rule": str(r.rule),
                            "base": _json_number(r.base),
                            "new": _json_number(r.new),
                            "regressed": r.regressed,
                            "why": r.why,
                        }
                        for r in rows
                    ],
                }
            )
        )
    return 1 if regressed else 0


def _json_number(value: Any) -> Any:
    """A gain for ``--json``: a NaN or infinity is the string "nan"/"inf" (bare NaN is not JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
