"""A run directory's life: validate once, claim, status, signals, interruption, resume.

The CLI (``run``, ``ablate``) and a Python user call the same functions::

    from april_bench import ExperimentConfig, run
    result = run(ExperimentConfig(hardware="mi300x", algorithm="dapo", steps=10), out="runs/mine")

:func:`run_into` claims ``out`` (refusing to mix runs), writes ``config.json`` and
``provenance.json``, streams the rows as the run goes, and on SIGINT/SIGTERM
stops cleanly with ``status.json`` saying where :func:`resume` continues.  One
:class:`ClaimedRun` holds each run directory's life, for ``run``, ``--resume``,
``ablate``, ``whatif`` and ``simcheck`` alike.  Nothing here prints tables: the
CLI prints the ``table.md`` the run wrote (:func:`april_bench.results.store.run_report`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from april_bench.engines.protocol import EngineLost
from april_bench.trainers.protocol import TrainerLost

if TYPE_CHECKING:
    from april_bench.backends import Components
    from april_bench.experiment import RunResult
    from april_bench.experiment_config import ExperimentConfig
    from april_bench.results.recorder import RunRecorder
    from april_bench.results.resume import RunStatus
    from april_bench.results.rundir import RunLock
    from april_bench.results.store import RunDirectory, RunWriter
    from april_bench.results.trackers import TrackerSet

__all__ = [
    "ClaimedRun",
    "RunOutcome",
    "check_reference_run",
    "execute_grid",
    "other_readings",
    "prepare",
    "resume",
    "run",
    "run_into",
    "signals_as_interrupts",
]

Echo = Callable[[str], None]

#: ``RunOutcome.interrupted_by`` of a run whose engine lost every replica (exit status 75, EX_TEMPFAIL:
#: the completed steps are saved and ``run --resume`` continues once the engine is back).
ENGINE_LOST = "engine_lost"
#: ``RunOutcome.interrupted_by`` of a run whose trainer died (a Ray trainer actor): exit status 75 too.
TRAINER_LOST = "trainer_lost"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What a run into a directory ended with: complete (``stored`` set) or interrupted by a signal."""

    out: Path
    result: RunResult | None = None
    stored: RunDirectory | None = None
    #: The signal that stopped the run (``"SIGINT"`` for Ctrl-C), or :data:`ENGINE_LOST`; ``None``: it
    #: completed.
    interrupted_by: str | None = None

    @property
    def exit_code(self) -> int:
        if self.interrupted_by is None:
            return 0
        if self.interrupted_by in (ENGINE_LOST, TRAINER_LOST):
            return 75
        return 130 if self.interrupted_by == "SIGINT" else 143


def prepare(config: ExperimentConfig, *, progress: bool = False) -> Components:
    """The run's components, validated (the one validation of a run; no heavy work)."""
    from april_bench.backends import build_components

    return build_components(config, progress=progress)


def run(
    config: ExperimentConfig,
    *,
    out: str | Path | None = None,
    overwrite: bool = False,
    allow_dirty: bool = False,
    progress: bool = True,
    echo: Echo | None = None,
    recorder: RunRecorder | None = None,
) -> RunResult:
    """Run every arm of ``config``; with ``out``, into a run directory exactly as ``python -m april_bench
    run --out`` writes it (an interruption is saved, then re-raised as ``KeyboardInterrupt``)."""
    from april_bench.experiment import run_prepared

    if out is None:
        return run_prepared(
            config, prepare(config, progress=progress), progress=progress, echo=echo, recorder=recorder
        )
    outcome = run_into(
        config, Path(out), overwrite=overwrite, allow_dirty=allow_dirty, progress=progress, echo=echo
    )
    if outcome.result is None:
        raise KeyboardInterrupt(
            f"stopped by {outcome.interrupted_by}; resume with runner.resume({str(out)!r})"
        )
    outcome.result.out = outcome.out
    return outcome.result


