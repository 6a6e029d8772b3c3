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
import gc
import heapq
import selectors
import signal
import sys
import threading
import time
from asyncio import events, format_helpers
from collections.abc import Callable, Coroutine, Iterator
from contextvars import Context, copy_context
from typing import Any, TypeVar

__all__ = ["Hop", "SimulationDeadlock", "VirtualTimeLoop", "hops", "run_real", "run_virtual"]

T = TypeVar("T")


# asyncio.base_events' constants (private there): the loop below does what its _run_once does.
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5
_MAXIMUM_SELECT_TIMEOUT = 24 * 3600


class _Handle(events.Handle):
    """``asyncio.Handle`` built in one call (the virtual loop runs no debug mode through it)."""

    __slots__ = ()

    def __init__(
        self, callback: Callable[..., object], args: Any, loop: Any, context: Context | None
    ) -> None:
        self._context = copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = format_helpers.extract_stack(sys._getframe(1)) if loop._debug else None


class _TimerHandle(events.TimerHandle):
    """``asyncio.TimerHandle`` built in one call; cancelling it counts it as ``TimerHandle.cancel`` does."""

    __slots__ = ()

    def __init__(
        self, when: float, callback: Callable[..., object], args: Any, loop: Any, context: Context | None
    ) -> None:
        self._context = copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = format_helpers.extract_stack(sys._getframe(1)) if loop._debug else None
        self._when = when
        self._scheduled = False

    def cancel(self) -> None:
        if self._cancelled:
            return
        if self._loop._debug:
            super().cancel()
            return
        if self._scheduled:  # BaseEventLoop._timer_handle_cancelled
            self._loop._timer_cancelled_count += 1
        self._cancelled = True
        self._callback = None  # type: ignore[assignment]
        self._args = None  # type: ignore[assignment]


class SimulationDeadlock(RuntimeError):
    """Every task waits and no timer is pending: virtual time cannot advance."""


class _VirtualSelector(selectors.BaseSelector):
    """Polls real descriptors, and turns blocking waits into virtual-clock jumps."""

    #: Real seconds between two polls of the real descriptors while virtual time runs: a poll is a
    #: system call, and a simulated run passes through ``select`` about ten times per request.
    POLL_EVERY_S = 0.01

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

    # The simulator's hot path: a simulated run passes through the loop about ten times per request.
    # The methods below do what ``asyncio.BaseEventLoop``'s do (CPython 3.11-3.13: the same callbacks
    # and timers, run in the same order, the same float arithmetic on the clock) with less Python
    # around them: no debug-mode checks (in debug mode they are the base class's), handles built
    # without a chain of ``__init__`` calls, and the timer heap holding ``(when, handle)`` pairs, which
    # compare in C; a pair orders exactly as its handle does (``TimerHandle`` compares by ``when``
    # alone), so the heap makes the same moves and equal times fire in the same order.

    def create_task(  # type: ignore[override]
        self, coro: Any, *, name: str | None = None, context: Context | None = None
    ) -> Any:
        if self._debug or self._closed or self._task_factory is not None:  # type: ignore[attr-defined]
            return super().create_task(coro, name=name, context=context)
        return asyncio.Task(coro, loop=self, name=name, context=context)

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Context | None = None
    ) -> Any:
        if self._debug or self._closed:  # type: ignore[attr-defined]
            return super().call_soon(callback, *args, context=context)
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle

    def call_later(  # type: ignore[override]
        self, delay: float, callback: Callable[..., object], *args: Any, context: Context | None = None
    ) -> Any:
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._vselector.now + delay, callback, *args, context=context)

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Context | None = None
    ) -> Any:
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()  # type: ignore[attr-defined]
        if self._debug:  # type: ignore[attr-defined]
            self._check_thread()  # type: ignore[attr-defined]
            self._check_callback(callback, "call_at")  # type: ignore[attr-defined]
        timer = _TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, (when, timer))
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        # asyncio.BaseEventLoop._run_once, with (when, handle) pairs in the heap, run pass after pass
        # until the loop is stopping (what run_forever's loop does: it calls _run_once, then breaks
        # when _stopping; here one call runs those passes, with the locals set once)
        ready = self._ready  # type: ignore[attr-defined]
        popleft = ready.popleft
        selector = self._vselector
        resolution = self._clock_resolution  # type: ignore[attr-defined]
        heappop = heapq.heappop
        monotonic = time.monotonic
        while True:
            scheduled: list[tuple[float, Any]] = self._scheduled  # type: ignore[has-type]
            count = len(scheduled)
            if (
                count > _MIN_SCHEDULED_TIMER_HANDLES
                and self._timer_cancelled_count / count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION  # type: ignore[has-type]
            ):
                kept = []
                for entry in scheduled:
                    if entry[1]._cancelled:
                        entry[1]._scheduled = False
                    else:
                        kept.append(entry)
                heapq.heapify(kept)
                self._scheduled = scheduled = kept
                self._timer_cancelled_count = 0
            else:
                while scheduled and scheduled[0][1]._cancelled:
                    self._timer_cancelled_count -= 1
                    heappop(scheduled)[1]._scheduled = False
            timeout: float | None = None
            if ready or self._stopping:  # type: ignore[attr-defined]
                timeout = 0
            elif scheduled:
                timeout = min(max(0, scheduled[0][0] - selector.now), _MAXIMUM_SELECT_TIMEOUT)
            if timeout is None or monotonic() >= selector._next_poll:
                event_list = selector.select(timeout)
                if event_list:
                    self._process_events(event_list)  # type: ignore[attr-defined]
                event_list = []
            else:  # selector.select(timeout) between two polls: the clock jumps by the timeout
                selector.now += timeout
            end_time = selector.now + resolution
            while scheduled:
                if scheduled[0][0] >= end_time:
                    break
                handle = heappop(scheduled)[1]
                handle._scheduled = False
                ready.append(handle)
            debug = self._debug  # type: ignore[attr-defined]
            for _ in range(len(ready)):
                handle = popleft()
                if handle.__class__ is tuple:  # a hop (hops()): (callback, args), without a handle
                    try:
                        handle[0](*handle[1])
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        _report_hop(self, handle, exc)
                    continue
                if handle._cancelled:
                    continue
                if debug:
                    self._current_handle = handle
                    try:
                        handle._run()
                    finally:
                        self._current_handle = None
                else:
                    # handle._run(), inlined (a pass runs about a handle per event)
                    try:
                        handle._context.run(handle._callback, *handle._args)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        _report(handle, exc)
            handle = None  # no cycle through an exception's frame
            if self._stopping:  # type: ignore[attr-defined]
                return


