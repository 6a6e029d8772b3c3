"""Whether a run directory's numbers may be shown: complete, conserving, no duplicated rows.

``compare``, ``report``, ``plot`` and ``paper`` refuse a run that is not (one line saying which and
why) unless ``--allow-incomplete``; then the run is still marked wherever its numbers appear.
"""

from __future__ import annotations

import json
from pathlib import Path

from april_bench.config import ConfigError
from april_bench.results.store import RunDirectory, check_run

__all__ = ["check_fit", "incomplete", "run_state"]


def run_state(path: Path) -> str | None:
    """``status.json``'s state (``None``: no status, a run written whole, e.g. ``write_run``)."""
    try:
        data = json.loads((path / "status.json").read_text())
    except (OSError, ValueError, RecursionError):
        return "damaged" if (path / "status.json").exists() else None
    state = data.get("state") if isinstance(data, dict) else None
    return state if isinstance(state, str) else "damaged"


def incomplete(run: RunDirectory) -> str | None:
    """Why the run is not complete (``interrupted after 7 of 120 steps``), or ``None``."""
    state = run_state(run.path)
    if state in (None, "complete"):
        return None
    steps = {(r.get("arm"), r.get("repeat", 0), r.get("step")) for r in run.rows("steps")}
    arms = run.config.get("strategies") or []
    total = int(run.config.get("steps") or 0) * max(len(arms), 1) * int(run.config.get("repeats") or 1)
    return f"{state} after {len(steps)} of {total} steps" if total else str(state)


def check_fit(run: RunDirectory, *, allow_incomplete: bool, doing: str) -> list[str]:
    """Refuse (``ConfigError``) a run that is incomplete, does not conserve tokens or holds duplicated
    rows, unless ``allow_incomplete``; then return notes saying what is wrong with it."""
    notes = []
    why = incomplete(run)
    if why is not None:
        notes.append(f"the run is {why}: its numbers cover part of it")
    notes += check_run(run)
    if notes and not allow_incomplete:
        raise ConfigError(
            f"{run.path}: {'; '.join(notes)}; refusing to {doing} (pass --allow-incomplete to {doing} "
            "anyway, marked)"
        )
    return notes