def run_into(
    config: ExperimentConfig,
    out: Path | None,
    *,
    components: Components | None = None,
    overwrite: bool = False,
    allow_dirty: bool = False,
    progress: bool = True,
    echo: Echo | None = None,
    metadata: dict[str, Any] | None = None,
    trackers: dict[str, Any] | None = None,
) -> RunOutcome:
    """Validate (``components`` given: already validated), claim ``out`` (``None``: a fresh directory
    under ``runs/``) and run into it, holding its lock throughout (one :class:`ClaimedRun`).
    ``metadata``: labels merged into provenance and summary (``--metadata``); ``trackers``: the
    ``--logger`` sinks (:func:`april_bench.results.trackers.open_trackers` options)."""
    claimed = ClaimedRun.claim(
        config,
        components,
        out,
        overwrite=overwrite,
        allow_dirty=allow_dirty,
        progress=progress,
        echo=echo,
        metadata=metadata,
        trackers=trackers,
    )
    with claimed:  # its lock is held until the run ends
        return claimed.execute(readings=True)


def resume(
    out: str | Path, *, progress: bool = True, echo: Echo | None = _stderr, allow_dirty: bool = False
) -> RunOutcome:
    """Continue an interrupted run from its checkpoints, with the run's own configuration.  The run's
    lock is held throughout (a second resume is refused), and every file the resume reads is checked
    before the status says ``running``."""
    claimed = ClaimedRun.reopen(Path(out).expanduser(), progress=progress, echo=echo, allow_dirty=allow_dirty)
    with claimed:  # its lock is held until the run ends
        return claimed.execute(readings=True)


def stored_config(out: Path) -> ExperimentConfig:
    """The configuration a run directory was made with (its ``config.json``); ConfigError when there is
    none april-bench can read."""
    from april_bench.config import ConfigError
    from april_bench.experiment_config import load_config
    from april_bench.redact import redacted_fields
    from april_bench.results.store import check_run_config
    from april_bench.results.validate_files import read_json_object

    if not out.is_dir():
        raise ConfigError(f"--resume {out}: no such run directory")
    stored = read_json_object(out / "config.json", "run configuration")
    check_run_config(out / "config.json", stored)  # `{}` is damaged, not a run of the defaults
    check_schema_versions(out)
    hidden = redacted_fields(stored)
    if hidden:
        raise ConfigError(
            f"{out}/config.json holds credentials april-bench never stores ({', '.join(hidden)} "
            "redacted), so the run cannot resume with them; start it again with --out"
        )
    try:
        return load_config(stored)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"{out}/config.json is not a configuration april-bench can read ({exc}); the run cannot resume"
        ) from None


def check_schema_versions(out: Path) -> None:
    """Refuse to continue a run whose files a newer april-bench wrote: resuming would mix versions."""
    from april_bench.config import ConfigError
    from april_bench.results.schema import SCHEMA_VERSION, schema_version_of
    from april_bench.results.validate_files import read_json_object

    for name in ("config.json", "provenance.json", "status.json"):
        if not (out / name).exists():
            continue
        version = schema_version_of(read_json_object(out / name, name.removesuffix(".json")))
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"{out / name}: written by a newer april-bench (schema_version {version}; this one reads "
                f"up to {SCHEMA_VERSION}): resume it with that version, not this one"
            )


def resume_line(status: RunStatus, config: ExperimentConfig) -> str:
    """``59 of 120 steps saved: sync 29/60, april 30/60`` (`` #r`` after an arm for later repeats)."""
    parts = []
    for repeat in range(config.repeats):
        for arm in config.arms:
            done = status.completed.get(f"{arm.label}#{repeat}", 0)
            parts.append(f"{arm.label}{f' #{repeat}' if repeat else ''} {done}/{config.steps}")
    total = config.steps * config.repeats * len(config.arms)
    return f"{sum(status.completed.values())} of {total} steps saved: {', '.join(parts)}"


