"""The carry-over buffer: whole groups waiting to be resumed, oldest first."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from april_bench.types import Group

__all__ = ["GroupBuffer"]


class GroupBuffer:
    """FIFO of groups carried from one step to the next (slime's ``pop_first``)."""

    def __init__(self) -> None:
        self._groups: deque[Group] = deque()

    def put(self, group: Group) -> None:
        self._groups.append(group)

    def take(self, n: int) -> list[Group]:
        """Remove and return up to ``n`` groups, oldest first."""
        return [self._groups.popleft() for _ in range(min(n, len(self._groups)))]

    def remove(self, uids: set[int]) -> list[Group]:
        """Remove and return the groups with these uids (in buffer order); the rest keep their order."""
        taken = [g for g in self._groups if g.uid in uids]
        if taken:
            self._groups = deque(g for g in self._groups if g.uid not in uids)
        return taken

    def __len__(self) -> int:
        return len(self._groups)

    def __iter__(self) -> Iterator[Group]:
        return iter(self._groups)
