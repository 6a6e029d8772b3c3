"""``whatif`` (replay a trace under the zoo) and ``trace`` (import, export and show traces)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from april_bench.cli.output import echo

__all__ = ["add_parsers", "cmd_trace", "cmd_whatif"]

EXAMPLE = "example"


def example_trace() -> Path:
    """The trace shipped in the package (a short measured embedded run; docs/whatif.md)."""
    return Path(__file__).resolve().parent.parent / "trace" / "examples" / "embedded-sync.jsonl"


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "whatif",
        help="what would APRIL (or tail batching, or an async driver) buy my run? replay a trace, simulated",
        description="Replay a rollout trace (a verl or slime run's, imported with `trace import-*`, or an "
        "april-bench run directory) on the simulator under every strategy and driver of the zoo, on the "
        "given hardware and model; print the gains table and the off-policy share of each, all simulated. "
        f"TRACE `{EXAMPLE}` is the trace shipped with april-bench. Docs: docs/whatif.md.",
    )
    p.add_argument("trace", metavar="TRACE", help=f"a trace file, a run directory, or `{EXAMPLE}`")
    p.add_argument(
        "--hw", default=None, help="hardware profile to simulate (ls hardware; default h100, or the curve's)"
    )
    p.add_argument(
        "--model", default=None, help="model profile (ls models; default qwen3-4b, or the curve's)"
    )
    p.add_argument("--gpus", type=int, default=None, help="rollout GPUs (default: one node of --hw)")
    p.add_argument(
        "--algo", default="grpo", help="grpo, or dapo (dynamic sampling: needs rewards in the trace)"
    )
    p.add_argument("--strategies", default=None, metavar="LIST", help="arms (default: ablate's whole zoo)")
    p.add_argument(
        "--drivers",
        default=None,
        metavar="LIST",
        help="async drivers on the sync and APRIL arms: one-step-off, stale:ETA or none (default: ablate's)",
    )
    p.add_argument("--ratio", type=float, default=2.0, help="N'/N of every over-provisioning arm (default 2)")
    p.add_argument("--steps", type=int, default=None, help="steps to replay (default: the trace's)")
    p.add_argument("--arm", default=None, help="with a run directory: the arm whose trace to replay")
    p.add_argument(
        "--cost-curve",
        type=Path,
        default=None,
        metavar="FILE",
        help="price the engine by a measured cost curve (simcheck's cost_curve.json: one engine, its own "
        "limits) instead of the roofline profile of --hw",
    )
    p.add_argument(
        "--failure-rate",
        type=float,
        default=0.0,
        metavar="PER_HOUR",
        help="simulate replica failures: per replica-hour of virtual time (seeded; docs/faults.md)",
    )
    p.add_argument(
        "--failure-at",
        default=None,
        metavar="LIST",
        help="simulate replica failures at these virtual seconds since the run started (e.g. 30,200)",
    )
    p.add_argument(
        "--restart-s", type=float, default=None, help="seconds a failed replica is down (default 60)"
    )
    p.add_argument("--out", type=Path, default=None, help="run directory to write (default: runs/whatif-...)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument(
        "--allow-dirty", action="store_true", help="write --out under results/ from uncommitted code"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(handler=cmd_whatif)

    t = sub.add_parser(
        "trace",
        help="import a verl/slime run's rollouts (or W&B/CSV length stats) as a trace; export or show one",
        description="Traces are what `whatif` replays (docs/whatif.md). Every april-bench run writes one "
        "(trace.jsonl in its run directory).",
    )
    tsub = t.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    verl = tsub.add_parser("import-verl", help="verl's trainer.rollout_data_dir ({step}.jsonl files)")
    verl.add_argument("source", type=Path, help="the rollout_data_dir, or one {step}.jsonl of it")
    verl.add_argument("--reward-key", default="score", help="the field holding the reward (default: score)")
    _common(verl, limit_help="verl's data.max_response_length: responses at it count as truncated")
    slime = tsub.add_parser("import-slime", help="slime's --save-debug-rollout-data .pt files")
    slime.add_argument("source", type=Path, nargs="+", help="the .pt dumps (one per rollout)")
    slime.add_argument("--reward-key", default=None, help="the key of a dict reward (slime's --reward-key)")
    _common(slime, limit_help="slime's --rollout-max-response-len (default: the longest truncated response)")
    stats = tsub.add_parser(
        "import-stats", help="a W&B/CSV export of per-step mean response length: the weakest evidence"
    )
    stats.add_argument("source", type=Path, help="the CSV file")
    stats.add_argument("--groups-per-step", type=int, required=True, help="prompts per step of the run")
    stats.add_argument("--samples-per-prompt", type=int, required=True, help="samples per prompt (n)")
    stats.add_argument("--max-response-len", type=int, required=True, help="the run's response limit")
    stats.add_argument("--prompt-tokens", type=int, default=128, help="prompt length when not logged")
    stats.add_argument("--mean-column", default=None, help="the mean-length column (default: found by name)")
    stats.add_argument("--step-column", default=None, help="the step column (default: found by name)")
    stats.add_argument("--seed", type=int, default=0, help="seed of the synthesized lengths")
    stats.add_argument("-o", "--out", type=Path, required=True, help="the trace file to write")
    export = tsub.add_parser("export", help="a run directory's trace as a standalone trace file")
    export.add_argument("run", type=Path, help="the run directory")
    export.add_argument("--arm", default=None, help="which arm (default: the baseline)")
    export.add_argument("-o", "--out", type=Path, required=True, help="the trace file to write")
    show = tsub.add_parser("show", help="a trace's provenance and shape")
    show.add_argument("source", help=f"a trace file, a run directory, or `{EXAMPLE}`")
    show.add_argument("--arm", default=None, help="with a run directory: which arm")
    t.set_defaults(handler=cmd_trace)


def _common(p: argparse.ArgumentParser, *, limit_help: str) -> None:
    p.add_argument(
        "--tokenizer", default=None, metavar="PATH", help="a local tokenizer directory for exact counts"
    )
    p.add_argument("--max-response-len", type=int, default=None, help=limit_help)
    p.add_argument("-o", "--out", type=Path, required=True, help="the trace file to write")


def _source(text: str) -> Path:
    return example_trace() if text == EXAMPLE else Path(text)


def cmd_whatif(args: argparse.Namespace) -> int:
    from april_bench.config import ConfigError
    from april_bench.whatif import WhatIf, parse_strategies, run_whatif
    from april_bench.zoo import parse_drivers

    try:
        drivers = None if args.drivers is None else tuple(parse_drivers(args.drivers))
    except ConfigError as exc:
        raise ConfigError(f"--drivers: {exc}") from None
    setup = WhatIf(
        hardware=args.hw,
        model=args.model,
        num_gpus=args.gpus,
        algorithm=args.algo,
        strategies=parse_strategies(args.strategies),
        drivers=drivers,
        ratio=args.ratio,
        steps=args.steps,
        arm=args.arm,
        cost_curve=args.cost_curve,
        failure_rate_per_hour=args.failure_rate,
        failure_at_s=_seconds_list(args.failure_at),
        restart_s=args.restart_s,
    )
    try:
        result = run_whatif(
            _source(args.trace),
            setup,
            args.out,
            overwrite=args.overwrite,
            allow_dirty=args.allow_dirty,
            progress=not args.no_progress,
            echo=echo,
        )
    except KeyboardInterrupt as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        return 130
    from april_bench.whatif import render_whatif

    print(render_whatif(result))
    figure = result.get("figure")
    print(
        f"\nwhatif directory: {result['out']}"
        + (f"; figure: {figure}" if figure else " (no matplotlib: no figure)")
    )
    return 0


def _seconds_list(text: str | None) -> tuple[float, ...]:
    from april_bench.config import ConfigError

    if not text:
        return ()
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--failure-at: expected seconds like 30,200, got {text!r}") from None


def cmd_trace(args: argparse.Namespace) -> int:
    from april_bench.trace.format import read_trace, write_trace
    from april_bench.whatif import describe

    action = args.trace_command
    if action == "show":
        for line in describe(read_trace(_source(args.source), arm=args.arm)):
            print(line)
        return 0
    from april_bench.fsio import check_target

    check_target(args.out)  # -o a link, a FIFO or a device: refused before anything is read or written
    if action == "export":
        trace = read_trace(args.run, arm=args.arm)
        header, rows = trace.header, trace.rows
    elif action == "import-stats":
        from april_bench.trace.stats import import_stats

        header, rows = import_stats(
            args.source,
            groups_per_step=args.groups_per_step,
            samples_per_prompt=args.samples_per_prompt,
            max_response_len=args.max_response_len,
            prompt_tokens=args.prompt_tokens,
            mean_column=args.mean_column,
            step_column=args.step_column,
            seed=args.seed,
        )
    else:
        from april_bench.trace.tokens import token_counter

        counter = token_counter(args.tokenizer)
        if action == "import-verl":
            from april_bench.trace.verl import import_verl

            header, rows = import_verl(
                args.source, counter, max_response_len=args.max_response_len, reward_key=args.reward_key
            )
        else:
            from april_bench.trace.slime import import_slime

            header, rows = import_slime(
                args.source, counter, max_response_len=args.max_response_len, reward_key=args.reward_key
            )
    n = write_trace(args.out, header, rows)
    written = read_trace(args.out)  # what whatif will read: checked once here
    for line in describe(written):
        print(line)
    print(f"\ntrace: {args.out} ({n} rows); next: python -m april_bench whatif {args.out} --hw h100")
    return 0
