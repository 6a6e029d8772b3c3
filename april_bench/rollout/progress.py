"""The in-flight groups as a strategy reads them (``RolloutView.groups``).

Apart from :mod:`april_bench.rollout.step` because that module is compiled in the compiled core
(``april_bench/compiled.py``) and a compiled module's class cannot derive from ``Mapping``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from april_bench.rollout.step import InFlight
from april_bench.rollout.strategy import GroupProgress

__all__ = ["ProgressView"]


class ProgressView(Mapping[int, GroupProgress]):
    """In-flight groups' progress, computed only for the uids a strategy reads."""

    __slots__ = ("_flights", "_now")

    def __init__(self, flights: Mapping[int, InFlight], now: float) -> None:
        self._flights = flights
        self._now = now

    def __getitem__(self, uid: int) -> GroupProgress:
        flight = self._flights[uid]
        return GroupProgress.of(flight.group, running_for_s=self._now - flight.t_launch)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._flights))

    def __len__(self) -> int:
        return len(self._flights)
