"""The async iterator an engine's ``generate()`` returns."""

from __future__ import annotations

import asyncio
from collections import deque

from april_bench.engines.protocol import Completion

__all__ = ["CompletionStream"]


class CompletionStream:
    """Yields exactly ``expected`` completions, in the order the engine delivers them.

    The engine calls :meth:`deliver` (synchronously, from its own task or
    callback); the consumer iterates with ``async for``.
    """

    __slots__ = ("_error", "_expected", "_items", "_waiter")

    def __init__(self, expected: int) -> None:
        self._expected = expected
        self._items: deque[Completion] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        """The engine broke: the consumer's next ``__anext__`` raises ``error``."""
        self._error = error
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def deliver(self, completion: Completion) -> None:
        self._items.append(completion)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> CompletionStream:
        return self

    async def __anext__(self) -> Completion:
        if self._expected == 0:
            raise StopAsyncIteration
        while not self._items:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        self._expected -= 1
        return self._items.popleft()
