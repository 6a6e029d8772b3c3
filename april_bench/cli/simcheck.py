"""``simcheck``: the simulator's prediction of every arm, then the measurement (april_bench.simcheck)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from april_bench.cli.output import echo

__all__ = ["add_parsers", "cmd_simcheck", "default_validation_log"]


def add_parsers(sub: Any) -> None:
    from april_bench.cli.args import add_run_arguments

    parser = sub.add_parser(
        "simcheck",
        help="predict each arm's gain with the simulator from a measured cost curve, then measure it",
        description="Measure the engine's cost curve, predict every arm on the simulator (with "
        "--length-oracle it replays exactly the lengths the engine will generate; otherwise a sync-only "
        "length trace with a held-out seed), seal the prediction (its sha256 goes into simcheck.json), then "
        "run the arms as `run` does and pass or fail on what load cannot move: engine iterations per step, "
        "the decode-batch histogram, prefill and re-prefill tokens, aborts, the off-policy share and the "
        "gains per engine iteration (3%% hf, 5%% vLLM).  Engine CPU time and the wall-clock gain follow as "
        "secondary checks.  Writes simcheck.json and simcheck.md into --out, and a line to the "
        "validation log.",
    )
    add_run_arguments(parser)
    parser.add_argument(
        "--trace-steps", type=int, default=None, help="steps of the sync-only trace run (default: --steps)"
    )
    parser.add_argument(
        "--trace-seed", type=int, default=None, help="seed of the trace run (default: --seed + 1)"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="SHARE",
        help="largest error a counted quantity may have and pass, e.g. 0.03 (default: 0.03 for hf and "
        "fake, whose schedules are deterministic; 0.05 for vLLM)",
    )
    parser.add_argument(
        "--validation-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="append this run's line (commit, prediction sha256, verdict, errors) to FILE (default: "
        "results/validation/simcheck-log.jsonl in the april-bench checkout, else in the current directory)",
    )
    parser.set_defaults(handler=cmd_simcheck)


def cmd_simcheck(args: argparse.Namespace) -> int:
    from april_bench.cli.args import config_from_args
    from april_bench.config import ConfigError
    from april_bench.results.rundir import claim_run_dir, default_run_name
    from april_bench.simcheck import run_simcheck

    if args.resume is not None:
        raise ConfigError(
            f"simcheck cannot resume (its prediction is sealed before the measurement starts); run it again: "
            f"`simcheck ... --out {args.resume} --overwrite`"
        )
    if args.trace_steps is not None and args.trace_steps < 1:
        raise ConfigError(f"--trace-steps must be >= 1, got {args.trace_steps}")
    if args.tolerance is not None and not 0 <= args.tolerance < 1:
        raise ConfigError(f"--tolerance must be a share in [0, 1), e.g. 0.03; got {args.tolerance}")
    config = config_from_args(args)
    name = "simcheck-" + default_run_name(config.hardware, config.algorithm, config.dataset)
    if args.out is not None:  # a reference simcheck from a dirty tree: refused before claiming the directory
        from april_bench.runner import check_reference_run

        check_reference_run(args.out, allow_dirty=args.allow_dirty)
    out = claim_run_dir(args.out, default_name=name, overwrite=args.overwrite, kind="simcheck")
    result = run_simcheck(
        config,
        out,
        trace_steps=args.trace_steps,
        trace_seed=args.trace_seed,
        progress=not args.no_progress,
        echo=echo,
        allow_dirty=args.allow_dirty,
        tolerance=args.tolerance,
        validation_log=args.validation_log or default_validation_log(),
    )
    print((out / "simcheck.md").read_text())
    print(f"simcheck directory: {out} ({len(result.data['arms'])} arm(s) compared): {result.verdict}")
    return 0


def default_validation_log() -> Path:
    """``results/validation/simcheck-log.jsonl`` of the april-bench checkout (else of the current
    directory)."""
    from april_bench.results.provenance import SIMCHECK_LOG, source_root

    return (source_root() or Path.cwd()) / SIMCHECK_LOG
