"""Replaying a trace's groups (``--workload-arg trace=FILE``): the workload kind behind ``whatif``.

Prompt ``uid`` replays the trace's ``uid``-th group (:meth:`april_bench.trace.format.Trace.groups`:
by step, then file order), wrapping around at the end, so a run consumes the trace in its step order
and the length drift over steps comes with it.  Each sample replays one row of its group: its
response length, prompt length and reward together, so a group's long samples stay in one group and
the length-reward coupling the filter sees is the source run's.  A row the source truncated replays
one token past its length, so the same limit truncates it again.
"""

from __future__ import annotations

import math
from pathlib import Path

from april_bench.config import ConfigError
from april_bench.sim.lengths import LengthDraw
from april_bench.trace.format import Trace, TraceGroup, TraceRow, read_trace

__all__ = ["TraceReplay"]


class TraceReplay:
    """A :class:`~april_bench.sim.lengths.LengthModel` over a trace's groups, in order."""

    drift_per_step = 0.0  # the drift is in the trace's step order

    def __init__(self, path: Path, *, arm: str | None = None) -> None:
        self.trace: Trace = read_trace(Path(path), arm=arm)
        self.groups: list[TraceGroup] = self.trace.groups()
        if not self.groups:
            raise ConfigError(f"{path}: the trace has no groups")
        self.name = f"trace:{Path(path).name}"

    @property
    def has_rewards(self) -> bool:
        return self.trace.has_rewards

    def group(self, uid: int) -> TraceGroup:
        return self.groups[uid % len(self.groups)]

    def row(self, uid: int, index: int) -> TraceRow:
        rows = self.group(uid).rows
        return rows[index % len(rows)]

    def replay_len(self, row: TraceRow) -> int:
        return max(1, row.response_tokens + (1 if row.finish == "truncated" else 0))

    def draw(self, uid: int, n: int) -> LengthDraw:
        rows = [self.row(uid, j) for j in range(n)]
        return LengthDraw(
            tuple(math.log(self.replay_len(r)) for r in rows),
            tuple((r.reward or 0.0) > 0 for r in rows),
        )

    def extra(self, uid: int, n: int, index: int) -> tuple[float, bool]:
        """The group's rows, cycled on (as :meth:`draw` cycles them)."""
        row = self.row(uid, index)
        return math.log(self.replay_len(row)), (row.reward or 0.0) > 0

    def reward(self, uid: int, index: int, *, truncated: bool) -> float:
        """The row's reward; 0 when the replay truncated a response the source finished (a lower limit)."""
        row = self.row(uid, index)
        if row.reward is None or (truncated and row.finish != "truncated"):
            return 0.0
        return row.reward

    def longest_prompt(self) -> int:
        return max(g.prompt_tokens for g in self.groups)
