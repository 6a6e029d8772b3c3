"""The simulated replica's scheduler as its task's owner sees it: it runs as callbacks (no coroutine
per wait), so what a task gave for free is checked here: an error in a pass fails every live stream
and ends the task with it, a cancelled task stops every part still scheduled, and a pause holds the
replica between forward passes until resumed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from april_bench.engines.protocol import EngineError, GenerateRequest, SamplingParams
from april_bench.engines.sim.cost import CostModel
from april_bench.engines.sim.replica import ReplicaSettings, SimReplica
from april_bench.engines.stream import CompletionStream
from april_bench.profiles.hardware import hardware_profile
from april_bench.profiles.models import MODELS
from april_bench.vtime import run_virtual

SP = SamplingParams(temperature=1.0)


def _cost() -> CostModel:
    return CostModel(hardware_profile("h100"), MODELS.get("qwen3-4b"), tp=1)


def _replica(cost: Any = None) -> SimReplica:
    settings = ReplicaSettings(
        kv_capacity=20_000,
        max_running=64,
        chunk_tokens=8192,
        schedule_conservativeness=1.0,
        replan_iterations=64,
    )
    return SimReplica(0, cost or _cost(), settings, [0])


def _request(name: str, length: int) -> GenerateRequest:
    return GenerateRequest(name, input_len=100, max_new_tokens=4000, sampling=SP, replay_len=length)


class _DecodeBreaks:
    """The cost model, except that pricing a decode run raises (a pass that fails mid-run)."""

    def __init__(self) -> None:
        self._cost = _cost()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cost, name)

    def decode_run_time(self, batch: int, context_sum: float, iterations: int) -> float:
        raise RuntimeError("boom")


def test_a_pass_that_raises_fails_every_live_stream_and_ends_the_task_with_the_error() -> None:
    replica = _replica(_DecodeBreaks())

    async def main() -> tuple[list[str], BaseException | None]:
        task = asyncio.ensure_future(replica.run())
        streams = [CompletionStream(1), CompletionStream(1)]
        for i, stream in enumerate(streams):
            replica.submit(_request(f"r{i}", 50), stream)
        errors = []
        for stream in streams:
            with pytest.raises(EngineError) as caught:
                [c async for c in stream]
            errors.append(str(caught.value))
        await asyncio.gather(task, return_exceptions=True)
        return errors, task.exception()

    errors, ended = run_virtual(main())
    assert errors == ["simulated replica 0 failed: boom"] * 2
    assert isinstance(ended, RuntimeError) and str(ended) == "boom"


def test_a_cancelled_scheduler_runs_nothing_more() -> None:
    # cancelled mid-run, as the failure model does (fail(), then cancel the task): no token more is
    # decoded and nothing is delivered, though the decode run's timer was due later
    replica = _replica()

    async def main() -> tuple[int, list[Any], list[Any], float]:
        task = asyncio.ensure_future(replica.run())
        stream = CompletionStream(1)
        delivered: list[Any] = []
        stream.consume(delivered.append, delivered.append)
        replica.submit(_request("r", 3000), stream)
        await asyncio.sleep(0.5)  # prefill done, inside the one decode run to the finish
        lost = replica.fail()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(1000.0)  # far past where the request would have finished
        loop = asyncio.get_running_loop()
        return replica.D, [(r.request_id, n) for r, _, n, _ in lost], delivered, loop.time()

    decoded, lost, delivered, now = run_virtual(main())
    assert decoded == 0  # the run in progress never ended
    assert len(lost) == 1 and lost[0][0] == "r" and 0 < lost[0][1] < 3000  # its tokens so far
    assert delivered == []
    assert now == pytest.approx(1000.5)


def test_a_paused_replica_decodes_nothing_until_resumed() -> None:
    replica = _replica()

    async def main() -> tuple[int, int, float, float]:
        task = asyncio.ensure_future(replica.run())
        stream = CompletionStream(1)
        replica.submit(_request("r", 2000), stream)
        await asyncio.sleep(0.5)
        await replica.pause()  # resolves at the end of the forward pass in progress
        paused_at = replica.D
        await asyncio.sleep(100.0)
        held = replica.D
        replica.resume()
        (done,) = [c async for c in stream]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return paused_at, held, done.t_done, float(done.num_tokens)

    paused_at, held, t_done, tokens = run_virtual(main())
    assert 0 < paused_at < 2000
    assert held == paused_at
    assert tokens == 2000
    assert t_done > 100.5  # the pause's 100 s are in its time


def test_the_same_request_takes_the_same_time_alone_and_after_a_kick_that_changes_nothing() -> None:
    # a kick (here: an abort of an unknown id) cuts the decode run at the iteration in progress and
    # plans again; the run then goes on, and the request finishes on the same iteration count
    def finish(kick_at: float | None) -> tuple[int, int]:
        replica = _replica()

        async def main() -> tuple[int, int]:
            task = asyncio.ensure_future(replica.run())
            stream = CompletionStream(1)
            replica.submit(_request("r", 1500), stream)
            if kick_at is not None:
                await asyncio.sleep(kick_at)
                replica.request_abort({"someone-else"})
            (done,) = [c async for c in stream]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return done.num_tokens, replica.D

        return run_virtual(main())

    assert finish(None) == finish(1.0) == (1500, 1499)
