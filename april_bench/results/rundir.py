"""Where a run is written: unique default names, refusing to mix runs, checked before the first step.

One process per run directory (:class:`RunLock`): an exclusive ``flock`` on ``<run>/.lock`` held for
the whole run.

``run`` and ``run --resume`` take the lock before they look at or write anything in the directory, and
keep it until they exit.  A second process that finds it taken stops with one line naming the holder's
pid.  The kernel drops a ``flock`` when its holder dies (SIGKILL, a power cut reboots anyway), so a lock
left by a killed run never blocks the next ``--resume``: there is no stale lock to clean up.

The lock file's content (the holder's pid) is informational only; the lock is the ``flock`` itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError
from april_bench.fsio import (
    MANIFEST_NAME,
    RUN_SUBDIRS,
    RunLayout,
    check_writable,
    record,
    remove_written,
    scan_written,
    start_manifest,
)

if TYPE_CHECKING:
    from april_bench.results.resume import RunStatus

__all__ = [
    "LOCK_NAME",
    "SCRATCH_PREFIX",
    "RunLock",
    "claim_run_dir",
    "clear_run_dir",
    "default_run_name",
    "remove_stale_scratch",
    "scratch_root",
    "start_run_dir",
]

#: The lock file inside a run directory (a dot file: readers never see it as a run file; kept by
#: ``--overwrite``).
LOCK_NAME = ".lock"


class RunLock:
    """An exclusive, non-blocking lock on a run directory; a context manager, or ``acquire``/``release``."""

    def __init__(self, run_dir: Path | None = None) -> None:
        self.path = Path(run_dir or ".") / LOCK_NAME
        self._fd: int | None = None
        self._created = False

    def acquire(self, run_dir: Path | None = None) -> RunLock:
        """Take the lock (of ``run_dir``, else the directory given at construction), or raise
        ``ConfigError`` naming the process that holds it."""
        if run_dir is not None:
            self.path = Path(run_dir) / LOCK_NAME
        try:
            fd, created = _open_lock_file(self.path)
        except OSError as exc:
            raise ConfigError(
                f"cannot lock run directory {self.path.parent} ({exc.strerror}); choose another --out"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(
                    f"cannot lock run directory {self.path.parent} ({exc.strerror}); choose another --out"
                ) from None
            holder = _holder(self.path)
            raise ConfigError(
                f"{self.path.parent} is in use by {holder}: wait for it to end (or stop it), "
                "or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd, self._created = fd, created
        return self

    def abandon(self) -> None:
        """Release the lock, removing the lock file if this lock created it: a directory the run was
        refused (it holds a user's files) is left exactly as it was found."""
        if self._fd is not None and self._created:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _open_lock_file(path: Path) -> tuple[int, bool]:
    """The lock file, opened never through a link (a ``.lock`` that is a symbolic link is refused, not
    followed: its target is never truncated); whether this call created it."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666), True
    except FileExistsError:
        pass
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "the lock file is not a regular file", str(path))
    return fd, False


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"another april-bench process (pid {pid})" if pid.isdigit() else "another april-bench process"


#: A session's scratch directory (weights handed to an engine in another process).
SCRATCH_PREFIX = "april-bench-weights-"


def default_run_name(hardware: str, algorithm: str, dataset: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{hardware}-{algorithm}-{dataset}"


def claim_run_dir(
    out: Path | None,
    *,
    default_name: str,
    root: Path = Path("runs"),
    overwrite: bool = False,
    lock: RunLock | None = None,
    kind: str = "run",
) -> Path:
    """Create (and so claim) the run directory before anything runs, and start its manifest
    (:mod:`april_bench.fsio`): the record of every file the ``kind`` command writes there.

    The default name gets a ``-2``, ``-3`` ... suffix when taken: ``mkdir`` is atomic, so runs started
    together never share a directory.  An explicit ``out`` must not be a file, and must be empty
    unless ``overwrite``: then it must hold a run april-bench wrote, whose files are removed
    (:func:`clear_run_dir`; a file the run did not write is refused, nothing removed).  The directory
    must be writable.  With ``lock``, the directory's lock is taken *before* it is checked for files, so
    two runs started at once with one ``--out`` cannot both find it empty: the second is refused (the
    caller holds the lock for the whole run).
    """
    if out is None:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create {root}/ in {Path.cwd()} for the run directory ({exc.strerror}); "
                "pass --out DIR (a writable directory)"
            ) from None
        for n in range(1, 10_000):
            path = root / (default_name if n == 1 else f"{default_name}-{n}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                raise ConfigError(
                    f"cannot create the run directory {path} ({exc.strerror}); pass --out DIR "
                    "(a writable directory)"
                ) from None
            if lock is not None:
                lock.acquire(path)
            check_writable(path)
            start_manifest(path, kind)
            return path
        raise ConfigError(f"{root} holds 10,000 runs named {default_name}*; pass --out")
    out = Path(os.path.expanduser(out))
    try:
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out} is a file, not a directory; choose another --out")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out} cannot be created ({exc.strerror}); choose another --out") from None
    with _locked_for_claim(out, lock):
        _clear_for_claim(out, overwrite)
    check_writable(out)
    start_manifest(out, kind)
    return out


@contextlib.contextmanager
def _locked_for_claim(out: Path, lock: RunLock | None) -> Iterator[None]:
    """``lock`` taken on ``out`` (``None``: the caller holds it) while the claim checks the directory; a
    refused directory (a ``ConfigError``) is left as it was found: the lock is abandoned, no lock file
    added."""
    if lock is not None:
        lock.acquire(out)
    try:
        yield
    except ConfigError:
        if lock is not None:
            lock.abandon()
        raise


def _clear_for_claim(out: Path, overwrite: bool) -> None:
    """``out`` as the claim finds it, in one scan: empty (nothing to do), refused (it holds files and no
    ``--overwrite``, or a file april-bench did not write), or the old run's files removed."""
    if not _holds_files(out):
        return
    flag = "--overwrite" if overwrite else f"--out {out}"
    try:
        written = scan_written(out, _layout())
    except OSError as exc:
        raise ConfigError(
            f"{flag}: cannot read {exc.filename} ({exc.strerror}); choose another --out"
        ) from None
    if written.foreign is not None and overwrite:
        raise ConfigError(
            f"--overwrite: {out / written.foreign} was not written by april-bench, so {out} is not replaced; "
            "move that file out of the directory, or choose another --out"
        )
    if written.foreign is not None:
        raise ConfigError(
            f"--out {out} holds {written.foreign}, which april-bench did not write; choose another --out "
            "(a new or empty directory)"
        )
    if not overwrite:
        raise ConfigError(
            f"--out {out} already holds files of a run; pass --resume {out} to continue it, "
            "--overwrite to replace it, or another --out"
        )
    try:
        remove_written(written)
    except OSError as exc:
        raise ConfigError(
            f"--overwrite: cannot remove {exc.filename} ({exc.strerror}); remove the old run yourself, or "
            "choose another --out"
        ) from None


def _holds_files(path: Path) -> bool:
    try:
        return any(name not in (LOCK_NAME, MANIFEST_NAME) for name in os.listdir(path))
    except OSError as exc:
        raise ConfigError(f"--out {path} cannot be read ({exc.strerror}); choose another --out") from None


# ---------------------------------------------------------------- what --overwrite may remove

#: The files a run directory made before manifests existed may hold (committed reference runs,
#: ``results/runs/*``, ``results/gates/*``, ...): a directory without a manifest is recognised as a
#: run by its status or provenance (:func:`_layout`), and only these names are removed.
_KNOWN_FILES = frozenset(
    {
        "config.json",
        "config.yaml",
        "provenance.json",
        "status.json",
        "summary.json",
        "result.json",
        "table.md",
        "trace.jsonl",
        "trace.jsonl.gz",
        "mlflow.db",
        "ablation.json",
        "ablation.md",
        "ablation.png",
        "ablation.pdf",
        "simcheck.json",
        "simcheck.md",
        "prediction.json",
        "cost_curve.json",
        "whatif.json",
        "whatif.md",
        "whatif.png",
    }
)
#: Subdirectories whose whole tree the run's libraries write (tracker logs, figures).
_TREES = ("tensorboard", "wandb", "figures")
#: A file that identifies a directory made before manifests: (name, key its JSON object holds).
_SIGNATURES = (
    ("status.json", "state"),
    ("provenance.json", "result_kind"),
    ("ablation.json", "result_kind"),
    ("simcheck.json", "result_kind"),
    ("whatif.json", "result_kind"),
)


def _layout() -> RunLayout:
    """A run directory's layout for the manifest-aware scan (:func:`april_bench.fsio.scan_written`): its
    lock, scratch directories and library trees, and how a run made before manifests is recognised (its
    status holds a run state, or a result file its kind) with the names it may hold."""
    from april_bench.results.coverage import STATES
    from april_bench.results.records import TABLES

    tables = {f"{t}.jsonl" for t in TABLES} | {f"{t}.jsonl.gz" for t in TABLES}
    return RunLayout(
        lock_name=LOCK_NAME,
        scratch_prefix=SCRATCH_PREFIX,
        trees=_TREES,
        legacy_signatures=tuple(
            (name, key, STATES if name == "status.json" else None) for name, key in _SIGNATURES
        ),
        legacy_names=_KNOWN_FILES | tables | set(RUN_SUBDIRS),
    )


def clear_run_dir(path: Path) -> None:
    """Remove every file april-bench wrote into the run directory ``path`` (its lock and manifest stay
    for the new run).  What the run wrote: the names its manifest lists, or, for a run directory made
    before manifests, the names a run writes (:data:`_KNOWN_FILES`).  Nested run directories (an
    ablation's modes, simcheck's ``measured/``) are checked the same way and removed.  Anything else
    (a file the run did not write, a directory that holds no run) is refused with one line naming the
    first such file, before anything is removed."""
    _clear_for_claim(path, overwrite=True)


def scratch_root(status: Any) -> Path | None:
    """Where a session's scratch directory goes: ``<run>/state/`` for a run with a directory (a kill
    leaves it where the next ``--resume`` or ``--overwrite`` removes it), else the system's temp."""
    if status is None:
        return None
    root = Path(status.path).parent / "state"
    record(root)
    root.mkdir(parents=True, exist_ok=True)
    return root


def remove_stale_scratch(run_dir: Path) -> None:
    """Scratch directories a killed run left (the caller holds the run's lock: none is in use)."""
    state = run_dir / "state"
    if state.is_dir():
        for child in state.glob(f"{SCRATCH_PREFIX}*"):
            shutil.rmtree(child, ignore_errors=True)


def start_run_dir(
    out: Path | None,
    *,
    default_name: str,
    root: Path = Path("runs"),
    overwrite: bool = False,
    lock: RunLock | None = None,
    kind: str = "run",
) -> RunStatus:
    """Claim the run directory (:func:`claim_run_dir`, taking ``lock``) and write its ``status.json``: the
    run's status, whose ``path.parent`` is the directory."""
    from april_bench.results.resume import RunStatus

    claimed = claim_run_dir(
        out, default_name=default_name, root=root, overwrite=overwrite, lock=lock, kind=kind
    )
    status = RunStatus(path=claimed / "status.json")
    status.save()
    return status