def check_reference_run(out: Path | None, *, allow_dirty: bool) -> None:
    """A run written into the checkout's ``results/`` is a committed reference: its provenance must name
    a commit that holds exactly the code that produced it (:mod:`april_bench.results.reference`)."""
    from april_bench.results.reference import check_reference_output

    check_reference_output(out, allow_dirty=allow_dirty)


class ClaimedRun:
    """One run directory's life, held by one object from the claim to the tables: the claim and its
    lock (:meth:`claim`, or :meth:`reopen` for ``--resume``), the ``--logger`` trackers (checked once,
    before the claim), the provenance (collected once; completed at the end), the recorder and its
    writer, SIGINT/SIGTERM, the status and the outcome, and the tables (rendered once, into
    ``table.md``: the screen prints that file)."""

    def __init__(
        self,
        config: ExperimentConfig,
        components: Components,
        status: RunStatus,
        *,
        progress: bool,
        echo: Echo | None = _stderr,
        kept: dict[str, list[dict[str, Any]]] | None = None,
        metadata: dict[str, Any] | None = None,
        trackers: dict[str, Any] | None = None,
        lock: RunLock | None = None,
    ) -> None:
        self.config = config
        self.components = components
        self.status = status
        self.out = status.path.parent
        self.progress = progress
        self.echo = echo
        #: A resumed run's rows already on disk (:func:`april_bench.results.resume.read_rows_for_resume`).
        self.kept = kept
        self.metadata = metadata
        self.trackers = trackers
        #: The provenance as written: the start's block, or a resumed run's read back.
        self.provenance: dict[str, Any] | None = None
        #: The directory's lock, held from the claim until the ``with`` block ends.
        self.lock = lock

    def __enter__(self) -> ClaimedRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lock is not None:
            self.lock.release()

    @classmethod
    def claim(
        cls,
        config: ExperimentConfig,
        components: Components | None,
        out: Path | None,
        *,
        overwrite: bool = False,
        allow_dirty: bool = False,
        progress: bool = True,
        echo: Echo | None = None,
        metadata: dict[str, Any] | None = None,
        trackers: dict[str, Any] | None = None,
        name: str | None = None,
        kind: str = "run",
        lock: bool = True,
    ) -> ClaimedRun:
        """Claim ``out`` (``None``: a fresh directory ``runs/<name>``) for a new run of ``config``,
        holding its lock until the ``with`` block on the result ends (``lock=False``: a directory inside
        one the caller holds).  The config is validated first (:func:`prepare`, unless ``components``
        are given, already validated), then the checks of the directory: a reference run's, and a
        tracker whose library is missing, are refused before the claim."""
        from april_bench.results.reference import check_reference_output
        from april_bench.results.rundir import RunLock, default_run_name, start_run_dir
        from april_bench.results.trackers import check_trackers

        components = components or prepare(config, progress=progress)  # nothing claimed for a bad config
        check_reference_output(out, allow_dirty=allow_dirty)
        check_trackers((trackers or {}).get("names", ()))
        name = name or default_run_name(config.hardware, config.algorithm, config.dataset)
        held = RunLock() if lock else None  # taken by the claim: a second process is refused
        try:
            status = start_run_dir(out, default_name=name, overwrite=overwrite, lock=held, kind=kind)
        except BaseException:
            if held is not None:
                held.release()
            raise
        return cls(
            config,
            components,
            status,
            progress=progress,
            echo=echo,
            metadata=metadata,
            trackers=trackers,
            lock=held,
        )

    @classmethod
    def reopen(
        cls, out: Path, *, progress: bool = True, echo: Echo | None = _stderr, allow_dirty: bool = False
    ) -> ClaimedRun:
        """An interrupted run directory, locked (until the ``with`` block on the result ends), checked and
        rewound to its checkpoints (``--resume``)."""
        from april_bench.config import ConfigError
        from april_bench.results.resume import RunStatus, read_rows_for_resume
        from april_bench.results.rundir import RunLock, remove_stale_scratch
        from april_bench.results.validate_files import check_resumable

        if not out.is_dir():
            raise ConfigError(f"--resume {out}: no such run directory")
        check_reference_run(out, allow_dirty=allow_dirty)
        lock = RunLock(out).acquire()
        try:
            status = RunStatus.load(out)
            if status.state == "complete":
                raise ConfigError(f"{out} is already complete; `report {out}` shows its tables")
            config = stored_config(out)
            rewound = status.rewind()  # back to each session's last checkpoint with the trainer's state
            check_resumable(out, status)
            remove_stale_scratch(out)  # a killed run's weights hand-over directory
            components = prepare(config, progress=progress)
            kept = read_rows_for_resume(out, status, config.steps)
            if echo is not None:
                echo(f"resuming {out}: {resume_line(status, config)}")
                for key, (done, keep) in rewound.items():
                    echo(
                        f"session {key} completed {done} step(s) but its trainer state was saved after "
                        f"{keep} (--checkpoint-every {config.checkpoint_every}): its last {done - keep} "
                        "step(s) run again"
                    )
            status.state, status.message = "running", ""  # the interrupt's message is history now
            status.save()
        except BaseException:
            lock.release()
            raise
        return cls(config, components, status, progress=progress, echo=echo, kept=kept, lock=lock)

    def execute(self, *, readings: bool = False) -> RunOutcome:
        """Run (or continue) the experiment into the claimed directory, streaming rows; stop cleanly on
        SIGINT/SIGTERM.  ``readings``: a completed paper row also gets its other readings
        (:func:`other_readings`)."""
        import april_bench.experiment as experiment

        self._start_provenance()
        recorder, run_writer, writer = self._open_recorder()
        received: list[str] = []
        try:
            with signals_as_interrupts(received):
                result = experiment.run_prepared(
                    self.config,
                    self.components,
                    progress=self.progress,
                    echo=self.echo,
                    recorder=recorder,
                    status=self.status,
                )
        except BaseException as exc:
            writer.close()  # the trackers (never raises)
            with contextlib.suppress(OSError):  # a full disk fails the last flush too
                run_writer.close()
            return self._stopped(exc, received)
        outcome = self._finish(result, recorder, run_writer, writer)
        if readings:  # the library and the CLI write the same directory: a paper row's other readings too
            other_readings(outcome)
        return outcome

    def _start_provenance(self) -> None:
        """``config.json``, ``config.yaml`` and the start's provenance, collected once; a resumed run's
        provenance is read back and records the resume."""
        from april_bench.config_files import write_config_file
        from april_bench.results.provenance import collect_provenance
        from april_bench.results.store import write_json_atomic
        from april_bench.results.validate_files import read_provenance, resumed_provenance

        path = self.out / "provenance.json"
        if self.kept is not None and path.exists():
            self.provenance = resumed_provenance(read_provenance(path), self.out)
            return
        components = self.components
        write_config_file(self.out / "config.yaml", self.config)  # `run --config DIR/config.yaml` repeats it
        provenance = collect_provenance(
            simulated=components.engine_spec.simulated,
            engine=components.engine_name,
            notes=components.notes,
            metadata=self.metadata,
            out=self.out,
        )
        if components.task.forced_lengths is not None:  # --length-oracle: what the lengths were drawn from
            provenance["forced_lengths"] = components.task.forced_lengths
        write_json_atomic(self.out / "config.json", self.config.to_dict())
        self.provenance = provenance
        write_json_atomic(path, provenance)

    def _open_recorder(self) -> tuple[RunRecorder, RunWriter, TrackerSet]:
        """The recorder, the run directory's row writer (the record of truth) and the trackers beside it."""
        from april_bench.results.recorder import SMALL_TABLES, RunRecorder
        from april_bench.results.store import RunWriter
        from april_bench.results.trackers import open_trackers

        run_writer = RunWriter(self.out)
        writer = open_trackers(
            **(self.trackers or {"names": ()}),
            inner=run_writer,
            out=self.out,
            config=self.config.to_dict(),
            provenance=self.provenance or {},
        )
        # a virtual-time run's requests, samples and trace rows stay on disk only (its memory does not
        # grow with its steps); a real-time run keeps them for the GPU telemetry summary, which needs
        # every table
        recorder = RunRecorder(sink=writer, keep=SMALL_TABLES if self.components.virtual_time else None)
        if self.kept:
            recorder.preload(self.kept)
            run_writer.count_existing(self.kept)
        self.status.counter = run_writer.counts  # each checkpoint records the rows it covers
        return recorder, run_writer, writer

    def _stopped(self, exc: BaseException, received: list[str]) -> RunOutcome:
        """The run raised ``exc``: interrupted (a signal, a lost engine or trainer), stopped by a failed
        write, or failed (re-raised); ``status.json`` says which."""
        from april_bench.results.validate_files import write_failed

        status, echo = self.status, self.echo
        if write_failed(exc):  # full disk, file-size limit: what was checkpointed is safe
            _stopped_by_write_error(exc, self.out, status)
        # A signal raised inside the event loop's machinery can surface as another error (for example
        # a virtual-time deadlock once the task it interrupted is gone): the run was still interrupted.
        # An engine with no replica left cannot go on, but every completed step is saved: interrupted.
        # So can a dead trainer process (TrainerLost): the checkpoints hold the trainer state.
        lost = isinstance(exc, (EngineLost, TrainerLost))
        if not isinstance(exc, KeyboardInterrupt) and not received and not lost:
            status.state, status.message = "failed", f"{type(exc).__name__}: {exc}"
            status.save()
            raise exc
        gone = TRAINER_LOST if isinstance(exc, TrainerLost) else ENGINE_LOST
        by = received[0] if received else gone if lost else "SIGINT"
        if lost and echo is not None:
            echo(f"error: {exc}")
        status.state, status.message = "interrupted", f"stopped by {by}" + (f": {exc}" if lost else "")
        status.save()
        if echo is not None:
            done = sum(status.completed.values())
            echo(
                f"interrupted: {done} step(s) are saved in {self.out}; continue with "
                f"`{_prog()} run --resume {self.out}`"
            )
        return RunOutcome(out=self.out, interrupted_by=by)

    def _finish(
        self, result: RunResult, recorder: RunRecorder, run_writer: RunWriter, writer: TrackerSet
    ) -> RunOutcome:
        """The completed run: its provenance completed, its summary and tables written, its status
        ``complete``; the trackers get the summary the run directory got."""
        from april_bench.results.provenance import completed_provenance, thread_choice
        from april_bench.results.store import write_json_atomic

        config = self.config
        provenance = completed_provenance(
            self.provenance or {},
            simulated=result.simulated,
            engine_version=result.engine_version,
            engine_dtype=result.engine_dtype,
            notes=result.notes,
            torch_threads=thread_choice(config.engine_args, config.trainer_args),
        )
        if result.placement:
            provenance["placement"] = result.placement
        try:
            write_json_atomic(self.out / "provenance.json", provenance)
            summary = recorder.summary(baseline=config.baseline, block_steps=config.block_steps)
            stored = run_writer.finish(config.to_dict(), provenance, recorder.tables, summary=summary)
            self.status.state = "complete"
            self.status.save()
        except OSError as exc:
            writer.close()
            _stopped_by_write_error(exc, self.out, self.status)
        writer.finish(summary)
        writer.close()
        return RunOutcome(out=self.out, result=result, stored=stored)


