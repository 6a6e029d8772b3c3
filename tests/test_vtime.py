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
