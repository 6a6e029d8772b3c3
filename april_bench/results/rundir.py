"""Where a run is written: unique default names, refusing to mix runs, checked before the first step."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from april_bench.config import ConfigError

if TYPE_CHECKING:
    from april_bench.results.resume import RunStatus

__all__ = ["claim_run_dir", "default_run_name", "start_run_dir"]


def default_run_name(hardware: str, algorithm: str, dataset: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{hardware}-{algorithm}-{dataset}"


def claim_run_dir(
    out: Path | None, *, default_name: str, root: Path = Path("runs"), overwrite: bool = False
) -> Path:
    """Create (and so claim) the run directory before anything runs.

    The default name gets a ``-2``, ``-3`` ... suffix when taken: ``mkdir`` is atomic, so runs started
    together never share a directory.  An explicit ``out`` must not be a file, and must be empty
    unless ``overwrite`` (its old rows are then removed).  The directory must be writable.
    """
    if out is None:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1, 10_000):
            path = root / (default_name if n == 1 else f"{default_name}-{n}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            _check_writable(path)
            return path
        raise ConfigError(f"{root} holds 10,000 runs named {default_name}*; pass --out")
    out = Path(os.path.expanduser(out))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(
                f"--out {out} already holds files (a run?); pass --resume {out} to continue it, "
                "--overwrite to replace it, or another --out"
            )
        _clear_run(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out} cannot be created ({exc.strerror}); choose another --out") from None
    _check_writable(out)
    return out


def _check_writable(path: Path) -> None:
    probe = path / ".write-check"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"run directory {path} is not writable ({exc.strerror}); choose another --out"
        ) from None


def _clear_run(path: Path) -> None:
    """Remove what a run writes (row files, JSON, tables); anything else in the directory is kept."""
    for child in path.iterdir():
        if child.is_file() and (child.suffix in (".jsonl", ".json", ".md", ".gz", ".png", ".csv", ".tex")):
            child.unlink()


def start_run_dir(
    out: Path | None, *, default_name: str, root: Path = Path("runs"), overwrite: bool = False
) -> RunStatus:
    """Claim the run directory (:func:`claim_run_dir`) and write its ``status.json``: the run's status,
    whose ``path.parent`` is the directory."""
    from april_bench.results.resume import RunStatus

    status = RunStatus(
        path=claim_run_dir(out, default_name=default_name, root=root, overwrite=overwrite) / "status.json"
    )
    status.save()
    return status
