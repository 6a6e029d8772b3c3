"""What a math data-set loader produces: one normalised record per problem, and a report of its skips."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadReport", "LoadedDataset", "MathProblem"]


@dataclass(frozen=True, slots=True)
class MathProblem:
    """One problem, whatever file or hub schema it came from."""

    #: Registered data-set name: dapo-math-17k, deepscaler, deepmath-103k, aime-2024, aime-2025, math-500.
    dataset: str
    #: A stable id from the source (a UUID, ``unique_id``, ``id`` or the row index).
    source_id: str
    #: The problem statement alone, without any instruction template.
    problem: str
    #: The reference answer exactly as the source gives it (no normalisation: graders normalise).
    answer: str
    #: Everything else worth keeping: difficulty, subject, level, year, solution, the source prompt ...
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class LoadReport:
    """Rows read, kept, and skipped with the reason for each skip.

    Every row read is either kept or counted under exactly one skip reason, so
    ``rows_read == kept + sum(skipped.values())``.  ``repaired`` and ``notes``
    count kept rows that were changed or need a second look; they are not skips.
    """

    source: str
    rows_read: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    #: Kept rows whose problem or answer :func:`~april_bench.data.repair_latex` changed.
    repaired: int = 0
    #: Kept rows worth a look, by remark (e.g. "instruction template not recognised: whole prompt kept").
    notes: dict[str, int] = field(default_factory=dict)
    #: Rows read per detected schema (e.g. "open-r1 processed": 101).
    schemas: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def note(self, remark: str) -> None:
        self.notes[remark] = self.notes.get(remark, 0) + 1

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


@dataclass(slots=True)
class LoadedDataset:
    """The problems of one data set, the report of how they were read, and where from."""

    name: str
    problems: list[MathProblem]
    report: LoadReport
    #: The local file or directory read, or ``None`` for a hub load.
    path: str | None = None
    #: The hub data set read, or ``None`` for a local load.
    hub_id: str | None = None
    #: The hub split read (``None`` for local files).
    split: str | None = None

    def __len__(self) -> int:
        return len(self.problems)

    def __iter__(self) -> Iterator[MathProblem]:
        return iter(self.problems)
