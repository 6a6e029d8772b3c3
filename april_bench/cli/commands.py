"""``run``, ``validate``, ``ls`` and ``report``."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["add_inspect_parsers", "cmd_ls", "cmd_report", "cmd_run", "cmd_validate"]

LS_SECTIONS = ("strategies", "engines", "trainers", "algorithms", "models", "datasets", "hardware")


def _echo(line: str) -> None:
    print(line, file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from april_bench.backends import build_components
    from april_bench.cli.args import config_from_args
    from april_bench.results.resume import RunStatus
    from april_bench.results.rundir import claim_run_dir, default_run_name

    if args.resume is not None:
        return _resume(args)
    config = config_from_args(args)
    trackers = _trackers(args)  # a tracker whose library is missing: refused before anything runs
    components = build_components(config, progress=not args.no_progress)
    components.check(config.telemetry)
    check_drivers(config, components)
    _check_reference_run(args.out, allow_dirty=args.allow_dirty)
    name = default_run_name(config.hardware, config.algorithm, config.dataset)
    out = claim_run_dir(args.out, default_name=name, overwrite=args.overwrite)
    status = RunStatus(path=out / "status.json")
    status.save()
    return _execute(
        config,
        components,
        out,
        status,
        progress=not args.no_progress,
        metadata=dict(args.metadata),
        trackers=trackers,
    )


def _trackers(args: argparse.Namespace) -> dict[str, Any]:
    from april_bench.cli.args import split_list
    from april_bench.results.trackers import check_trackers

    names = split_list(args.logger) if args.logger else ()
    check_trackers(names)
    return {"names": names, "project": args.logger_project, "offline": args.logger_offline}


def _check_reference_run(out: Path | None, *, allow_dirty: bool) -> None:
    """A run written into the checkout's ``results/`` is a committed reference: its provenance must name
    a commit that holds exactly the code that produced it."""
    from april_bench.config import ConfigError
    from april_bench.results.provenance import git_info, source_root

    root = source_root()
    if out is None or root is None or allow_dirty:
        return
    if not out.expanduser().resolve().is_relative_to((root / "results").resolve()):
        return
    if git_info(root).get("dirty"):
        raise ConfigError(
            f"{out} is a reference run under results/ but the checkout has uncommitted changes: "
            "commit them first, or pass --allow-dirty"
        )


def check_drivers(config: Any, components: Any) -> None:
    from april_bench.experiment import check_drivers as check

    check(config, components)


def _resume(args: argparse.Namespace) -> int:
    """Continue an interrupted run from its checkpoints, with the run's own configuration."""
    from april_bench.backends import build_components
    from april_bench.cli.args import flags_set
    from april_bench.config import ConfigError
    from april_bench.experiment_config import load_config
    from april_bench.results.resume import RunStatus, read_rows_for_resume

    out = Path(args.resume).expanduser()
    extra = [f for f in flags_set(args) if f not in ("--resume", "--no-progress")]
    if extra:
        raise ConfigError(f"--resume continues a run with its own configuration; drop {', '.join(extra)}")
    status = RunStatus.load(out)
    if status.state == "complete":
        raise ConfigError(f"{out} is already complete; `report {out}` shows its tables")
    try:
        config = load_config(json.loads((out / "config.json").read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{out}/config.json cannot be read ({exc}); the run cannot resume") from None
    components = build_components(config, progress=not args.no_progress)
    components.check(config.telemetry)
    check_drivers(config, components)
    kept = read_rows_for_resume(out, status, config.steps)
    _echo(f"resuming {out}: {resume_line(status, config)}")
    status.state, status.message = "running", ""  # the interrupt's message is history now
    status.save()
    return _execute(config, components, out, status, progress=not args.no_progress, kept=kept)


def resume_line(status: Any, config: Any) -> str:
    """``59 of 120 steps saved: sync 29/60, april 30/60`` (``#r`` after an arm for repeats past the first)."""
    parts = []
    for repeat in range(config.repeats):
        for arm in config.arms:
            done = status.completed.get(f"{arm.label}#{repeat}", 0)
            parts.append(f"{arm.label}{f' #{repeat}' if repeat else ''} {done}/{config.steps}")
    total = config.steps * config.repeats * len(config.arms)
    return f"{sum(status.completed.values())} of {total} steps saved: {', '.join(parts)}"


def _execute(
    config: Any,
    components: Any,
    out: Path,
    status: Any,
    *,
    progress: bool,
    kept: dict[str, list[dict[str, Any]]] | None = None,
    metadata: dict[str, Any] | None = None,
    trackers: dict[str, Any] | None = None,
) -> int:
    """Run (or continue) the experiment into ``out``, streaming rows; stop cleanly on SIGINT/SIGTERM."""
    from april_bench.cli import prog_name
    from april_bench.experiment import run
    from april_bench.results.provenance import collect_provenance
    from april_bench.results.records import RunRecorder
    from april_bench.results.store import RunWriter, render_tables, write_json_atomic

    simulated = components.engine_spec.simulated
    provenance_path = out / "provenance.json"
    if kept is None or not provenance_path.exists():
        provenance = collect_provenance(
            simulated=simulated, engine=components.engine_name, notes=components.notes, metadata=metadata
        )
        write_json_atomic(out / "config.json", config.to_dict())
        from april_bench.config_files import write_config_file

        write_config_file(out / "config.yaml", config)  # `run --config DIR/config.yaml` repeats the run
        write_json_atomic(provenance_path, provenance)
    else:
        provenance = json.loads(provenance_path.read_text())
        provenance.setdefault("resumed", []).append(collect_provenance(simulated=simulated, engine="")["utc"])
    from april_bench.results.trackers import open_trackers

    writer = open_trackers(  # the run directory's writer, and the --logger trackers beside it
        **(trackers or {"names": ()}),
        inner=RunWriter(out),
        out=out,
        config=config.to_dict(),
        provenance=provenance,
    )
    recorder = RunRecorder(sink=writer)
    if kept:
        recorder.preload(kept)
    received: list[str] = []
    try:
        with _signals_as_interrupts(received):
            result = run(
                config, progress=progress, echo=_echo, recorder=recorder, components=components, status=status
            )
    except BaseException as exc:
        writer.close()
        writer.inner.close()
        # A signal raised inside the event loop's machinery can surface as another error (for example
        # a virtual-time deadlock once the task it interrupted is gone): the run was still interrupted.
        if not isinstance(exc, KeyboardInterrupt) and not received:
            status.state, status.message = "failed", f"{type(exc).__name__}: {exc}"
            status.save()
            raise
        status.state, status.message = "interrupted", f"stopped by {received[0] if received else 'SIGINT'}"
        status.save()
        done = sum(status.completed.values())
        _echo(
            f"interrupted: {done} step(s) are saved in {out}; continue with "
            f"`{prog_name()} run --resume {out}`"
        )
        return 130 if not received or received[0] == "SIGINT" else 143
    provenance = collect_provenance(
        simulated=result.simulated,
        engine=result.engine,
        engine_version=result.engine_version,
        engine_dtype=result.engine_dtype,
        notes=result.notes,
        started=provenance,
    )
    write_json_atomic(provenance_path, provenance)
    stored = writer.inner.finish(config.to_dict(), provenance, recorder.tables)
    status.state = "complete"
    status.save()
    summary: dict[str, dict[str, Any]] = stored.summary()
    writer.finish(summary)
    writer.close()
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


@contextlib.contextmanager
def _signals_as_interrupts(received: list[str]) -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C (a clean stop); the names of the signals received go to ``received``."""

    def handler(signum: int, frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second signal must not break the cleanup
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def cmd_validate(args: argparse.Namespace) -> int:
    """Build the configuration and check every component without running anything (no warm start, no GPU)."""
    from april_bench.backends import build_components
    from april_bench.cli.args import config_from_args

    config = config_from_args(args)
    _trackers(args)
    components = build_components(config)
    components.check(config.telemetry)
    check_drivers(config, components)
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
        "evals); refuses a run whose rows do not add up. Columns: docs/results-schema.md.",
    )
    report.add_argument("run_dir", type=Path, help="a run directory written by `run`")
    report.add_argument(
        "--no-check", action="store_true", help="render even if the rows do not add up (default: off)"
    )
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
                if name == "engines":
                    missing = registry.get(key).missing()
                    print(f"      {'not installed here: ' + missing if missing else 'installed here'}")
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
    from april_bench.config import ConfigError
    from april_bench.results.store import check_run, load_run, render_tables

    run = load_run(args.run_dir)
    problems = check_run(run)
    if problems and not args.no_check:
        raise ConfigError(
            f"{args.run_dir}: the rows do not add up, so its numbers would be wrong: {'; '.join(problems)}"
        )
    state = _state(args.run_dir)
    if state not in (None, "complete"):
        print(f"note: this run is {state}; the tables cover its completed steps", file=sys.stderr)
    print(render_tables(run.config, run.summary(), run.simulated))
    return 0


def _state(run_dir: Path) -> str | None:
    try:
        return str(json.loads((run_dir / "status.json").read_text()).get("state"))
    except (OSError, json.JSONDecodeError):
        return None
