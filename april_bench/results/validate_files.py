"""Reading the files a run directory holds, checked: a damaged file is one ``ConfigError`` line naming
the file, what is wrong and the fix, never a traceback from deep inside a resume.

``status.json``, the per-session checkpoints under ``state/``, ``provenance.json`` and the trainer's
state file (``*.trainer.pt``) are read here.  Row files are read by :mod:`april_bench.results.store`
(reports) and :mod:`april_bench.results.resume` (resumes), with the same rule.
"""

from __future__ import annotations

import errno
import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError

__all__ = [
    "check_resumable",
    "load_trainer_state",
    "read_checkpoint",
    "read_json_object",
    "read_provenance",
    "read_status",
    "resumed_provenance",
    "save_trainer_state",
    "trainer_file",
    "write_failed",
]

#: What a damaged file of an interrupted run leaves the user to do.
RESTART = "start the run again with --overwrite (or restore the file from a copy)"


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """``path`` as a JSON object; missing, unreadable, not UTF-8, not JSON or not an object: one line."""
    from april_bench.bounded import MAX_LINE_BYTES, read_bytes

    try:
        text = read_bytes(path, 4 * MAX_LINE_BYTES, what).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: the {what} is missing; {RESTART}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: the {what} cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the {what} is not UTF-8 (byte {exc.start}); {RESTART}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}, line {exc.lineno}: the {what} is not valid JSON ({exc.msg}: truncated or damaged); "
            f"{RESTART}"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path}: the {what} is nested too deeply (damaged); {RESTART}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the {what} must be a JSON object, got {type(data).__name__}; {RESTART}")
    return data


def _field(path: Path, data: dict[str, Any], name: str, check: Callable[[Any], bool], want: str) -> Any:
    if name not in data:
        raise ConfigError(f"{path}: field {name!r} is missing (the file is damaged); {RESTART}")
    value = data[name]
    if not check(value):
        raise ConfigError(f"{path}: field {name!r} must be {want}, got {value!r:.60}; {RESTART}")
    return value


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def read_status(path: Path) -> dict[str, Any]:
    """``status.json``: ``state``, ``completed``, ``finished``, ``message`` and ``rows``, type-checked."""
    from april_bench.results.coverage import STATES

    if not path.exists():
        raise ConfigError(f"{path.parent} has no status.json: it is not a run april-bench can resume")
    data = read_json_object(path, "run status")
    state = _field(path, data, "state", lambda v: v in STATES, f"one of {', '.join(STATES)}")
    completed = _field(
        path,
        data,
        "completed",
        lambda v: isinstance(v, dict) and all(isinstance(k, str) and _count(n) for k, n in v.items()),
        "an object of session -> steps completed (whole numbers >= 0)",
    )
    finished = data.get("finished", [])
    if not (isinstance(finished, list) and all(isinstance(k, str) for k in finished)):
        raise ConfigError(f"{path}: field 'finished' must be a list of session names; {RESTART}")
    message = data.get("message", "")
    if not isinstance(message, str):
        raise ConfigError(f"{path}: field 'message' must be a string; {RESTART}")
    rows = data.get("rows", {})  # absent in runs written before row counts were kept
    valid_rows = isinstance(rows, dict) and all(
        isinstance(k, str)
        and isinstance(v, dict)
        and all(isinstance(t, str) and _count(n) for t, n in v.items())
        for k, v in rows.items()
    )
    if not valid_rows:
        raise ConfigError(f"{path}: field 'rows' must map sessions to row counts per table; {RESTART}")
    full = data.get("full")  # absent in runs written before --checkpoint-every: every checkpoint was full
    valid_full = full is None or (
        isinstance(full, dict)
        and all(
            isinstance(k, str)
            and isinstance(v, dict)
            and _count(v.get("steps"))
            and isinstance(v.get("rows", {}), dict)
            and all(isinstance(t, str) and _count(n) for t, n in v.get("rows", {}).items())
            for k, v in full.items()
        )
    )
    if not valid_full:
        raise ConfigError(
            f"{path}: field 'full' must map sessions to their last full checkpoint "
            f'({{"steps": N, "rows": {{...}}}}); {RESTART}'
        )
    return {
        "state": state,
        "completed": dict(completed),
        "finished": list(finished),
        "message": message,
        "rows": {k: dict(v) for k, v in rows.items()},
        "full": None
        if full is None
        else {k: {"steps": v["steps"], "rows": dict(v.get("rows", {}))} for k, v in full.items()},
    }


