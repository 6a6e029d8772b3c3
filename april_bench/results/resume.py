"""What an interrupted run leaves behind, and how ``--resume`` continues it.

A run directory holds ``status.json`` (``running``, ``interrupted``, ``failed``
or ``complete``, and for every arm session the steps it completed) and, under
``state/``, one checkpoint per session written after every completed step: the
rollout loop's carry-over buffer (every partial token with its policy version),
the prompt stream's position, the strategy's and the engine's state, the arm
clock, and the trainer's state file.  Rows are streamed as they are recorded,
so an interrupted step leaves rows behind; :func:`rows_to_keep` drops them and
the resumed session records that step again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.results.records import TABLES
from april_bench.results.store import write_json_atomic

__all__ = ["RunStatus", "read_rows_for_resume", "rows_to_keep", "session_key", "state_path"]


def session_key(arm: str, repeat: int) -> str:
    return f"{arm}#{repeat}"


def state_path(run_dir: Path, arm: str, repeat: int, completed: int) -> Path:
    """The checkpoint of a session after ``completed`` steps.  One file per step count: the status
    names the count, so an interrupt between writing a checkpoint and recording it in the status
    resumes from the previous checkpoint, never from one the rows on disk do not match."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", arm).strip("_") or "arm"
    return run_dir / "state" / f"{slug}-r{repeat}-s{completed}.json"


@dataclass(slots=True)
class RunStatus:
    """``status.json``: the run's state and each session's progress, rewritten atomically."""

    path: Path
    state: str = "running"
    #: ``session_key(arm, repeat)`` -> steps completed (the checkpoint's step count).
    completed: dict[str, int] = field(default_factory=dict)
    #: Sessions whose end-of-run rows (buffered leftovers) are written.
    finished: list[str] = field(default_factory=list)
    message: str = ""

    @classmethod
    def load(cls, run_dir: Path) -> RunStatus:
        path = run_dir / "status.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"{run_dir} has no status.json: it is not a run april-bench can resume"
            ) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path} is damaged ({exc.msg} at line {exc.lineno}); the run cannot resume"
            ) from None
        return cls(
            path=path,
            state=data.get("state", "running"),
            completed=dict(data.get("completed", {})),
            finished=list(data.get("finished", [])),
            message=data.get("message", ""),
        )

    def save(self) -> None:
        write_json_atomic(
            self.path,
            {
                "state": self.state,
                "completed": self.completed,
                "finished": self.finished,
                "message": self.message,
            },
        )

    def step_done(self, arm: str, repeat: int, steps: int) -> None:
        self.completed[session_key(arm, repeat)] = steps
        self.save()

    def session_finished(self, arm: str, repeat: int) -> None:
        key = session_key(arm, repeat)
        if key not in self.finished:
            self.finished.append(key)
        self.save()


def rows_to_keep(table: str, row: Mapping[str, Any], status: RunStatus, total_steps: int) -> bool:
    """Whether a streamed row belongs to the part of the run its checkpoints cover."""
    key = session_key(row.get("arm", ""), row.get("repeat", 0))
    if key in status.finished:
        return True
    done = status.completed.get(key, 0)
    step = row.get("step", 0)
    if table == "evals":
        return step <= done  # the evaluation after step k-1 is part of checkpoint k
    return step < done and not (table == "samples" and row.get("reason") == "end_of_run")


def read_rows_for_resume(
    run_dir: Path, status: RunStatus, total_steps: int
) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows that the checkpoints cover, with the row files rewritten to hold just those
    (a torn last line from an interrupted write is dropped)."""
    kept: dict[str, list[dict[str, Any]]] = {}
    for table in TABLES:
        path = run_dir / f"{table}.jsonl"
        rows = list(_read_tolerant(path)) if path.exists() else []
        kept[table] = [r for r in rows if rows_to_keep(table, r, status, total_steps)]
        _rewrite(path, kept[table])
    return kept


def _read_tolerant(path: Path) -> Iterable[dict[str, Any]]:
    lines = path.read_text().split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the last line, cut by the interruption: drop it
                return
            raise ConfigError(
                f"{path}, line {number}: not a JSON row; the run directory is damaged"
            ) from None


def _rewrite(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")))
            f.write("\n")
    tmp.replace(path)
