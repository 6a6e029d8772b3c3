"""The simulator's hot paths do what the plain code they replace does, in the same order.

The virtual-time loop's lean ``call_soon``/``call_at``/``_run_once`` against asyncio's own (the same
virtual selector), a stream's ``consume`` against a task iterating it with ``async for``, the
galloping ``iterations_within`` against a bisection, a tool call through ``ToolSandbox.step_then``
against a task awaiting ``step``, and the inlined decode run time against the sum it replaces: the
paper table is reproduced byte for byte only if none of them moves an event."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from april_bench.engines.protocol import Completion
from april_bench.engines.sim.cost import iterations_within
from april_bench.engines.stream import CompletionStream
from april_bench.types import FinishReason
from april_bench.vtime import VirtualTimeLoop, _run_on


class _PlainLoop(VirtualTimeLoop):
    """The virtual clock with asyncio's own scheduling methods (what VirtualTimeLoop's replace)."""

    call_soon = asyncio.SelectorEventLoop.call_soon  # type: ignore[assignment]
    call_at = asyncio.SelectorEventLoop.call_at  # type: ignore[assignment]
    call_later = asyncio.SelectorEventLoop.call_later  # type: ignore[assignment]
    create_task = asyncio.SelectorEventLoop.create_task  # type: ignore[assignment]
    _run_once = asyncio.SelectorEventLoop._run_once  # type: ignore[attr-defined]


async def _workload(seed: int) -> list[tuple[str, float]]:
    """Tasks sleeping durations with many ties, timers cancelled (enough to make the loop rebuild its
    heap), call_soon chains and futures: every event logged with the clock."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    log: list[tuple[str, float]] = []

    async def worker(name: int) -> None:
        for i in range(30):
            delay = rng.choice([0.0, 0.5, 1.0, 1.0, 2.5, rng.random()])
            await asyncio.sleep(delay)
            log.append((f"w{name}.{i}", loop.time()))
            doomed = [
                loop.call_later(rng.random() * 5, log.append, ("never", -1.0))
                for _ in range(rng.randrange(8))
            ]
            for handle in doomed:
                handle.cancel()
            loop.call_soon(log.append, (f"soon{name}.{i}", loop.time()))
            if rng.random() < 0.3:
                fut = loop.create_future()
                loop.call_at(loop.time() + rng.choice([0.5, 1.0]), fut.set_result, None)
                await fut
                log.append((f"fut{name}.{i}", loop.time()))

    await asyncio.gather(*(worker(n) for n in range(12)))
    return log


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_lean_virtual_loop_runs_every_callback_where_asyncio_would(seed: int) -> None:
    lean = _run_on(VirtualTimeLoop(), _workload(seed))
    plain = _run_on(_PlainLoop(), _workload(seed))
    assert len(lean) > 300
    assert lean == plain


def _completion(i: int) -> Completion:
    return Completion(
        request_id=f"r{i}", num_tokens=1, finish_reason=FinishReason.STOP, policy_version=0, t_done=0.0
    )


async def _deliveries(consume: Callable[[CompletionStream, list[str]], Any]) -> list[str]:
    """Two streams, deliveries in bursts and singles interleaved with other callbacks, one failure."""
    loop = asyncio.get_running_loop()
    log: list[str] = []
    a, b, c = CompletionStream(4), CompletionStream(2), CompletionStream(3)
    done = [consume(s, log) for s in (a, b, c)]
    loop.call_soon(log.append, "other-0")
    await asyncio.sleep(1.0)
    a.deliver(_completion(0))
    b.deliver(_completion(1))
    a.deliver(_completion(2))
    loop.call_soon(log.append, "other-1")
    await asyncio.sleep(0)
    log.append("main-0")
    b.deliver(_completion(3))
    c.deliver(_completion(4))
    await asyncio.sleep(1.0)
    a.deliver(_completion(5))
    c.fail(RuntimeError("engine broke"))
    a.deliver(_completion(6))
    await asyncio.gather(*done)
    log.append("all-done")
    return log