def execute_grid(
    claimed: ClaimedRun,
) -> tuple[RunOutcome, ExperimentConfig, dict[str, str]]:
    """Run a grid of arms (``ablate``, ``whatif``) into ``claimed``'s directory so that one arm the
    workload cannot fill never stops the grid.  An arm whose step cannot gather its groups
    (:class:`~april_bench.rollout.loop.RolloutStalled`) is left out with its reason: its rows and
    progress are dropped, and the run continues without it from the other sessions' checkpoints, as
    ``run --resume`` would (the sessions that completed are not run again).  Returns the outcome, the
    config that ran and ``{arm: reason}`` for the arms left out.  The baseline arm stalling (no gain is
    measured without it), or the only arm, is raised."""
    from april_bench.results.resume import read_rows_for_resume, session_key
    from april_bench.rollout.loop import RolloutStalled

    status, echo = claimed.status, claimed.echo
    left_out: dict[str, str] = {}
    while True:
        try:
            outcome = claimed.execute()
        except RolloutStalled as exc:
            config = claimed.config
            arms = [a.label for a in config.arms]
            baseline = config.baseline or ("sync" if "sync" in arms else arms[0])
            if exc.arm is None or exc.arm == baseline or len(arms) <= 1:
                raise
            left_out[exc.arm] = exc.reason
            if echo is not None:
                echo(f"arm {exc.arm} cannot run here ({exc.reason}); the other arms go on without it")
            config = claimed.config = config.replace(strategies=tuple(a for a in arms if a != exc.arm))
            claimed.components = prepare(config, progress=claimed.progress)
            for repeat in range(config.repeats):  # the stalled arm's progress and rows are dropped
                key = session_key(exc.arm, repeat)
                status.completed.pop(key, None)
                status.rows.pop(key, None)
                if key in status.finished:
                    status.finished.remove(key)
            claimed.kept = read_rows_for_resume(claimed.out, status, config.steps)
            status.state, status.message = "running", ""
            status.save()
            # written again for the arms that run (not a resumed run: one run that left an arm out)
            (claimed.out / "provenance.json").unlink(missing_ok=True)
            continue
        return outcome, claimed.config, left_out


