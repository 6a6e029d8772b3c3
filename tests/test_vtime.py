from __future__ import annotations

import asyncio

import pytest

from april_bench.vtime import SimulationDeadlock, run_virtual


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
