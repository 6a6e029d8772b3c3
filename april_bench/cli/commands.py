"""``run``, ``validate``, ``ls`` and ``report``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.cli.output import echo

if TYPE_CHECKING:
    from april_bench.runner import RunOutcome

__all__ = ["add_inspect_parsers", "cmd_ls", "cmd_report", "cmd_run", "cmd_validate", "print_outcome"]

LS_SECTIONS = ("strategies", "engines", "trainers", "algorithms", "models", "datasets", "hardware")


def _echo(line: str) -> None:
    echo(line)


def cmd_run(args: argparse.Namespace) -> int:
    """A new run into ``--out``, or ``--resume DIR``: one call into the runner, then the tables and a JSON
    line when it completed (the exit code says how it ended)."""
    from april_bench import runner
    from april_bench.allocator import tune_allocator
    from april_bench.cli.args import check_resume_flags, config_from_args

    tune_allocator()  # glibc keeps the steps' buffers mapped (APRIL_BENCH_MALLOC=default: not)
    if args.resume is not None:
        out = Path(args.resume).expanduser()
        check_resume_flags(args, lambda: runner.stored_config(out))  # a resume runs with its own config
        outcome = runner.resume(out, progress=not args.no_progress, echo=_echo, allow_dirty=args.allow_dirty)
    else:
        outcome = runner.run_into(
            config_from_args(args),
            args.out,
            overwrite=args.overwrite,
            allow_dirty=args.allow_dirty,
            progress=not args.no_progress,
            echo=_echo,
            metadata=dict(args.metadata),
            trackers=_trackers(args),  # checked by the runner before it claims the directory
        )
    return print_outcome(outcome)


def _trackers(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--logger`` options of ``run`` and ``validate``."""
    return {"names": args.logger or (), "project": args.logger_project, "offline": args.logger_offline}


def print_outcome(outcome: RunOutcome) -> int:
    """A completed run's tables (its ``table.md``), its directory and a one-line JSON summary; the exit
    code."""
    from april_bench.results.store import run_report

    if outcome.stored is not None:
        print(run_report(outcome.stored, outcome.out))
    return outcome.exit_code


def cmd_validate(args: argparse.Namespace) -> int:
    """Build the configuration and check every component without running anything (no warm start, no GPU)."""
    from april_bench import runner
    from april_bench.cli.args import config_from_args
    from april_bench.results.trackers import check_trackers

    config = config_from_args(args)
    check_trackers(_trackers(args)["names"])
    components = runner.prepare(config)
    for note in components.notes:
        print(note)
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
        "ls",
        help="list strategies, engines, trainers, hardware, models, data sets, algorithms",
        description="What a run can be built from: every registry's entries with one line each "
        "(`ls engines` also says which engines are installed here, `ls strategies` their options).",
    )
    ls.add_argument(
        "what",
        nargs="?",
        default="all",
        choices=("all", *LS_SECTIONS),
        help="the section to list (default: all)",
    )
    ls.set_defaults(handler=cmd_ls)
    report = sub.add_parser(
        "report",
        help="re-render a run directory's tables from its rows",
        description="Print a run directory's tables again, recomputed from its rows (steps, samples, "
        "evals); refuses an interrupted run, or one whose rows do not add up or repeat, unless "
        "--allow-incomplete. Columns: docs/results-schema.md.",
    )
    report.add_argument("run_dir", type=Path, help="a run directory written by `run`")
    report.add_argument(
        "--allow-incomplete",
        "--no-check",
        dest="allow_incomplete",
        action="store_true",
        help="render an interrupted run, or rows that do not add up or repeat, with a note saying so "
        "(default: off)",
    )
    report.set_defaults(handler=cmd_report)


def cmd_ls(args: argparse.Namespace) -> int:
    from april_bench.algorithms import ALGORITHMS
    from april_bench.engines import ENGINES
    from april_bench.profiles.models import MODELS
    from april_bench.strategies import STRATEGIES, strategy_options
    from april_bench.trainers.registry import TRAINERS

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
                if name == "engines":
                    print(f"      {_engine_here(registry.get(key))}")
                if name == "strategies" and args.what == name:
                    for option, text in strategy_options(key).items():
                        print(f"      {option}: {text}")
                if name in ("engines", "trainers") and args.what == name:
                    _print_options(registry.get(key))
    if args.what in ("all", "datasets"):
        _ls_datasets()
    if args.what in ("all", "hardware"):
        _ls_hardware(verbose=args.what == "hardware")
    return 0


def _print_options(spec: Any) -> None:
    """A component's ``--engine-arg``/``--trainer-arg`` options, read from its Config's fields (a module
    that cannot be imported here says so instead)."""
    try:
        options = spec.option_help()
    except ImportError as exc:
        print(f"      (options not listed: {exc.name or exc} is not importable here)")
        return
    for option, text in options.items():
        print(f"      {option}: {text}")
    if not options and not spec.options_note:
        print("      (no options: its flags set it)")
    if spec.options_note:
        print(f"      + {spec.options_note}")


def _engine_here(spec: Any) -> str:
    """Whether an engine runs here: its packages, and for an adapter that launches its own server, the
    server's package (an installed adapter alone cannot launch SGLang)."""
    missing = spec.missing()
    if missing:
        return "not installed here: " + missing
    launch = spec.launch_missing()
    if launch:
        return "adapter installed here; " + launch
    return "installed here"


def _ls_datasets() -> None:
    from april_bench.data.specs import DATASETS
    from april_bench.sim.workload import DATASET_PROFILES

    print("datasets (simulator length profiles):")
    for key in DATASET_PROFILES:
        print(f"  {key:22s} {DATASET_PROFILES.describe(key)}")
    print("math data sets (--data-path NAME=PATH, else the hub):")
    for key, spec in DATASETS.items():
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
    from april_bench.results.fitness import check_fit
    from april_bench.results.readings import READINGS_FILE, render_readings
    from april_bench.results.store import load_run, render_tables
    from april_bench.results.validate_files import read_json_object

    run = load_run(args.run_dir)
    for note in check_fit(run, allow_incomplete=args.allow_incomplete, doing="report it"):
        print(f"note: {note}", file=sys.stderr)
    text = render_tables(run.config, run.summary(), run.simulated)
    readings = Path(args.run_dir) / READINGS_FILE
    if readings.is_file():  # the row's other readings, written by `run` (april_bench.experiment.readings)
        text += "\n\n" + render_readings(read_json_object(readings, "readings"))
    print(text)
    return 0