def read_checkpoint(path: Path, session: str, completed: int) -> dict[str, Any]:
    """A session's checkpoint after ``completed`` steps, with the fields a resume uses type-checked."""
    data = read_json_object(path, f"checkpoint of session {session}")
    _field(path, data, "completed_steps", lambda v: v == completed, f"{completed} (what status.json says)")
    for name in ("clock_now", "session_elapsed", "run_elapsed"):
        _field(path, data, name, _number, "a number of seconds")
    _field(path, data, "rollout", lambda v: isinstance(v, dict), "an object (the rollout loop's state)")
    _field(path, data, "strategy", lambda v: isinstance(v, dict), "an object (the strategy's state)")
    _field(path, data, "engine", lambda v: v is None or isinstance(v, dict), "an object or null")
    _field(path, data, "trainer_file", lambda v: v is None or isinstance(v, str), "a file name or null")
    return data


def trainer_file(run_dir: Path, stored: str) -> Path:
    """The trainer state file a checkpoint names, inside ``run_dir``.  New checkpoints store it relative
    to the run directory; older ones stored a path relative to the working directory of the run, which
    is resolved by its name under ``state/`` so a moved or copied run directory resumes from its own
    trainer state, never the original's."""
    path = Path(stored)
    if path.is_absolute() or not (run_dir / path).exists():
        return run_dir / "state" / path.name
    return run_dir / path


def load_trainer_state(path: Path, load: Callable[[str], None]) -> None:
    """Call a trainer's ``load_state(path)``; a missing, truncated or refused file is one line."""
    if not path.exists():
        raise ConfigError(f"{path}: the trainer state of this checkpoint is missing; {RESTART}")
    try:
        load(str(path))
    except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) refusing an object
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{path}: the trainer state holds objects a safe load refuses ({first:.120}); it was not "
            f"written by april-bench: {RESTART}"
        ) from None
    except (EOFError, zipfile.BadZipFile, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"{path}: the trainer state is damaged or truncated ({type(exc).__name__}: {str(exc)[:100]}); "
            f"{RESTART}"
        ) from None


def read_provenance(path: Path) -> dict[str, Any]:
    """A run's ``provenance.json``, checked for the fields a resume extends."""
    data = read_json_object(path, "provenance")
    _field(path, data, "result_kind", lambda v: v in ("simulated", "measured"), "simulated or measured")
    _field(path, data, "machine", lambda v: isinstance(v, dict), "an object")
    resumed = data.get("resumed", [])
    if not isinstance(resumed, list):
        raise ConfigError(f"{path}: field 'resumed' must be a list; {RESTART}")
    return data


def save_trainer_state(trainer: Any, path: Path) -> None:
    """A trainer's ``save_state(path)``; a write that fails (full disk, file-size limit) is an
    ``OSError`` whatever the trainer raised (``torch.save`` raises ``RuntimeError``), so the run stops
    as interrupted with its resume line."""
    try:
        trainer.save_state(str(path))
    except RuntimeError as exc:
        if "writ" in str(exc).lower():  # "PytorchStreamWriter failed writing file ...", "file write failed"
            raise OSError(errno.EIO, f"writing {path} failed ({str(exc)[:120]})") from None
        raise


#: Errors of a write that failed for want of room (or a dying disk), not of a wrong path.
WRITE_ERRNOS = frozenset({errno.EFBIG, errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


def write_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from or during) is a failed write: a full disk, a
    file-size limit (``ulimit -f``), a quota, an I/O error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in WRITE_ERRNOS:
            return True
        current = current.__cause__ or current.__context__
    return False


def check_resumable(run_dir: Path, status: Any) -> None:
    """Every checkpoint ``status.json`` names, and the trainer state files they name, are readable:
    found before anything starts, so a damaged file never leaves the status ``running``."""
    from april_bench.results.coverage import state_path

    if (run_dir / "provenance.json").exists():
        read_provenance(run_dir / "provenance.json")
    for key, completed in sorted(status.completed.items()):
        if completed == 0:
            continue
        arm, _, repeat = key.rpartition("#")
        if not arm or not repeat.isdigit():
            raise ConfigError(f"{status.path}: {key!r} is not a session name (arm#repeat); {RESTART}")
        saved = read_checkpoint(state_path(run_dir, arm, int(repeat), completed), key, completed)
        if saved["trainer_file"] is not None:
            stored = trainer_file(run_dir, saved["trainer_file"])
            if not stored.is_file():
                raise ConfigError(f"{stored}: the trainer state of session {key} is missing; {RESTART}")


def resumed_provenance(provenance: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The provenance of a run being resumed: each resume adds when and from which code it ran; a
    resume from uncommitted code marks the whole run dirty."""
    import datetime as dt

    from april_bench.results import provenance as prov

    git = prov.git_info(exclude=run_dir)
    provenance.setdefault("resumed", []).append(
        {"utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "git": git}
    )
    first = provenance.get("git")
    if isinstance(first, dict) and git.get("dirty"):
        first["dirty"] = True  # part of the run came from uncommitted code
    return provenance