def _by_task(stream: CompletionStream, log: list[str]) -> asyncio.Future[None]:
    async def pump() -> None:
        try:
            async for completion in stream:
                log.append(completion.request_id)
        except RuntimeError as exc:
            log.append(f"error {exc}")
        log.append("end")

    return asyncio.ensure_future(pump())


def _by_consume(stream: CompletionStream, log: list[str]) -> asyncio.Future[None]:
    def on_error(exc: BaseException) -> None:
        log.append(f"error {exc}")

    return stream.consume(lambda c: log.append(c.request_id), on_error)


def test_consume_hands_completions_over_in_the_passes_a_pump_task_would() -> None:
    by_task = _run_on(VirtualTimeLoop(), _deliveries(_by_task))
    by_consume = _run_on(VirtualTimeLoop(), _deliveries(_by_consume))
    assert [e for e in by_task if e != "end"] == by_consume
    assert by_consume.index("r2") < by_consume.index("other-1")  # a burst is taken in one pass
    assert "error engine broke" in by_consume


def _reference(run_time: Callable[[int], float], limit: int, budget: float) -> int:
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if run_time(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def test_iterations_within_gives_the_bisection_answer() -> None:
    rng = random.Random(0)
    for _ in range(20_000):
        c, a, b = rng.random(), rng.random(), rng.random() * rng.choice([0.0, 1e-3, 1.0, 100.0])

        def run_time(k: int, c: float = c, a: float = a, b: float = b) -> float:
            return 0.0 if k <= 0 else c * k + a * k + b * k * (k - 1) / 2

        limit = rng.choice([0, 1, 2, 3, 17, 1000, rng.randrange(1, 5000)])
        budget = rng.random() * 1.3 * run_time(limit)
        if rng.random() < 0.1:
            budget = run_time(rng.randrange(0, limit + 1))  # exactly a run's time: ties
        assert iterations_within(run_time, limit, budget) == _reference(run_time, limit, budget)


@pytest.mark.parametrize("loop_type", [VirtualTimeLoop, _PlainLoop])
def test_a_callback_s_exception_reaches_the_handler_as_asyncio_reports_it(loop_type: type) -> None:
    # the lean loop runs a handle's callback inline: what it raises goes to the loop's exception
    # handler with asyncio's message, and the loop runs on
    seen: list[dict[str, Any]] = []

    def broken(n: int) -> None:
        raise ValueError(f"broken {n}")

    async def main() -> str:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: seen.append(context))
        handle = loop.call_soon(broken, 1)
        await asyncio.sleep(1.0)
        return "ran on" if handle is seen[0]["handle"] else "other handle"

    loop = loop_type()
    try:
        assert loop.run_until_complete(main()) == "ran on"
    finally:
        loop.close()
    name = "test_a_callback_s_exception_reaches_the_handler_as_asyncio_reports_it.<locals>.broken"
    assert [(c["message"].split(" at ")[0], str(c["exception"])) for c in seen] == [
        (f"Exception in callback {name}(1)", "broken 1")
    ]


