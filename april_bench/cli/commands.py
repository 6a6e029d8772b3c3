"""``run``, ``validate``, ``ls`` and ``report``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_inspect_parsers", "cmd_ls", "cmd_report", "cmd_run", "cmd_validate"]

LS_SECTIONS = ("strategies", "engines", "trainers", "algorithms", "models", "datasets", "hardware")


def _echo(line: str) -> None:
    print(line, file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from april_bench.backends import build_components
    from april_bench.cli.args import config_from_args
    from april_bench.experiment import run
    from april_bench.results.provenance import collect_provenance
    from april_bench.results.records import RunRecorder
    from april_bench.results.rundir import claim_run_dir, default_run_name
    from april_bench.results.store import RunWriter, render_tables, write_json_atomic

    config = config_from_args(args)
    components = build_components(config, progress=not args.no_progress)
    components.check()
    out = claim_run_dir(
        args.out, default_name=default_run_name(config.hardware, config.algorithm, config.dataset)
    )
    engine_kind = components.engine_spec
    simulated = not engine_kind.produces_tokens or components.engine_name == "fake"
    provenance = collect_provenance(
        simulated=simulated, engine=components.engine_name, notes=components.notes
    )
    write_json_atomic(out / "config.json", config.to_dict())
    write_json_atomic(out / "provenance.json", provenance)
    writer = RunWriter(out)
    recorder = RunRecorder(sink=writer)
    try:
        result = run(
            config, progress=not args.no_progress, echo=_echo, recorder=recorder, components=components
        )
    finally:
        writer.close()
    provenance = collect_provenance(
        simulated=result.simulated,
        engine=result.engine,
        engine_version=result.engine_version,
        notes=result.notes,
        started=provenance,
    )
    write_json_atomic(out / "provenance.json", provenance)
    stored = writer.finish(config.to_dict(), provenance, recorder.tables)
    summary = stored.summary()
    print(render_tables(stored.config, summary, stored.simulated))
    print(f"\nrun directory: {out}")
    final: dict[str, Any] = {
        "result_kind": provenance["result_kind"],
        "out": str(out),
        "baseline": next(iter(summary.values()), {}).get("baseline"),
        "throughput_gain": {arm: m["throughput_gain"] for arm, m in summary.items()},
    }
    print(json.dumps(final))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Build the configuration and check every component without running anything (no warm start, no GPU)."""
    from april_bench.backends import build_components
    from april_bench.cli.args import config_from_args

    config = config_from_args(args)
    components = build_components(config)
    for note in components.notes:
        print(note)
    components.check()
    where = f"{config.model} on {config.hardware}"
    if components.engine_name == "sim":
        info = components.engine().info
        where = f"{info.replicas} replica(s) of {info.model} on {info.hardware}"
    if args.out is not None:
        out = Path(args.out).expanduser()
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            from april_bench.config import ConfigError

            raise ConfigError(f"--out {out} exists and is not an empty directory; `run` would refuse it")
    print(
        f"ok: {components.engine_name} engine, {where}; {components.task.kind} task on {config.dataset}; "
        f"{components.trainer_spec.name} trainer; arms: {', '.join(config.strategies)}; "
        f"{config.steps} steps; dynamic sampling {'on' if config.dynamic_sampling_on else 'off'}"
    )
    return 0


def add_inspect_parsers(sub: Any) -> None:
    ls = sub.add_parser(
        "ls", help="list strategies, engines, trainers, hardware, models, data sets, algorithms"
    )
    ls.add_argument("what", nargs="?", default="all", choices=("all", *LS_SECTIONS))
    ls.set_defaults(handler=cmd_ls)
    report = sub.add_parser("report", help="re-render a run directory's tables from its rows")
    report.add_argument("run_dir", type=Path)
    report.set_defaults(handler=cmd_report)


def cmd_ls(args: argparse.Namespace) -> int:
    from april_bench.algorithms import ALGORITHMS
    from april_bench.backends.trainers import TRAINERS
    from april_bench.engines import ENGINES
    from april_bench.profiles.models import MODELS
    from april_bench.rollout.registry import STRATEGIES, strategy_options

    sections: dict[str, Any] = {
        "strategies": STRATEGIES,
        "engines": ENGINES,
        "trainers": TRAINERS,
        "algorithms": ALGORITHMS,
        "models": MODELS,
    }
    for name, registry in sections.items():
        if args.what in ("all", name):
            print(f"{name}:")
            for key in registry:
                print(f"  {key:22s} {registry.describe(key)}")
                if name == "strategies" and args.what == name:
                    for option, text in strategy_options(key).items():
                        print(f"      {option}: {text}")
    if args.what in ("all", "datasets"):
        _ls_datasets()
    if args.what in ("all", "hardware"):
        _ls_hardware(verbose=args.what == "hardware")
    return 0


def _ls_datasets() -> None:
    from april_bench.data.specs import DATASETS as DATA_SETS
    from april_bench.sim.workload import DATASETS

    print("datasets (simulator length profiles):")
    for key in DATASETS:
        print(f"  {key:22s} {DATASETS.describe(key)}")
    print("math data sets (--data-path NAME=PATH, else the hub):")
    for key, spec in DATA_SETS.items():
        print(f"  {key:22s} {spec.role:5s} hub {spec.hub_id}, template {spec.template}, grader {spec.grader}")


def _ls_hardware(*, verbose: bool) -> None:
    from april_bench.profiles.hardware import HARDWARE

    print("hardware:")
    print("  cpu                    this machine, measured at first use (numpy matmul and copy)")
    for key in HARDWARE:
        hw = HARDWARE.get(key)
        print(
            f"  {key:22s} {HARDWARE.describe(key)}: {hw.memory_bw / 1e12:.2f} TB/s x {hw.eta_bw:.2f}, "
            f"{hw.bf16_flops / 1e12:,.0f} TFLOP/s x {hw.eta_flops:.2f}"
        )
        if verbose:
            for field, source in hw.sources.items():
                print(f"      {field}: {source}")


def cmd_report(args: argparse.Namespace) -> int:
    from april_bench.results.store import load_run, render_tables

    run = load_run(args.run_dir)
    print(render_tables(run.config, run.summary(), run.simulated))
    return 0
