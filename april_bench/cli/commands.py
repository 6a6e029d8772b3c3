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
    from april_bench.results.lock import RunLock
    from april_bench.results.resume import RunStatus
    from april_bench.results.rundir import claim_run_dir, default_run_name

    if args.resume is not None:
        return _resume(args)
    config = config_from_args(args)
    components = build_components(config, progress=not args.no_progress)
    components.check(config.telemetry)
    check_drivers(config, components)
    _check_reference_run(args.out, allow_dirty=args.allow_dirty)
    name = default_run_name(config.hardware, config.algorithm, config.dataset)
    lock = RunLock()  # taken by claim_run_dir and held for the whole run: a second process is refused
    try:
        out = claim_run_dir(args.out, default_name=name, overwrite=args.overwrite, lock=lock)
        status = RunStatus(path=out / "status.json")
        status.save()
        return _execute(config, components, out, status, progress=not args.no_progress)
    finally:
        lock.release()


def _check_reference_run(out: Path | None, *, allow_dirty: bool) -> None:
    """A run written into the checkout's ``results/`` is a committed reference: its provenance must name
    a commit that holds exactly the code that produced it."""
    from april_bench.results.reference import check_reference_output

    check_reference_output(out, allow_dirty=allow_dirty)


def check_drivers(config: Any, components: Any) -> None:
    from april_bench.experiment import check_drivers as check

    check(config, components)


def _resume(args: argparse.Namespace) -> int:
    """Continue an interrupted run from its checkpoints, with the run's own configuration."""
    from april_bench.backends import build_components
    from april_bench.cli.args import flags_set
    from april_bench.config import ConfigError
    from april_bench.experiment_config import load_config
    from april_bench.results.lock import RunLock
    from april_bench.results.resume import RunStatus, read_rows_for_resume
    from april_bench.results.rundir import remove_stale_scratch
    from april_bench.results.validate_files import check_resumable, read_json_object

    out = Path(args.resume).expanduser()
    extra = [f for f in flags_set(args) if f not in ("--resume", "--no-progress", "--allow-dirty")]
    if extra:
        raise ConfigError(f"--resume continues a run with its own configuration; drop {', '.join(extra)}")
    if not out.is_dir():
        raise ConfigError(f"--resume {out}: no such run directory")
    _check_reference_run(out, allow_dirty=args.allow_dirty)
    with RunLock(out) as _lock:  # held for the whole run: a second resume of this directory is refused
        status = RunStatus.load(out)
        if status.state == "complete":
            raise ConfigError(f"{out} is already complete; `report {out}` shows its tables")
        try:
            config = load_config(read_json_object(out / "config.json", "run configuration"))
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(
                f"{out}/config.json is not a configuration april-bench can read ({exc}); the run cannot "
                "resume"
            ) from None
        check_resumable(out, status)
        remove_stale_scratch(out)  # a killed run's weights hand-over directory
        components = build_components(config, progress=not args.no_progress)
        components.check(config.telemetry)
        check_drivers(config, components)
        kept = read_rows_for_resume(out, status, config.steps)
        done = sum(status.completed.values())
        _echo(f"resuming {out}: {done} completed step(s) across {len(status.completed)} session(s)")
        status.state = "running"
        status.save()
        return _execute(config, components, out, status, progress=not args.no_progress, kept=kept)


def _execute(
    config: Any,
    components: Any,
    out: Path,
    status: Any,
    *,
    progress: bool,
    kept: dict[str, list[dict[str, Any]]] | None = None,
) -> int:
    """Run (or continue) the experiment into ``out``, streaming rows; stop cleanly on SIGINT/SIGTERM."""
    from april_bench.experiment import run
    from april_bench.results.provenance import collect_provenance
    from april_bench.results.records import RunRecorder
    from april_bench.results.store import RunWriter, render_tables, write_json_atomic
    from april_bench.results.validate_files import read_provenance, resumed_provenance, write_failed

    simulated = components.engine_spec.simulated
    provenance_path = out / "provenance.json"
    if kept is None or not provenance_path.exists():
        provenance = collect_provenance(
            simulated=simulated, engine=components.engine_name, notes=components.notes, out=out
        )
        write_json_atomic(out / "config.json", config.to_dict())
        write_json_atomic(provenance_path, provenance)
    else:
        provenance = resumed_provenance(read_provenance(provenance_path), out)
    writer = RunWriter(out)
    recorder = RunRecorder(sink=writer)
    if kept:
        recorder.preload(kept)
        writer.count_existing(kept)
    status.counter = writer.counts  # each checkpoint records the rows it covers
    received: list[str] = []
    try:
        with _signals_as_interrupts(received):
            result = run(
                config, progress=progress, echo=_echo, recorder=recorder, components=components, status=status
            )
    except BaseException as exc:
        with contextlib.suppress(OSError):  # a full disk fails the last flush too
            writer.close()
        if write_failed(exc):  # full disk, file-size limit: what was checkpointed is safe
            return _stopped_by_write_error(exc, out, status)
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
            f"`python -m april_bench run --resume {out}`"
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
    try:
        write_json_atomic(provenance_path, provenance)
        stored = writer.finish(config.to_dict(), provenance, recorder.tables)
        status.state = "complete"
        status.save()
    except OSError as exc:
        return _stopped_by_write_error(exc, out, status)
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


def _stopped_by_write_error(exc: BaseException, out: Path, status: Any) -> int:
    """A write failed (disk full, file-size limit): the run stops as interrupted, with its resume line."""
    reason = getattr(exc, "strerror", None) or str(exc)
    status.state, status.message = "interrupted", f"a write failed: {reason}"
    with contextlib.suppress(OSError):
        status.save()
    done = sum(status.completed.values())
    print(
        f"error: writing to {out} failed ({reason}); {done} step(s) are saved: free space (or raise the "
        f"file-size limit), then continue with `python -m april_bench run --resume {out}`",
        file=sys.stderr,
    )
    return 2


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
        "ls", help="list strategies, engines, trainers, hardware, models, data sets, algorithms"
    )
    ls.add_argument("what", nargs="?", default="all", choices=("all", *LS_SECTIONS))
    ls.set_defaults(handler=cmd_ls)
    report = sub.add_parser("report", help="re-render a run directory's tables from its rows")
    report.add_argument("run_dir", type=Path)
    report.add_argument(
        "--allow-incomplete",
        "--no-check",
        dest="allow_incomplete",
        action="store_true",
        help="render an interrupted run, or rows that do not add up or repeat, with a note saying so",
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
    from april_bench.results.fitness import check_fit
    from april_bench.results.store import load_run, render_tables

    run = load_run(args.run_dir)
    for note in check_fit(run, allow_incomplete=args.allow_incomplete, doing="report it"):
        print(f"note: {note}", file=sys.stderr)
    print(render_tables(run.config, run.summary(), run.simulated))
    return 0
