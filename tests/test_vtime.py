from __future__ import annotations

import asyncio
from typing import Any

import pytest

from april_bench.vtime import SimulationDeadlock, hops, run_virtual


def test_virtual_clock_jumps_to_timers_in_order() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, float]] = []

        async def waiter(name: str, delay: float) -> None:
            await asyncio.sleep(delay)
            seen.append((name, loop.time()))

        await asyncio.gather(waiter("late", 3600.0), waiter("early", 0.25), waiter("mid", 60.0))
        return seen

    assert run_virtual(main()) == [("early", 0.25), ("mid", 60.0), ("late", 3600.0)]


def test_wait_for_times_out_in_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 42.0)
        return loop.time()

    assert run_virtual(main()) == 42.0


def test_a_wait_that_can_never_end_is_a_deadlock_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationDeadlock, match="deadlock"):
        run_virtual(main())


def test_an_interrupt_stays_an_interrupt_when_a_leftover_task_cannot_finish() -> None:
    """Ctrl-C mid-simulation: the cleanup cancels leftovers; one that then waits forever must not turn
    the KeyboardInterrupt into a SimulationDeadlock (the CLI maps the interrupt to exit 130)."""

    async def stubborn(never: asyncio.Future[None]) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await never  # its producer was cancelled too: this can never complete

    async def main() -> None:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        leftover = asyncio.create_task(stubborn(never))
        await asyncio.sleep(1)
        assert not leftover.done()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_virtual(main())


def _hop_order(run: Any) -> tuple[list[str], list[str]]:
    """What ran in which order when hops and call_soon callbacks are mixed, and what the loop's
    exception handler was given."""
    order: list[str] = []
    errors: list[str] = []

    def broken() -> None:
        raise ValueError("broken hop")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: errors.append(str(context["exception"])))
        push = hops(loop)

        def later(name: str) -> None:  # a callback that schedules more: they run in the next pass
            order.append(name)
            push((order.append, (name + "+hop",)))
            loop.call_soon(order.append, name + "+soon")

        push((later, ("a",)))
        loop.call_soon(later, "b")
        push((broken, ()))
        push((later, ("c",)))
        loop.call_later(0.01, push, (order.append, ("timer",)))
        await asyncio.sleep(0.05)  # real seconds on the real loop

    run(main())
    return order, errors


def test_a_hop_runs_where_call_soon_would_run_it_on_either_loop() -> None:
    virtual = _hop_order(run_virtual)
    real = _hop_order(asyncio.run)
    expected = ["a", "b", "c", "a+hop", "a+soon", "b+hop", "b+soon", "c+hop", "c+soon", "timer"]
    assert virtual == real == (expected, ["broken hop"])