#: A callback and its arguments, for :func:`hops`.
Hop = tuple[Callable[..., object], tuple[Any, ...]]


def hops(loop: asyncio.AbstractEventLoop) -> Callable[[Hop], None]:
    """``push((callback, args))``: ``callback(*args)`` runs in the loop's next pass, where
    ``loop.call_soon(callback, *args)`` would run it, but with no handle to cancel and in the loop's
    own context (for callbacks that read no context variable).  On a :class:`VirtualTimeLoop` the pair
    goes on its ready queue as it is: a handle and two calls less per hop, and the simulator hops a
    dozen times per request.  On any other loop it goes through ``call_soon``."""
    if isinstance(loop, VirtualTimeLoop):
        return loop._ready.append  # type: ignore[attr-defined]
    call_soon = loop.call_soon

    def push(hop: Hop) -> None:
        call_soon(hop[0], *hop[1])

    return push


def _report_hop(loop: asyncio.AbstractEventLoop, hop: Hop, exc: BaseException) -> None:
    """What :func:`_report` does for a hop: the loop's exception handler gets what it raised."""
    source = format_helpers._format_callback_source(hop[0], hop[1])
    loop.call_exception_handler({"message": f"Exception in callback {source}", "exception": exc})


def _report(handle: events.Handle, exc: BaseException) -> None:
    """What ``Handle._run`` does with an exception its callback raised: the loop's handler gets it."""
    callback, args = handle._callback, handle._args  # type: ignore[attr-defined]
    source = format_helpers._format_callback_source(callback, args)
    context: dict[str, Any] = {
        "message": f"Exception in callback {source}",
        "exception": exc,
        "handle": handle,
    }
    if handle._source_traceback:  # type: ignore[attr-defined]
        context["source_traceback"] = handle._source_traceback  # type: ignore[attr-defined]
    handle._loop.call_exception_handler(context)  # type: ignore[attr-defined]


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a fresh :class:`VirtualTimeLoop`."""
    with _fewer_collections():
        return _run_on(VirtualTimeLoop(), coro)


#: The cyclic collector's first-generation threshold while a simulated run goes (Python's default is
#: 700 allocations): a simulated run allocates a few hundred short-lived objects per request, and
#: collecting every few requests cost about a tenth of its time.  Garbage is the same, collected later.
_SIM_GC_THRESHOLD = 50_000


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Raise the collector's first threshold for the block (never lower it); restored after."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], _SIM_GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        if gc.get_threshold()[0] == max(before[0], _SIM_GC_THRESHOLD):  # nobody changed it meanwhile
            gc.set_threshold(*before)


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