def other_readings(outcome: RunOutcome) -> None:
    """A completed simulated paper row whose algorithm its sources leave uncertain: simulate the row's
    other readings (:mod:`april_bench.experiment.readings`), write ``readings.json`` and add their
    section to ``table.md`` (the screen prints that file); nothing for any other run.  The run's own
    rows and summary are untouched."""
    from april_bench.experiment.readings import write_readings
    from april_bench.experiment_config import load_config
    from april_bench.results.readings import render_readings
    from april_bench.results.store import write_text_atomic

    stored = outcome.stored
    if stored is None or not stored.simulated:
        return
    record = write_readings(stored.path, load_config(stored.config), stored.summary())
    if record is None:
        return
    table = stored.path / "table.md"
    write_text_atomic(table, table.read_text() + "\n" + render_readings(record) + "\n")


def _prog() -> str:
    """How the user invoked us (``april-bench`` or ``python -m april_bench``), for lines they copy."""
    from pathlib import PurePath

    return "april-bench" if PurePath(sys.argv[0]).name.startswith("april-bench") else "python -m april_bench"


def _stopped_by_write_error(exc: BaseException, out: Path, status: RunStatus) -> NoReturn:
    """A write failed (disk full, file-size limit): the run stops as interrupted, and one line (a
    ``ConfigError``) says so with the resume command."""
    from april_bench.config import ConfigError

    reason = getattr(exc, "strerror", None) or str(exc)
    status.state, status.message = "interrupted", f"a write failed: {reason}"
    with contextlib.suppress(OSError):
        status.save()
    done = sum(status.completed.values())
    raise ConfigError(
        f"writing to {out} failed ({reason}); {done} step(s) are saved: free space (or raise the file-size "
        f"limit), then continue with `{_prog()} run --resume {out}`"
    ) from None


@contextlib.contextmanager
def signals_as_interrupts(received: list[str]) -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C (a clean stop); the names of the signals received go to ``received``.
    Off the main thread (where Python cannot install handlers) signals are left as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

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
