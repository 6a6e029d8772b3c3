"""The run's recorder: the tables of :mod:`april_bench.results.records`, kept in memory and streamed
to a sink as they are added, with the per-arm summary accumulated as rows come."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from april_bench.results.accumulate import SummaryAccumulator
from april_bench.results.records import TABLES, Fate, SampleRecord, TraceRecord, as_row
from april_bench.results.summary import summarize, summary_of
from april_bench.types import Group, Sample, SampleStatus

__all__ = ["SMALL_TABLES", "RowSink", "RunRecorder"]

_TABLE_OF = {cls: name for name, cls in TABLES.items()}


class RowSink(Protocol):
    """Where rows go as they are recorded (a run directory streams them to disk)."""

    def write(self, table: str, row: dict[str, Any]) -> None: ...


#: The tables of one row per step or evaluation: a recorder streaming to disk can leave the others
#: there (``RunRecorder(keep=SMALL_TABLES)``), and then holds a row or two per step rather than
#: every request, sample, trace sample and event (the summary accumulates what it needs of them).
SMALL_TABLES = ("steps", "evals", "engine_metrics")


class RunRecorder:
    """The named tables of one run, for every arm: records kept in memory and, with a ``sink``,
    streamed out as they are added.  ``recorder["steps"]`` is the list of step records.

    ``keep`` names the tables held in memory (default: all).  The per-arm summary is accumulated
    as rows come (:class:`~april_bench.results.accumulate.SummaryAccumulator`), so a run that
    streams its rows and keeps only :data:`SMALL_TABLES` runs in memory that does not grow with its
    requests and samples."""

    def __init__(self, sink: RowSink | None = None, *, keep: Iterable[str] | None = None) -> None:
        self.tables: dict[str, list[Any]] = {name: [] for name in TABLES}
        self.sink = sink
        self.kept = frozenset(TABLES if keep is None else keep)
        self._accumulator = SummaryAccumulator()

    def add(self, record: Any) -> None:
        """Append a record to its table (chosen by its type), the summary and the sink."""
        table = _TABLE_OF[type(record)]
        if table in self.kept:
            self.tables[table].append(record)
        if self.sink is None and table == "requests":  # the table says the type: a RequestRecord
            self._accumulator.add_request(record)  # no row to write: none built
            return
        row = as_row(record)
        self._accumulator.add(table, row)
        if self.sink is not None:
            self.sink.write(table, row)

    def extend(self, records: Iterable[Any]) -> None:
        for record in records:
            self.add(record)

    def preload(self, rows: Mapping[str, Iterable[dict[str, Any]]]) -> None:
        """Rows recorded before (a resumed run's): kept as dict rows, not sent to the sink again."""
        for table in TABLES:  # table by table, as summarize() reads them
            for row in rows.get(table, ()):
                self._accumulator.add(table, row)
                if table in self.kept:
                    self.tables[table].append(row)

    def __getitem__(self, table: str) -> list[Any]:
        return self.tables[table]

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        """Every table as plain dict rows."""
        return {name: [as_row(r) for r in records] for name, records in self.tables.items()}

    def summary(
        self, *, baseline: str | None = None, block_steps: int | None = None
    ) -> dict[str, dict[str, Any]]:
        """Per-arm metrics of the rows recorded so far (:func:`april_bench.results.summary.summarize`;
        GPU telemetry summaries need the rows: they are left out unless every table is kept)."""
        if self.kept == frozenset(TABLES):
            return summarize(self.rows(), baseline=baseline, block_steps=block_steps)
        return summary_of(self._accumulator, baseline=baseline, block_steps=block_steps)

    def sample_fates(
        self,
        arm: str,
        groups: list[Group],
        *,
        step: int,
        fate: Fate,
        reason: str,
        train_version: int | None = None,
        repeat: int = 0,
    ) -> None:
        """Record one fate row per sample of ``groups``."""
        for group in groups:
            for s in group.samples:
                runs = s.version_runs()
                off = 0 if train_version is None else s.off_policy_tokens(train_version)
                self.add(
                    SampleRecord(
                        arm=arm,
                        step=step,
                        group_uid=group.uid,
                        sample_index=s.index,
                        fate=fate.value,
                        reason=reason,
                        prompt_len=s.prompt.length,
                        response_len=s.response_len,
                        status=s.status.value,
                        reward=s.reward,
                        start_step=s.start_step,
                        abort_count=s.abort_count,
                        version_runs=[[v, n] for v, n in runs],
                        train_version=train_version,
                        off_policy_tokens=off,
                        discarded_tokens=s.discarded_tokens,
                        repeat=repeat,
                        observation_tokens=s.observation_tokens,
                        episode=_episode(s),
                    )
                )
                if s.status.is_finished:  # its natural length is known: it joins the trace
                    self.add(
                        TraceRecord(
                            arm=arm,
                            step=step,
                            prompt_id=str(group.uid),
                            sample_index=s.index,
                            prompt_tokens=s.prompt.length,
                            response_tokens=s.response_len,
                            finish="truncated" if s.status is SampleStatus.TRUNCATED else "stop",
                            reward=s.reward,
                            repeat=repeat,
                        )
                    )


def _episode(s: Sample) -> dict[str, Any] | None:
    """A multi-turn sample's per-episode figures for its sample row (``None`` for a plain sample)."""
    if s.env_state is None and not s.env_calls:
        return None
    turns, in_turn = 0, False  # a turn: generated segments between observations
    for seg in s.segments:
        turns += not seg.observation and not in_turn
        in_turn = not seg.observation
    return {
        "turns": turns,
        "env_calls": s.env_calls,
        "env_time_s": s.env_time_s,
        "request_time_s": s.request_time_s,
        "generated_tokens": s.response_len - s.observation_tokens,
        "steps": sorted({seg.step for seg in s.segments if not seg.observation}),
        "env_state": s.env_state,
    }
