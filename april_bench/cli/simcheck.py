"""``simcheck``: the simulator's prediction of every arm, then the measurement (april_bench.simcheck)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parsers", "cmd_simcheck"]


def add_parsers(sub: Any) -> None:
    from april_bench.cli.args import add_run_arguments

    parser = sub.add_parser(
        "simcheck",
        help="predict each arm's gain with the simulator from a measured cost curve, then measure it",
        description="Measure the engine's cost curve, record a sync-only length trace with another seed, "
        "predict every arm on the simulator, then run the arms as `run` does; writes simcheck.json and "
        "simcheck.md (predicted vs measured gain and engine iterations per step) into --out.",
    )
    add_run_arguments(parser)
    parser.add_argument(
        "--trace-steps", type=int, default=None, help="steps of the sync-only trace run (default: --steps)"
    )
    parser.add_argument(
        "--trace-seed", type=int, default=None, help="seed of the trace run (default: --seed + 1)"
    )
    parser.set_defaults(handler=cmd_simcheck)


def cmd_simcheck(args: argparse.Namespace) -> int:
    from april_bench.cli.args import config_from_args
    from april_bench.config import ConfigError
    from april_bench.results.rundir import claim_run_dir, default_run_name
    from april_bench.simcheck import run_simcheck

    if args.trace_steps is not None and args.trace_steps < 1:
        raise ConfigError(f"--trace-steps must be >= 1, got {args.trace_steps}")
    config = config_from_args(args)
    name = "simcheck-" + default_run_name(config.hardware, config.algorithm, config.dataset)
    out = claim_run_dir(args.out, default_name=name, overwrite=args.overwrite, kind="simcheck")
    result = run_simcheck(
        config,
        out,
        trace_steps=args.trace_steps,
        trace_seed=args.trace_seed,
        progress=not args.no_progress,
        echo=lambda line: print(line, file=sys.stderr),
        allow_dirty=args.allow_dirty,
    )
    print((out / "simcheck.md").read_text())
    print(f"simcheck directory: {out} ({len(result.data['arms'])} arm(s) compared)")
    return 0
