"""An asyncio event loop on a virtual clock.

The rollout loop is ordinary asyncio code (``await engine...``,
``asyncio.sleep``, ``asyncio.wait_for``).  On a real engine it runs on a normal
loop.  On the simulator it runs on :class:`VirtualTimeLoop`, whose ``time()``
is a virtual clock that jumps straight to the next timer whenever every task is
waiting.  The strategy code is therefore *the same code* in both cases, and a
simulated 3-hour run takes seconds.

How: ``asyncio.SelectorEventLoop`` accepts a selector.  When the loop has
nothing ready it calls ``selector.select(timeout)`` with the time until the next
timer; the virtual selector polls real file descriptors without blocking and
then advances the virtual clock by ``timeout`` instead of sleeping.  If nothing
is ready and no timer is set (``timeout is None``), every task is waiting for
something that can never happen: the simulation is deadlocked, and we raise
instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import signal
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["SimulationDeadlock", "VirtualTimeLoop", "run_real", "run_virtual"]

T = TypeVar("T")


class SimulationDeadlock(RuntimeError):
    """Every task waits and no timer is pending: virtual time cannot advance."""


class _VirtualSelector(selectors.BaseSelector):
    """Polls real descriptors, and turns blocking waits into virtual-clock jumps."""

    #: Real seconds between two polls of the real descriptors while virtual time runs: a poll is a
    #: system call, and a simulated run passes through ``select`` about ten times per request.
    POLL_EVERY_S = 0.002

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.now = 0.0
        self._next_poll = 0.0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # The real descriptors (the loop's self-pipe: signals, another thread's call_soon_threadsafe)
        # are polled every POLL_EVERY_S real seconds, and always before a deadlock is declared.  A
        # callback from another thread is in the ready queue already (the pipe only wakes a blocked
        # select, which this one never is), so polling less often delays nothing but a signal, by
        # at most POLL_EVERY_S.
        if timeout is None or time.monotonic() >= self._next_poll:
            events = self._real.select(0)
            self._next_poll = time.monotonic() + self.POLL_EVERY_S
            if events:
                return events
        if timeout is None:
            raise SimulationDeadlock(
                "virtual-time deadlock: every task is waiting and no timer is set "
                "(a simulated engine lost a request, or code waits on real I/O in a simulated run)"
            )
        self.now += timeout
        return []

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.get_key(fileobj)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual and jumps when the loop is idle."""

    def __init__(self) -> None:
        self._vselector = _VirtualSelector()
        super().__init__(selector=self._vselector)

    def time(self) -> float:
        return self._vselector.now

    def set_time(self, now: float) -> None:
        """Jump the clock forward to ``now`` (a resumed simulation continues where it stopped)."""
        if now < self._vselector.now:
            raise ValueError(f"virtual time cannot move back from {self._vselector.now} to {now}")
        self._vselector.now = now


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a fresh :class:`VirtualTimeLoop`."""
    return _run_on(VirtualTimeLoop(), coro)


def run_real(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a fresh ordinary event loop (real time)."""
    return _run_on(asyncio.new_event_loop(), coro)


def _quiet_interrupts(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The default handler, minus the tasks an interrupt (Ctrl-C, SIGTERM) ended: the interrupt is
    handled by whoever stops the run, not reported once per task."""
    if isinstance(context.get("exception"), (KeyboardInterrupt, SystemExit)):
        return
    loop.default_exception_handler(context)


def _run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    loop.set_exception_handler(_quiet_interrupts)
    main = loop.create_task(coro)
    interrupted: list[int] = []
    with _interrupts_cancel(loop, main, interrupted):
        try:
            return loop.run_until_complete(main)
        except asyncio.CancelledError:
            if interrupted:  # the signal cancelled the run: report it as the interrupt it was
                raise KeyboardInterrupt from None
            raise
        finally:
            try:
                _cancel_leftovers(loop)
            finally:
                loop.close()


@contextlib.contextmanager
def _interrupts_cancel(
    loop: asyncio.AbstractEventLoop, main: asyncio.Task[Any], interrupted: list[int]
) -> Iterator[None]:
    """While the loop runs, SIGINT/SIGTERM cancel the main task instead of raising ``KeyboardInterrupt``
    wherever the loop happens to be (as ``asyncio.run`` does for SIGINT).  An exception raised between
    two lines of the loop's own machinery can lose a task's wake-up: the task then never ends, and once
    the loop is closed its clean-up fails with ``RuntimeError: Event loop is closed``.  A cancellation
    unwinds every task at an ``await``.  The handler installed before (the CLI's, which records the
    signal) still runs first; only signals with a Python handler are taken over, in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def on_signal(signum: int, frame: Any) -> None:
        handler = previous.get(signum)
        try:
            if callable(handler):
                handler(signum, frame)  # the caller's handler: records the signal, then raises
        except KeyboardInterrupt:
            pass
        interrupted.append(signum)
        if not main.done():
            main.cancel()
            loop.call_soon_threadsafe(lambda: None)  # wake a loop blocked in select()

    def on_loop_signal(signum: int) -> None:
        on_signal(signum, None)

    through_loop: set[int] = set()
    for sig in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(sig)
        if not callable(current):
            continue
        previous[sig] = current
        # The loop's own signal handling wakes it through its self-pipe, whichever thread the kernel
        # delivers the signal to; a plain handler runs only once the main thread leaves select(),
        # which can be a sleep's whole timeout later when another thread (telemetry, an engine's
        # worker) took the signal.
        try:
            loop.add_signal_handler(sig, on_loop_signal, sig)
            through_loop.add(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # no Unix loop: the plain handler
            signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if signum in through_loop:
                now = signal.getsignal(signum)
                loop.remove_signal_handler(signum)
                if now in (signal.SIG_IGN, signal.SIG_DFL):  # the caller's handler set it since: keep it
                    signal.signal(signum, now)
                    continue
                signal.signal(signum, handler)
            elif signal.getsignal(signum) is on_signal:  # the caller's handler may have set SIG_IGN since
                signal.signal(signum, handler)


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        # After an interrupt a task can be left waiting on a future that its (cancelled) producer
        # will never complete; nothing is left to run then, so the cleanup is over.
        with contextlib.suppress(SimulationDeadlock):
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
