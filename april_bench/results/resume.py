"""What an interrupted run leaves behind, and how ``--resume`` continues it.

A run directory holds ``status.json`` (``running``, ``interrupted``, ``failed``
or ``complete``, and for every arm session the steps it completed) and, under
``state/``, one checkpoint per session written after every completed step: the
rollout loop's carry-over buffer (every partial token with its policy version),
the prompt stream's position, the strategy's and the engine's state and the arm
clock.  The trainer's state (weights and optimizer moments: gigabytes on a GPU)
is written with it only every ``--checkpoint-every`` steps and when the run is
interrupted; ``full`` in the status names each session's last checkpoint that
holds it, and ``--resume`` continues from that one (:meth:`RunStatus.rewind`),
running the steps after it again.  Rows are streamed as they are recorded,
so an interrupted step leaves rows behind; :func:`rows_to_keep` drops them and
the resumed session records that step again.

Durability: the row files are flushed *and fsynced* before the status that
counts them is written (atomically: a unique temporary file, fsync, rename,
directory fsync), and the status records how many rows of every table each
session's checkpoint covers (``rows``).  ``--resume`` counts the rows again and
refuses, naming the file, when fewer are left (a torn or lost line) instead of
finishing with rows missing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.results.coverage import covered, row_key, session_key, state_path
from april_bench.results.records import TABLES
from april_bench.results.store import write_json_atomic

__all__ = [
    "RowCounts",
    "RunStatus",
    "covered",
    "read_rows_for_resume",
    "rows_to_keep",
    "session_key",
    "state_path",
]

#: ``(session_key, done)`` -> rows per table that the session's first ``done`` steps cover
#: (``done=None``: the finished session's every row).  The run's :class:`RunWriter` answers it.
RowCounts = Callable[[str, "int | None"], dict[str, int]]


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
    #: ``session_key`` -> table -> rows on disk that the session's checkpoint covers (fsynced).
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    #: ``session_key`` -> ``{"steps": k, "rows": {table: n}}``: the session's last *full* checkpoint (the
    #: trainer's state included), where ``--resume`` continues from, and the rows it covers.  ``None``:
    #: a status written before the checkpoint policy, where every checkpoint was full.
    full: dict[str, dict[str, Any]] | None = field(default_factory=dict)
    #: Counts a session's rows when it checkpoints (the run's writer); ``None``: no counts kept.
    counter: RowCounts | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, run_dir: Path) -> RunStatus:
        from april_bench.results.validate_files import read_status

        path = run_dir / "status.json"
        data = read_status(path)
        return cls(
            path=path,
            state=data["state"],
            completed=data["completed"],
            finished=data["finished"],
            message=data["message"],
            rows=data["rows"],
            full=data["full"],
        )

    def save(self) -> None:
        data: dict[str, Any] = {
            "state": self.state,
            "completed": self.completed,
            "finished": self.finished,
            "message": self.message,
            "rows": self.rows,
        }
        if self.full is not None:
            data["full"] = self.full
        write_json_atomic(self.path, data)

    def step_done(self, arm: str, repeat: int, steps: int, *, full: bool = True) -> None:
        """Record the session's checkpoint after ``steps`` steps; ``full``: it holds the trainer's state
        (or the trainer has none), so a resume can continue from it."""
        key = session_key(arm, repeat)
        self.completed[key] = steps
        if self.counter is not None:
            self.rows[key] = self.counter(key, steps)
        if full:
            self.full = {} if self.full is None else self.full
            self.full[key] = {"steps": steps, "rows": dict(self.rows.get(key, {}))}
        self.save()

    def full_steps(self, key: str) -> int:
        """The steps the session's last full checkpoint covers (a legacy status: every checkpoint)."""
        if self.full is None:
            return self.completed.get(key, 0)
        return int(self.full.get(key, {}).get("steps", 0))

    def rewind(self) -> dict[str, tuple[int, int]]:
        """Move every unfinished session back to its last full checkpoint, whose trainer state a resume
        loads: the steps after it run again, their rows are dropped (:func:`read_rows_for_resume`).
        Returns ``session_key -> (steps completed, steps kept)`` of the sessions moved back."""
        moved: dict[str, tuple[int, int]] = {}
        for key, done in sorted(self.completed.items()):
            keep = self.full_steps(key)
            if key in self.finished or keep >= done:
                continue
            moved[key] = (done, keep)
            if keep:
                assert self.full is not None
                self.completed[key] = keep
                self.rows[key] = dict(self.full[key].get("rows", {}))
            else:
                del self.completed[key]
                self.rows.pop(key, None)
        return moved

    def session_finished(self, arm: str, repeat: int) -> None:
        key = session_key(arm, repeat)
        if key not in self.finished:
            self.finished.append(key)
        if self.counter is not None:
            self.rows[key] = self.counter(key, None)
        self.save()


def rows_to_keep(table: str, row: Mapping[str, Any], status: RunStatus, total_steps: int) -> bool:
    """Whether a streamed row belongs to the part of the run its checkpoints cover."""
    key, step, end_of_run = row_key(row)
    if key in status.finished:
        return True
    return covered(table, step, end_of_run, status.completed.get(key, 0))


def read_rows_for_resume(
    run_dir: Path, status: RunStatus, total_steps: int
) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows that the checkpoints cover, with the row files rewritten to hold just those
    (a torn last line from an interrupted write is dropped).

    Refuses (``ConfigError``, before any file is rewritten) when a table holds fewer rows of a session
    than its checkpoint counted: resuming would finish the run with those rows missing."""
    kept: dict[str, list[dict[str, Any]]] = {}
    for table in TABLES:
        path = run_dir / f"{table}.jsonl"
        rows = list(_read_tolerant(path)) if path.exists() else []
        kept[table] = [r for r in rows if rows_to_keep(table, r, status, total_steps)]
        _check_counts(path, table, kept[table], status)
    for table in TABLES:
        _rewrite(run_dir / f"{table}.jsonl", kept[table])
    return kept


def _check_counts(path: Path, table: str, rows: list[dict[str, Any]], status: RunStatus) -> None:
    have: dict[str, int] = {}
    for row in rows:
        key = row_key(row)[0]
        have[key] = have.get(key, 0) + 1
    for key, expected in sorted(status.rows.items()):
        want, got = expected.get(table, 0), have.get(key, 0)
        if got < want:
            raise ConfigError(
                f"{path} holds {got} of the {want} {table} rows of session {key} that its checkpoint "
                "covers (a line was torn or lost); resuming would finish with rows missing: start the "
                "run again with --overwrite, or restore the file"
            )


def _read_tolerant(path: Path) -> Iterable[dict[str, Any]]:
    try:
        lines = path.read_bytes().decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 (byte {exc.start}); the run directory is damaged: start the run again "
            "with --overwrite"
        ) from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the last line, cut by the interruption: drop it
                return
            raise ConfigError(
                f"{path}, line {number}: not a JSON row; the run directory is damaged: start the run "
                "again with --overwrite"
            ) from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"{path}, line {number}: a row must be a JSON object; the run directory is damaged: start "
                "the run again with --overwrite"
            )
        yield row


def _rewrite(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace ``path`` with ``rows``, durably (:func:`april_bench.fsio.write_atomic`)."""
    from april_bench.fsio import write_atomic

    write_atomic(path, "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows))
