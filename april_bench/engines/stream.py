"""The async iterator an engine's ``generate()`` returns."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from april_bench.engines.protocol import Completion
from april_bench.vtime import Hop, hops

__all__ = ["CompletionStream"]


class CompletionStream:
    """Yields exactly ``expected`` completions, in the order the engine delivers them.

    The engine calls :meth:`deliver` (synchronously, from its own task or
    callback); the consumer iterates with ``async for``.
    """

    __slots__ = ("_armed", "_consumer", "_error", "_expected", "_hop", "_items", "_loop", "_waiter")

    def __init__(self, expected: int) -> None:
        self._expected = expected
        self._items: deque[Completion] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        #: :meth:`consume`'s callbacks and the future it returned; ``_armed``: it waits for a delivery.
        self._consumer: (
            tuple[Callable[[Completion], None], Callable[[BaseException], None], asyncio.Future[None]] | None
        ) = None
        self._armed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hop: Callable[[Hop], None] | None = None  # consume(): the loop's hops()

    def fail(self, error: BaseException) -> None:
        """The engine broke: the consumer's next ``__anext__`` raises ``error``."""
        self._error = error
        self._wake()

    def deliver(self, completion: Completion) -> None:
        self._items.append(completion)
        self._wake()

    def _wake(self) -> None:
        if self._armed:
            self._armed = False
            assert self._hop is not None
            self._hop((self._step, ()))  # where the waiter's set_result would wake the task
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def consume(
        self, on_item: Callable[[Completion], None], on_error: Callable[[BaseException], None]
    ) -> asyncio.Future[None]:
        """Hand every completion to ``on_item``, in the loop passes in which a task running
        ``async for c in stream: on_item(c)`` would (its first step is scheduled now; a delivery
        while it waits wakes it in the next pass, and it takes every completion there is then),
        without the task and its coroutines: the simulator's hot path.  ``on_error`` gets the
        engine's error or what ``on_item`` raised, which ends the consumption.  The future resolves
        once every expected completion was handed over, or at the error.  Use this or ``async for``,
        not both."""
        self._loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = asyncio.Future(loop=self._loop)  # loop.create_future(), a call less
        self._consumer = (on_item, on_error, done)
        self._hop = hops(self._loop)
        self._hop((self._step, ()))
        return done

    def _step(self) -> None:
        """One step of :meth:`consume`'s would-be task."""
        assert self._consumer is not None
        on_item, on_error, done = self._consumer
        items = self._items
        try:
            while self._expected:
                if not items:
                    if self._error is not None:
                        raise self._error
                    self._armed = True
                    return
                self._expected -= 1
                on_item(items.popleft())
        except BaseException as exc:
            on_error(exc)
            done.set_result(None)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: stop the loop now
            return
        done.set_result(None)

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
