"""``python -m april_bench``: run | ls | validate | report.

Examples::

    python -m april_bench run --hw mi300x --algo dapo
    python -m april_bench run --hw h100 --dataset deepmath-103k --strategies sync,april --steps 50
    python -m april_bench run --engine-arg max_running_requests=64 --workload-arg response_median=3000
    python -m april_bench ls hardware
    python -m april_bench report runs/<run-id>
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.engines.protocol import EngineError

__all__ = ["build_parser", "main"]

HARDWARE_CHOICES = ("cpu", "h100", "h200", "mi300x")
ALGO_CHOICES = ("grpo", "dapo", "gspo")
DATASET_CHOICES = ("dapo-math-17k", "deepscaler", "deepmath-103k")
ENGINE_CHOICES = ("auto", "sim")


def _key_value(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip().replace("-", "_"), value


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group("what to compare")
    what.add_argument("--hw", default="h100", choices=HARDWARE_CHOICES, help="hardware to run or simulate")
    what.add_argument("--algo", default="grpo", choices=ALGO_CHOICES, help="dapo turns on dynamic sampling")
    what.add_argument("--dataset", default="dapo-math-17k", choices=DATASET_CHOICES)
    what.add_argument("--model", default="qwen3-4b", help="model profile (see: ls models)")
    what.add_argument(
        "--engine",
        default="auto",
        choices=ENGINE_CHOICES,
        help="auto: a real engine when the hardware and engine are present, else the simulator",
    )
    what.add_argument(
        "--strategies",
        default="sync,oversample-discard,april",
        help="comma-separated arms; sync is the baseline of every gain",
    )
    what.add_argument("--steps", type=int, default=20, help="training steps per arm")
    what.add_argument("--seed", type=int, default=0, help="seed of prompts and length draws")
    batch = p.add_argument_group("rollout batch (APRIL's paper settings are the defaults)")
    batch.add_argument("--rollout-batch-size", type=int, default=32, help="N: groups trained per step")
    batch.add_argument("--n-samples-per-prompt", type=int, default=8, help="samples per group")
    batch.add_argument("--over-sampling-batch-size", type=int, default=64, help="N': groups per launch wave")
    batch.add_argument("--max-response-len", type=int, default=16384, help="response token limit")
    batch.add_argument(
        "--dynamic-sampling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="DAPO dynamic sampling (default: on for dapo only)",
    )
    batch.add_argument(
        "--refill",
        choices=("wave", "granular"),
        default="wave",
        help="after rejections relaunch a whole wave (reference) or just the deficit",
    )
    caps = p.add_argument_group("APRIL staleness caps (off by default, as in the paper)")
    caps.add_argument(
        "--max-version-span",
        type=int,
        default=None,
        help="restart buffered samples whose oldest token is this many versions old",
    )
    caps.add_argument(
        "--max-aborts-per-sample",
        type=int,
        default=None,
        help="restart samples aborted more than this many times",
    )
    env = p.add_argument_group("engine and workload")
    env.add_argument("--num-gpus", type=int, default=None, help="GPUs (default: one 8-GPU node)")
    env.add_argument(
        "--engine-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="NAME=VALUE",
        help="native engine argument, e.g. tp_size=1 or max_running_requests=64 (repeatable)",
    )
    env.add_argument(
        "--workload-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="NAME=VALUE",
        help="simulated-workload override, e.g. response_median=3000 or length_trace=lens.jsonl",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m april_bench",
        description="APRIL (Active Partial Rollouts) against synchronous baselines, "
        "on real or simulated engines.",
        epilog="Every number is labelled simulated or measured. Docs: README.md and docs/simulator.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="compare strategies on one workload and print a paper-style table",
        description="Run every strategy on the same prompts and length draws; write a run directory.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_run_arguments(run)
    out = run.add_argument_group("output")
    out.add_argument(
        "--out", type=Path, default=None, help="run directory (default: runs/<time>-<hw>-<algo>)"
    )
    out.add_argument("--no-progress", action="store_true", help="hide progress bars")
    validate = sub.add_parser("validate", help="check a configuration without running it")
    _add_run_arguments(validate)
    ls = sub.add_parser("ls", help="list strategies, engines, hardware, models, data sets, algorithms")
    ls.add_argument(
        "what",
        nargs="?",
        default="all",
        choices=("all", "strategies", "engines", "hardware", "models", "datasets", "algorithms"),
    )
    report = sub.add_parser("report", help="re-render a run directory's tables from its rows")
    report.add_argument("run_dir", type=Path)
    return parser


def config_from_args(args: argparse.Namespace) -> Any:
    from april_bench.experiment import ExperimentConfig
    from april_bench.rollout.loop import RolloutConfig

    rollout = RolloutConfig(
        rollout_batch_size=args.rollout_batch_size,
        n_samples_per_prompt=args.n_samples_per_prompt,
        over_sampling_batch_size=args.over_sampling_batch_size,
        max_response_len=args.max_response_len,
        refill=args.refill,
    )
    return ExperimentConfig(
        hardware=args.hw,
        algorithm=args.algo,
        dataset=args.dataset,
        model=args.model,
        engine=args.engine,
        strategies=tuple(s.strip() for s in args.strategies.split(",") if s.strip()),
        steps=args.steps,
        seed=args.seed,
        rollout=rollout,
        dynamic_sampling=args.dynamic_sampling,
        max_version_span=args.max_version_span,
        max_aborts_per_sample=args.max_aborts_per_sample,
        num_gpus=args.num_gpus,
        engine_args=dict(args.engine_arg),
        workload_args=dict(args.workload_arg),
    )


def _cmd_run(args: argparse.Namespace) -> int:
    from april_bench.experiment import run
    from april_bench.results.provenance import collect_provenance
    from april_bench.results.store import render_tables, write_run

    config = config_from_args(args)
    result = run(config, progress=not args.no_progress, echo=lambda line: print(line, file=sys.stderr))
    out = (
        args.out
        or Path("runs")
        / f"{time.strftime('%Y%m%d-%H%M%S')}-{config.hardware}-{config.algorithm}-{config.dataset}"
    )
    provenance = collect_provenance(simulated=result.simulated, engine=result.engine, notes=result.notes)
    rec = result.recorder
    stored = write_run(
        out,
        config=config.to_dict(),
        provenance=provenance,
        requests=rec.requests,
        samples=rec.samples,
        steps=rec.steps,
    )
    summary = stored.summary()
    print(render_tables(stored.config, summary, stored.simulated))
    print(f"\nrun directory: {out}")
    final = {
        "result_kind": provenance["result_kind"],
        "out": str(out),
        "throughput_gain_vs_sync": {arm: m["throughput_gain_vs_sync"] for arm, m in summary.items()},
    }
    print(json.dumps(final))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from april_bench.engines.detect import resolve_engine
    from april_bench.experiment import build_components

    config = config_from_args(args)
    engine, note = resolve_engine(config.engine, config.hardware)
    components = build_components(config, engine)
    engine_obj = components.engine()
    info = engine_obj.info
    if note:
        print(note)
    print(
        f"ok: {engine} engine, {info.replicas} replica(s) of {info.model} on {info.hardware}; "
        f"arms: {', '.join(config.strategies)}; "
        f"dynamic sampling {'on' if config.dynamic_sampling_on else 'off'}"
    )
    return 0


def _cmd_ls(args: argparse.Namespace) -> int:
    from april_bench.algorithms import ALGORITHMS
    from april_bench.engines import ENGINES
    from april_bench.sim.hardware import HARDWARE
    from april_bench.sim.models import MODELS
    from april_bench.sim.workload import DATASETS
    from april_bench.strategies import STRATEGIES

    sections = {
        "strategies": STRATEGIES,
        "engines": ENGINES,
        "algorithms": ALGORITHMS,
        "models": MODELS,
        "datasets": DATASETS,
    }
    for name, registry in sections.items():
        if args.what in ("all", name):
            print(f"{name}:")
            for key in registry:
                print(f"  {key:22s} {registry.describe(key)}")
    if args.what in ("all", "hardware"):
        print("hardware:")
        print("  cpu                    this machine, measured at first use (numpy matmul and copy)")
        for key in HARDWARE:
            hw = HARDWARE.get(key)
            print(
                f"  {key:22s} {HARDWARE.describe(key)}: {hw.memory_bw / 1e12:.2f} TB/s x {hw.eta_bw:.2f}, "
                f"{hw.bf16_flops / 1e12:,.0f} TFLOP/s x {hw.eta_flops:.2f}"
            )
            if args.what == "hardware":
                for field, source in hw.sources.items():
                    print(f"      {field}: {source}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from april_bench.results.store import load_run, render_tables

    run = load_run(args.run_dir)
    print(render_tables(run.config, run.summary(), run.simulated))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {"run": _cmd_run, "validate": _cmd_validate, "ls": _cmd_ls, "report": _cmd_report}[args.command]
    try:
        return handler(args)
    except (ConfigError, KeyError, FileNotFoundError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"error: {message}", file=sys.stderr)
        return 2
    except EngineError as exc:
        print(f"engine error: {exc}", file=sys.stderr)
        return 1
