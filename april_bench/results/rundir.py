"""Where a run is written: unique default names, refusing to mix runs, checked before the first step."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError
from april_bench.results.lock import LOCK_NAME, RunLock

if TYPE_CHECKING:
    from april_bench.results.resume import RunStatus

__all__ = [
    "SCRATCH_PREFIX",
    "claim_run_dir",
    "default_run_name",
    "remove_stale_scratch",
    "scratch_root",
    "start_run_dir",
]

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
) -> Path:
    """Create (and so claim) the run directory before anything runs.

    The default name gets a ``-2``, ``-3`` ... suffix when taken: ``mkdir`` is atomic, so runs started
    together never share a directory.  An explicit ``out`` must not be a file, and must be empty
    unless ``overwrite`` (its old rows are then removed).  The directory must be writable.  With
    ``lock``, the directory's lock is taken *before* it is checked for files, so two runs started at
    once with one ``--out`` cannot both find it empty: the second is refused (the caller holds the
    lock for the whole run).
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
            _check_writable(path)
            return path
        raise ConfigError(f"{root} holds 10,000 runs named {default_name}*; pass --out")
    out = Path(os.path.expanduser(out))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out} cannot be created ({exc.strerror}); choose another --out") from None
    if lock is not None:
        lock.acquire(out)
    if any(child.name != LOCK_NAME for child in out.iterdir()):
        if not overwrite:
            raise ConfigError(
                f"--out {out} already holds files (a run?); pass --resume {out} to continue it, "
                "--overwrite to replace it, or another --out"
            )
        _clear_run(out)
    _check_writable(out)
    return out


def _check_writable(path: Path) -> None:
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-check-")  # unique: runs may probe at once
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"run directory {path} is not writable ({exc.strerror}); choose another --out"
        ) from None


def _clear_run(path: Path) -> None:
    """Remove what a run writes (row files, JSON, tables); anything else in the directory is kept."""
    for child in path.iterdir():
        if child.is_file() and (child.suffix in (".jsonl", ".json", ".md", ".gz", ".png", ".csv", ".tex")):
            child.unlink()
    remove_stale_scratch(path)
    state = path / "state"  # the old run's checkpoints: a new run must never resume from them
    if state.is_dir():
        for child in state.iterdir():
            if child.is_file() and child.name.endswith((".json", ".trainer.pt")):
                child.unlink()


def scratch_root(status: Any) -> Path | None:
    """Where a session's scratch directory goes: ``<run>/state/`` for a run with a directory (a kill
    leaves it where the next ``--resume`` or ``--overwrite`` removes it), else the system's temp."""
    if status is None:
        return None
    root = Path(status.path).parent / "state"
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
) -> RunStatus:
    """Claim the run directory (:func:`claim_run_dir`, taking ``lock``) and write its ``status.json``: the
    run's status, whose ``path.parent`` is the directory."""
    from april_bench.results.resume import RunStatus

    claimed = claim_run_dir(out, default_name=default_name, root=root, overwrite=overwrite, lock=lock)
    status = RunStatus(path=claimed / "status.json")
    status.save()
    return status
