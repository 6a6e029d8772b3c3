"""Which rows a session's checkpoint covers, and where the checkpoint lives: shared by the writer that
counts rows (:mod:`april_bench.results.store`), the resume that checks them
(:mod:`april_bench.results.resume`) and the file checks (:mod:`april_bench.results.validate_files`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["STATES", "covered", "row_key", "session_key", "state_path"]

#: The states ``status.json`` may hold.
STATES = ("running", "interrupted", "failed", "complete")


def session_key(arm: str, repeat: int) -> str:
    return f"{arm}#{repeat}"


def state_path(run_dir: Path, arm: str, repeat: int, completed: int) -> Path:
    """The checkpoint of a session after ``completed`` steps.  One file per step count: the status
    names the count, so an interrupt between writing a checkpoint and recording it in the status
    resumes from the previous checkpoint, never from one the rows on disk do not match."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", arm).strip("_") or "arm"
    return run_dir / "state" / f"{slug}-r{repeat}-s{completed}.json"


def covered(table: str, step: int, end_of_run: bool, done: int) -> bool:
    """Whether a row of an unfinished session (at ``step``) is covered by its checkpoint after ``done``
    steps.  The evaluation after step k-1 is part of checkpoint k; end-of-run rows belong to the
    session's end, never to a checkpoint."""
    if table == "evals":
        return step <= done
    return step < done and not (table == "samples" and end_of_run)


def row_key(row: Mapping[str, Any]) -> tuple[str, int, bool]:
    """``(session_key, step, end_of_run)`` of a row: what decides whether a checkpoint covers it."""
    return (
        session_key(row.get("arm", ""), row.get("repeat", 0)),
        row.get("step", 0),
        row.get("reason") == "end_of_run",
    )