def _agent_rows(
    slots: int, latency_s: float, sigma: float
) -> tuple[dict[str, list[dict[str, Any]]], list[Any]]:
    """Every row of a small simulated agent run (two arms, APRIL's aborts and resumed episodes
    included), and a log of the loop pass and clock of every tool answer and every next turn's
    submit: the tool slots few enough that calls queue for them."""
    from april_bench.experiment import run
    from april_bench.recipes import paper
    from april_bench.results.recorder import RunRecorder
    from april_bench.rollout.loop import RolloutConfig, RolloutLoop
    from april_bench.sim.agent_workload import ToolSandbox
    from april_bench.sim.paper_settings import AGENT_ROW

    log: list[Any] = []
    passes = [0]
    run_once, observation, submit = VirtualTimeLoop._run_once, ToolSandbox._observation, RolloutLoop.submit

    def counted(self: VirtualTimeLoop) -> None:
        passes[0] += 1
        run_once(self)

    def observed(self: ToolSandbox, state: Any, turn: int, *args: Any) -> Any:
        log.append(
            ("answer", passes[0], asyncio.get_running_loop().time(), state["uid"], state["sample"], turn)
        )
        return observation(self, state, turn, *args)

    def submitted(self: RolloutLoop, st: Any, flight: Any, sample: Any, priority: int) -> bool:
        log.append(("submit", passes[0], asyncio.get_running_loop().time(), sample.prompt.uid, sample.index))
        return submit(self, st, flight, sample, priority)

    workload = {
        **AGENT_ROW.workload_args(4.0, latency_s),
        "agent_tool_slots": slots,
        "agent_latency_sigma": sigma,
    }
    config = paper(
        "h100", model=AGENT_ROW.model, dataset=AGENT_ROW.dataset, algorithm="grpo", engine="sim",
        trainer="sim", steps=3, workload_args=workload, strategies=("sync", "april"),
        rollout=RolloutConfig(rollout_batch_size=8, n_samples_per_prompt=4, over_sampling_batch_size=16,
                              max_response_len=4096),
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VirtualTimeLoop, "_run_once", counted)
        patch.setattr(ToolSandbox, "_observation", observed)
        patch.setattr(RolloutLoop, "submit", submitted)
        rows = run(config, progress=False, recorder=RunRecorder()).recorder.rows()
    return rows, log


@pytest.mark.parametrize(("slots", "latency_s", "sigma"), [(2, 1.0, 0.0), (3, 0.5, 1.0), (32, 0.1, 0.0)])
def test_a_tool_call_through_step_then_runs_where_its_task_would(
    slots: int, latency_s: float, sigma: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same run with the environment's step_then (no task per call) and without it (a task per call
    # awaiting step): every tool answer and next turn in the same loop pass at the same clock, every
    # request, sample and step row the same.
    from april_bench.sim.agent_workload import ToolSandbox

    fast, fast_log = _agent_rows(slots, latency_s, sigma)
    monkeypatch.delattr(ToolSandbox, "step_then")
    tasks, tasks_log = _agent_rows(slots, latency_s, sigma)
    assert len(fast["requests"]) > 200 and sum(r["env_calls"] for r in fast["steps"]) > 100
    assert len(fast_log) > 300
    assert fast_log == tasks_log
    for table in ("requests", "samples", "steps", "trace"):
        if table == "steps":  # bookkeeping_s is real time
            strip = [{k: v for k, v in r.items() if k != "bookkeeping_s"} for r in fast[table]]
            assert strip == [{k: v for k, v in r.items() if k != "bookkeeping_s"} for r in tasks[table]]
        else:
            assert fast[table] == tasks[table], table


def test_the_inlined_decode_run_time_is_the_sum_it_replaces() -> None:
    # c * k + _sum_max_linear((ma + mb*S, mb*B), (ca + cb*S, cb*B), k), bit for bit, over batches on both
    # sides of the roofline's crossing and of the CUDA-graph ceiling
    from april_bench.engines.sim.cost import CostModel, _sum_max_linear
    from april_bench.profiles.hardware import hardware_profile
    from april_bench.profiles.models import MODELS

    rng = random.Random(7)
    for hw in ("h100", "mi300x"):
        cost = CostModel(hardware_profile(hw), MODELS.get("qwen3-4b"), tp=2)
        for _ in range(3000):
            batch, k = rng.randrange(1, 600), rng.randrange(1, 5000)
            context = batch * rng.randrange(1, 20000) + rng.random() * rng.choice([0, 1])
            c, ma, mb, ca, cb = cost._linear_terms(batch)
            old = c * k + _sum_max_linear((ma + mb * context, mb * batch), (ca + cb * context, cb * batch), k)
            assert cost.decode_run_time(batch, context, k) == old
