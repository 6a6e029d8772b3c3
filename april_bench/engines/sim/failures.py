"""Replica failures in the simulator: what a dead engine costs each strategy.

The measured pools (:mod:`april_bench.engines.replicas`) survive a dead replica by re-queueing its
requests on the survivors; this module gives ``--engine sim`` the same behaviour on the virtual clock,
so ``ablate`` and ``whatif`` can price failures per strategy:

* **When.**  ``failure_at_s=[t, ...]`` (a trace: virtual seconds since the run started) and/or
  ``failure_rate_per_hour=R`` (a Poisson process of ``R`` failures per replica-hour over the pool,
  drawn from ``failure_seed``).  Every failure time is a pure function of the options, never of what
  the run did, and the replica hit by failure ``k`` is drawn from ``(failure_seed, k)`` among the
  replicas up at that moment: a resumed run, which continues on the same virtual clock, meets the
  failures after its checkpoint again and none of those before it.
* **What is lost.**  Every request the replica held (waiting, being prefilled, decoding): the tokens
  it decoded there are lost (the simulated engines deliver a request's tokens when it finishes, as the
  measured ones do), and its input (prompt plus any partial the rollout loop holds) is prefilled again
  on a survivor, where it goes to the front of the queue (``requests_requeued``).  A request whose
  abort was already asked is returned by the survivor at once with nothing, as an abort of a queued
  request is.
* **Restart.**  The replica is down for ``restart_s`` (process start and model load) plus the weight
  sync time (:meth:`~april_bench.engines.sim.engine.SimEngine.weight_sync_time`: it installs the current
  weights), then serves again (``replica_restarted``).  When no replica is up, re-queued and new
  requests wait for the first one back: the step stalls.
* **Events.**  The engine reports ``replica_failed`` (``requests``: those it held; ``tokens``: their
  lost decode), ``requests_requeued`` (``tokens``: the re-prefill) and ``replica_restarted``, as the
  replica pools do (:class:`~april_bench.engines.protocol.FaultReport`); the run's summary sums them
  per arm (:mod:`april_bench.results.faults`).

The failure clock is armed only while requests are out (a failure due while the engine is idle, during
training or weight sync, fires when the next requests arrive, at its own time): a pending failure
never keeps an otherwise deadlocked simulation advancing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from april_bench.config import ConfigError
from april_bench.engines.protocol import FaultEvent, GenerateRequest
from april_bench.engines.sim.cost import CostModel
from april_bench.engines.sim.cost_curve import MeasuredCost
from april_bench.engines.sim.replica import ReplicaSettings, SimReplica
from april_bench.engines.sim.speculative import SpeculativeCost

__all__ = ["MAX_FAILURE_RATE_PER_HOUR", "FailurePlan", "SimFailures", "SimPool", "check_failure_options"]


#: More failures per replica-hour than this (one every 3.6 s) leave no replica up between restarts:
#: a what-if of that says nothing, and a rate like 1e9 would simulate failures forever.
MAX_FAILURE_RATE_PER_HOUR = 1000.0


def check_failure_options(rate_per_hour: float, at_s: Sequence[float], restart_s: float) -> None:
    if not rate_per_hour >= 0:  # NaN fails too
        raise ConfigError(f"--engine-arg failure_rate_per_hour must be >= 0, got {rate_per_hour}")
    if rate_per_hour > MAX_FAILURE_RATE_PER_HOUR:
        raise ConfigError(
            f"--engine-arg failure_rate_per_hour (whatif --failure-rate) must be <= "
            f"{MAX_FAILURE_RATE_PER_HOUR:g} failures per replica-hour (no replica would stay up), "
            f"got {rate_per_hour}"
        )
    if any(not t >= 0 for t in at_s):
        raise ConfigError("--engine-arg failure_at_s must be virtual seconds >= 0")
    if not restart_s >= 0:
        raise ConfigError(f"--engine-arg restart_s must be >= 0, got {restart_s}")


@dataclass(frozen=True, slots=True)
class FailurePlan:
    """When replicas fail: a trace of times, a seeded Poisson rate, or both (merged in time order)."""

    replicas: int
    at_s: tuple[float, ...] = ()
    rate_per_hour: float = 0.0
    seed: int = 0
    restart_s: float = 60.0

    @property
    def active(self) -> bool:
        return bool(self.at_s) or self.rate_per_hour > 0

    def times(self) -> Iterator[float]:
        """Failure times in order (infinite with a rate): a pure function of the plan."""
        trace = iter(sorted(self.at_s))
        poisson = self._poisson()
        a, b = next(trace, None), next(poisson, None)
        while a is not None or b is not None:
            if b is None or (a is not None and a <= b):
                assert a is not None
                yield a
                a = next(trace, None)
            else:
                yield b
                b = next(poisson, None)

    def _poisson(self) -> Iterator[float]:
        if self.rate_per_hour <= 0:
            return
        rng = random.Random(f"failure-times-{self.seed}")
        per_s = self.rate_per_hour * self.replicas / 3600.0
        t = 0.0
        while True:
            t += rng.expovariate(per_s)
            yield t

    def victim(self, k: int, up: Sequence[int]) -> int:
        """The replica failure ``k`` hits, among those ``up``: drawn from ``(seed, k)`` alone."""
        return random.Random(f"failure-victim-{self.seed}-{k}").choice(list(up))


class SimPool(Protocol):
    """What the failure model needs of the engine (:class:`~april_bench.engines.sim.engine.SimEngine`)."""

    cost: CostModel | MeasuredCost | SpeculativeCost
    settings: ReplicaSettings

    @property
    def replicas(self) -> list[SimReplica]: ...

    @property
    def tasks(self) -> list[asyncio.Task[None]]: ...

    @property
    def version_cell(self) -> list[int]: ...

    @property
    def version(self) -> int: ...

    def weight_sync_time(self) -> float: ...

    def route(self, req: GenerateRequest, alive: Sequence[bool]) -> int: ...


class SimFailures:
    """Fails, re-queues and restarts the replicas of one simulated engine on its virtual clock."""

    def __init__(self, engine: SimPool, plan: FailurePlan) -> None:
        self.engine = engine
        self.plan = plan
        self._times = plan.times()
        self._next: float | None = next(self._times, None)
        self._k = 0  # failures fired (or skipped: before a resumed run's clock)
        self._timer: asyncio.TimerHandle | None = None
        self.down: list[bool] = [False] * plan.replicas
        self.back_at: list[float] = [0.0] * plan.replicas  # when a down replica serves again
        self._watchers: list[Callable[[FaultEvent], None]] = []
        self.retired_passes = 0  # forward passes of replicas that died

    def watch(self, callback: Callable[[FaultEvent], None]) -> None:
        self._watchers.append(callback)

    def start(self) -> None:
        """At the engine's start: failures before the clock's present (a resumed run's checkpoint
        time) happened in the part of the run already done."""
        now = asyncio.get_running_loop().time()
        while self._next is not None and self._next < now:
            self._advance()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def alive(self) -> list[bool]:
        return [not d for d in self.down]

    def route(self, request: GenerateRequest) -> int:
        """The replica for ``request``: among those up, or the first one back when none is."""
        if all(self.down):
            return min(range(len(self.down)), key=lambda i: self.back_at[i])
        return self.engine.route(request, self.alive())

    def export_state(self) -> dict[str, Any]:
        """Between steps: the replicas still down and when each serves again (a resumed run keeps them
        down as long as the uninterrupted run would)."""
        return {"back_at": {str(i): self.back_at[i] for i, d in enumerate(self.down) if d}}

    def restore_state(self, state: dict[str, Any]) -> None:
        now = asyncio.get_running_loop().time()
        for key, back in state.get("back_at", {}).items():
            i = int(key)
            if back <= now:
                continue
            self.engine.tasks[i].cancel()
            fresh = SimReplica(i, self.engine.cost, self.engine.settings, self.engine.version_cell)
            self.engine.replicas[i] = fresh
            self.down[i], self.back_at[i] = True, back
            self.engine.tasks[i] = asyncio.ensure_future(self._restart(fresh, back - now))

    # ------------------------------------------------------------ the clock
    def catch_up(self) -> None:
        """Before requests go out: fire the failures already due (they happened while the engine
        idled; the replicas hit may be back already)."""
        now = asyncio.get_running_loop().time()
        while self._next is not None and self._next <= now:
            self._fire(self._next)

    def arm(self) -> None:
        """Requests are out: set the timer for the next failure."""
        if self._timer is None and self._next is not None and self._busy():
            self._timer = asyncio.get_running_loop().call_at(self._next, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.catch_up()  # the failure due now (unless generate() already fired it), and any at the same time
        self.arm()

    def _busy(self) -> bool:
        return any(r.outstanding for r in self.engine.replicas)

    def _advance(self) -> None:
        self._k += 1
        self._next = next(self._times, None)

    # ------------------------------------------------------------ a failure
    def _fire(self, at: float) -> None:
        k = self._k
        self._advance()
        up = [i for i, d in enumerate(self.down) if not d]
        if not up:
            return  # every replica is down already: nothing more to lose
        self.fail(self.plan.victim(k, up), at)

    def fail(self, i: int, at: float) -> None:
        """Replica ``i`` dies at virtual time ``at`` (now, or earlier while the engine idled)."""
        engine = self.engine
        loop = asyncio.get_running_loop()
        old = engine.replicas[i]
        self.retired_passes += old.D + old.extends
        lost = old.fail()
        engine.tasks[i].cancel()
        self.down[i] = True
        fresh = SimReplica(i, engine.cost, engine.settings, engine.version_cell)
        engine.replicas[i] = fresh
        back = self.back_at[i] = at + self.plan.restart_s + engine.weight_sync_time()
        engine.tasks[i] = asyncio.ensure_future(self._restart(fresh, max(0.0, back - loop.time())))
        self._event(
            "replica_failed",
            at,
            i,
            requests=len(lost),
            tokens=sum(decoded for _, _, decoded, _ in lost),
            detail=f"simulated failure {self._k}; back at t={back:.1f} s",
        )
        if not lost:
            return
        up = [j for j, d in enumerate(self.down) if not d]
        for request, stream, _, aborted in reversed(lost):  # front of the queue, in their order
            target = engine.replicas[self.route(request)]
            target.submit(request, stream, front=True)
            if aborted:
                target.request_abort({request.request_id})
        self._event(
            "requests_requeued",
            at,
            i,
            requests=len(lost),
            tokens=sum(request.input_len for request, _, _, _ in lost),
            detail="re-prefilled on " + (f"replicas {up}" if up else "the first replica back (none was up)"),
        )

    async def _restart(self, replica: SimReplica, delay: float) -> None:
        await asyncio.sleep(delay)
        self.down[replica.index] = False
        self._event("replica_restarted", None, replica.index, detail=f"weights version {self.engine.version}")
        await replica.run()

    def _event(self, kind: str, at: float | None, replica: int, **fields: Any) -> None:
        t = asyncio.get_running_loop().time() if at is None else at
        event = FaultEvent(kind=kind, t=t, replica=replica, **fields)
        for watcher in self._watchers:
            watcher(event)
