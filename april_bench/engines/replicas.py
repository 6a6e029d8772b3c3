"""Engine replicas behind one router that survives a replica's death.

:class:`ReplicaRouter` is the engine protocol over ``replicas`` engines (in-process engines, or Ray
actors through :class:`~april_bench.engines.ray_pool.RayReplica`), routed with
:class:`~april_bench.engines.routing.Router`.  What it adds is failure handling:

* **Detection.**  A replica is dead when its completion stream raises (the in-process engine's own
  error, a Ray actor that died), when a call to it (``abort``, ``load``, ``update_weights``) raises
  or does not return within ``health_timeout_s``, or when its health probe does: ``health()``
  (a replica declaring :data:`~april_bench.engines.protocol.HEALTH`: a server's ``/health``, a Ray
  actor's answer) or else ``load()``, every ``health_interval_s`` while requests are out.  A hung
  replica is dead.
* **Recovery, nothing lost.**  Each request the dead replica held is re-queued on a survivor under
  its own id, from what was received: its input ids, which carry the prompt and every token the
  rollout loop already holds for it (the engines here deliver a request's tokens when it finishes,
  so tokens the dead replica had decoded and not delivered are lost work, not lost prompts).  It
  goes at the front: its priority is below every priority seen (lower runs first), as APRIL resumes
  partial rollouts before new ones.  The survivor re-prefills its input: the events record those
  tokens.  The rollout loop sees one completion per request as always, so every strategy keeps its
  accounting exactly.
* **Restart.**  With ``on_failure=restart`` the dead replica is rebuilt in the background (up to
  ``max_restarts`` times in a run) and serves again only after it installed the current weights;
  with ``on_failure=continue`` the run goes on with the survivors.  When no replica is left the
  callers get :class:`~april_bench.engines.protocol.EngineLost` and the run ends as interrupted
  (``run --resume`` continues it from the last completed step).
* **Events.**  ``replica_failed``, ``requests_requeued`` (requests, re-prefilled tokens),
  ``replica_restarted``, ``replica_restart_failed``, ``replica_lost_all`` go to the callback given to
  :meth:`ReplicaRouter.watch_faults` (the arm session writes them to the events table).

**Chaos.**  :class:`FaultSchedule` kills (or hangs) replicas at delivered-token counts drawn from a
seed, never at wall-clock times, so a chaos run on the virtual clock is exactly repeatable; the
router calls the replica's ``kill()`` / ``hang()`` (it declares
:data:`~april_bench.engines.protocol.KILL`) and then detects the failure the ordinary way.  The
schedule's progress (tokens delivered, faults fired, the victims' draws) is part of the pool's
checkpoint state (:meth:`ReplicaRouter.chaos_state`), so a resumed run goes on counting where the
checkpoint left it: a fault that fired before the checkpoint does not fire again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from april_bench.config import BaseConfig, ConfigError, param
from april_bench.engines.protocol import (
    ACCOUNTING,
    HEALTH,
    KILL,
    SLEEP,
    STATE,
    Completion,
    Engine,
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineLost,
    EngineWork,
    FaultEvent,
    GenerateRequest,
    WeightUpdate,
)
from april_bench.engines.routing import Router
from april_bench.engines.stream import CompletionStream

__all__ = ["FaultOptions", "FaultSchedule", "ReplicaRouter", "RouterFront"]

ON_FAILURE = ("restart", "continue")
CHAOS_MODES = ("kill", "hang")


@dataclass(kw_only=True, slots=True, frozen=True)
class FaultOptions(BaseConfig):
    """How a replica pool detects and survives a dead replica, and its chaos schedule (tests)."""

    on_failure: str = param("restart", help="a dead replica: restart it, or continue on the survivors")
    max_restarts: int = param(8, help="replica restarts allowed in a run (then: continue on the survivors)")
    health_interval_s: float = param(5.0, help="seconds between health probes while requests are out")
    health_timeout_s: float = param(
        120.0, help="seconds a replica may take to answer a probe or call before it counts as dead"
    )
    chaos_seed: int | None = param(None, help="fault injection: the schedule's seed (None: no faults)")
    chaos_faults: int = param(1, help="fault injection: replicas to kill in the run")
    chaos_window_tokens: int = param(
        256, help="fault injection: faults fire at token counts drawn from 1..this many delivered tokens"
    )
    chaos_mode: str = param("kill", help=f"fault injection: {', '.join(CHAOS_MODES)} (hang: stop answering)")
    chaos_at_tokens: tuple[int, ...] = param(
        (), help="fault injection: fire at these delivered-token counts (not drawn ones; with chaos_seed)"
    )

    def __post_init__(self) -> None:
        if self.on_failure not in ON_FAILURE:
            raise ConfigError(f"--engine-arg on_failure must be one of {', '.join(ON_FAILURE)}")
        if self.chaos_mode not in CHAOS_MODES:
            raise ConfigError(f"--engine-arg chaos_mode must be one of {', '.join(CHAOS_MODES)}")
        for name in ("health_interval_s", "health_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--engine-arg {name} must be > 0, got {getattr(self, name)}")
        for name in ("max_restarts", "chaos_faults"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--engine-arg {name} must be >= 0, got {getattr(self, name)}")
        if any(t < 1 for t in self.chaos_at_tokens):
            raise ConfigError("--engine-arg chaos_at_tokens must be token counts >= 1")
        if self.chaos_window_tokens < 1:
            raise ConfigError("--engine-arg chaos_window_tokens must be >= 1")

    def schedule(self) -> FaultSchedule | None:
        if self.chaos_seed is None or self.chaos_faults == 0:
            return None
        if self.chaos_at_tokens:
            return FaultSchedule(tuple(sorted(self.chaos_at_tokens)), self.chaos_seed, self.chaos_mode)
        return FaultSchedule.seeded(
            self.chaos_seed, self.chaos_faults, self.chaos_window_tokens, self.chaos_mode
        )


#: The option names a pool takes for :class:`FaultOptions` (the rest go to its replicas' engine).


@dataclass(frozen=True, slots=True)
class FaultSchedule:
    """Faults at delivered-token counts (deterministic: no wall clock); the replica hit is drawn from
    the same seed among those alive when the fault fires."""

    at_tokens: tuple[int, ...]
    seed: int = 0
    mode: str = "kill"

    @classmethod
    def seeded(cls, seed: int, faults: int, window_tokens: int, mode: str = "kill") -> FaultSchedule:
        rng = random.Random(seed)
        return cls(tuple(sorted(rng.randint(1, window_tokens) for _ in range(faults))), seed, mode)


@dataclass(slots=True)
class _Tracked:
    request: GenerateRequest
    stream: CompletionStream
    replica: int


@dataclass(slots=True)
class _Slot:
    engine: Engine | None
    alive: bool = True
    #: Bumped on every failure and restart: deliveries of an older incarnation are ignored.
    generation: int = 0
    outstanding: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    restarting: asyncio.Task[None] | None = None


class ReplicaRouter:
    """The engine protocol over replicas built by ``make(i)`` (an unstarted engine for slot ``i``).
    ``info`` describes the engine the router serves as, its capabilities included: a pool in front of
    it passes its own."""

    def __init__(
        self,
        *,
        make: Callable[[int], Awaitable[Engine]],
        replicas: int,
        policy: str,
        faults: FaultOptions,
        info: EngineInfo,
    ) -> None:
        self._make = make
        self._faults = faults
        self._router = Router(policy, replicas)
        self._slots = [_Slot(engine=None) for _ in range(replicas)]
        self._tracked: dict[str, _Tracked] = {}
        self._info = info
        self._current: WeightUpdate | None = None
        self._front = 0  # the priority re-queued requests get: below every priority seen
        self._delivered_tokens = 0
        self._schedule = faults.schedule()
        self._fired = 0
        self._hit: set[tuple[int, int]] = set()
        self._rng = random.Random(self._schedule.seed if self._schedule else 0)
        self._restarts = 0
        self._retired = EngineWork()
        self._lost: EngineLost | None = None
        self._busy = asyncio.Event()
        self._monitor: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._watchers: list[Callable[[FaultEvent], None]] = []
        #: ``(slot, generation)`` of the replicas put to sleep (``--colocate``), to wake.
        self._sleeping: set[tuple[int, int]] = set()

    @property
    def info(self) -> EngineInfo:
        return self._info

    def describe(self, **changes: Any) -> None:
        """Fill in what the pool learns once its replicas started (their weight formats, version)."""
        self._info = dataclasses.replace(self._info, **changes)

    @property
    def alive(self) -> list[bool]:
        return [s.alive for s in self._slots]

    def watch_faults(self, callback: Callable[[FaultEvent], None]) -> None:
        self._watchers.append(callback)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> EngineInfo:
        """Start every replica; returns the first replica's info."""
        engines = await asyncio.gather(*(self._make(i) for i in range(len(self._slots))))
        for slot, engine in zip(self._slots, engines, strict=True):
            slot.engine = engine
        self._monitor = asyncio.ensure_future(self._watch())
        return engines[0].info

    async def close(self) -> None:
        for task in [self._monitor, *(s.restarting for s in self._slots)]:
            if task is not None:
                task.cancel()
        # dead replicas still being stopped (bounded by health_timeout_s): their processes must end
        await asyncio.gather(*self._background, return_exceptions=True)
        for slot in self._slots:
            for task in slot.tasks:
                task.cancel()
        engines = [s.engine for s in self._slots if s.engine is not None and s.alive]
        await asyncio.gather(*(self._bounded(e.close()) for e in engines), return_exceptions=True)
        self._monitor = None

    # ------------------------------------------------------------ requests
    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        if self._lost is not None:
            raise self._lost
        stream = CompletionStream(len(requests))
        for req in requests:
            self._front = min(self._front, req.priority - 1)
        self._submit([_Tracked(req, stream, -1) for req in requests])
        return stream

    def _submit(self, tracked: list[_Tracked]) -> None:
        alive = self.alive
        outstanding = [s.outstanding for s in self._slots]
        shares: dict[int, list[GenerateRequest]] = {}
        for t in tracked:
            i = self._router.route(t.request.routing_key, outstanding, alive)
            outstanding[i] += 1
            self._slots[i].outstanding += 1
            t.replica = i
            self._tracked[t.request.request_id] = t
            shares.setdefault(i, []).append(t.request)
        for i, share in shares.items():
            slot = self._slots[i]
            assert slot.engine is not None
            try:
                sub = slot.engine.generate(share)
            except Exception as exc:
                self._failed(i, slot.generation, f"generate raised {type(exc).__name__}: {exc}")
                continue
            task = asyncio.ensure_future(self._consume(i, slot.generation, sub))
            slot.tasks.add(task)
            task.add_done_callback(slot.tasks.discard)
        if self._tracked:
            self._busy.set()

    async def _consume(self, i: int, generation: int, sub: AsyncIterator[Completion]) -> None:
        try:
            async for completion in sub:
                self._deliver(i, generation, completion)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(i, generation, f"{type(exc).__name__}: {exc}")

    def _deliver(self, i: int, generation: int, c: Completion) -> None:
        slot = self._slots[i]
        tracked = self._tracked.get(c.request_id)
        if generation != slot.generation or tracked is None or tracked.replica != i:
            return  # from a replica declared dead, for a request re-queued elsewhere
        del self._tracked[c.request_id]
        slot.outstanding -= 1
        if not self._tracked:
            self._busy.clear()
        self._delivered_tokens += c.num_tokens
        tracked.stream.deliver(dataclasses.replace(c, replica=i))
        self._maybe_inject()

    # ------------------------------------------------------------ failure
    def _failed(self, i: int, generation: int, reason: str) -> None:
        """Replica ``i`` (incarnation ``generation``) is dead: re-queue its requests, restart it."""
        slot = self._slots[i]
        if generation != slot.generation or not slot.alive:
            return
        slot.alive = False
        slot.generation += 1
        slot.outstanding = 0
        current = asyncio.current_task()
        for task in slot.tasks:
            if task is not current:
                task.cancel()
        dead, slot.engine = slot.engine, None
        if dead is not None and (counted := ACCOUNTING.of(dead)):  # its work stays counted after it is gone
            self._retired = _plus(self._retired, counted.work())
        if dead is not None:
            self._spawn(self._release(dead))
        lost = [t for t in self._tracked.values() if t.replica == i]
        self._event("replica_failed", i, requests=len(lost), detail=reason)
        survivors = [j for j, s in enumerate(self._slots) if s.alive]
        if not survivors:  # the last replica: nothing can take its requests, the run cannot go on
            self._lose_all(f"replica {i} failed ({reason}) and no other replica is serving")
            return
        if self._faults.on_failure == "restart" and self._restarts < self._faults.max_restarts:
            self._restarts += 1
            slot.restarting = asyncio.ensure_future(self._restart(i))
        for t in lost:
            del self._tracked[t.request.request_id]
            # prefix_len = its whole input: the survivor computes again what the dead replica had
            # computed, so an engine that counts its work (EngineAccounting) counts it as re-prefill
            t.request = dataclasses.replace(t.request, priority=self._front, prefix_len=t.request.input_len)
        if lost:
            self._event(
                "requests_requeued",
                i,
                requests=len(lost),
                tokens=sum(t.request.input_len for t in lost),
                detail=f"re-prefilled on replicas {sorted({*survivors})}",
            )
            self._submit(lost)

    def _lose_all(self, reason: str) -> None:
        self._lost = EngineLost(f"{self._info.name}: {reason}")
        self._event("replica_lost_all", -1, requests=len(self._tracked), detail=reason)
        for t in list(self._tracked.values()):
            t.stream.fail(self._lost)
        self._tracked.clear()
        for slot in self._slots:
            if slot.restarting is not None:
                slot.restarting.cancel()

    async def _restart(self, i: int) -> None:
        slot = self._slots[i]
        try:
            engine = await self._make(i)
            installed: int | None = None
            while self._current is not None and installed != self._current.version:
                update = self._current
                await asyncio.wait_for(engine.update_weights(update), self._faults.health_timeout_s)
                installed = update.version
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._event("replica_restart_failed", i, detail=f"{type(exc).__name__}: {exc}")
            return
        finally:
            slot.restarting = None
        slot.engine = engine
        slot.alive = True
        weights = "starting weights" if installed is None else f"weights version {installed}"
        self._event("replica_restarted", i, detail=weights)

    async def _watch(self) -> None:
        """Probe every live replica every ``health_interval_s`` while requests are out."""
        while True:
            await self._busy.wait()
            await asyncio.sleep(self._faults.health_interval_s)
            await asyncio.gather(*(self._probe(i) for i, s in enumerate(self._slots) if s.alive))

    async def _probe(self, i: int) -> None:
        slot = self._slots[i]
        engine, generation = slot.engine, slot.generation
        assert engine is not None
        checked = HEALTH.of(engine)
        probe: Awaitable[Any] = checked.health() if checked else engine.load()
        with contextlib.suppress(EngineError):
            await self._call(i, generation, "health check", probe)

    async def _call(self, i: int, generation: int, what: str, call: Awaitable[Any]) -> Any:
        """``call`` on replica ``i``, bounded by ``health_timeout_s``; a failure marks it dead and
        raises :class:`EngineError` (the caller skips the replica)."""
        try:
            return await asyncio.wait_for(call, self._faults.health_timeout_s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            reason = f"{what}: no answer within {self._faults.health_timeout_s:g} s (hung)"
        except Exception as exc:
            reason = f"{what}: {type(exc).__name__}: {exc}"
        self._failed(i, generation, reason)
        raise EngineError(reason)

    async def _each(
        self, what: str, fn: Callable[[Engine], Awaitable[Any]], only: set[tuple[int, int]] | None = None
    ) -> list[Any]:
        """``fn`` on every live replica (of the ``(slot, generation)`` pairs ``only``, when given); the
        answers of those that answered."""
        live = [
            (i, s.generation, s.engine)
            for i, s in enumerate(self._slots)
            if s.alive and s.engine and (only is None or (i, s.generation) in only)
        ]
        answers = await asyncio.gather(
            *(self._call(i, g, what, fn(e)) for i, g, e in live), return_exceptions=True
        )
        if self._lost is not None:
            raise self._lost
        return [a for a in answers if not isinstance(a, BaseException)]

    def _maybe_inject(self) -> None:
        schedule = self._schedule
        while schedule is not None and self._fired < len(schedule.at_tokens):
            if self._delivered_tokens < schedule.at_tokens[self._fired]:
                return
            # one fault per incarnation: a replica already hit counts as gone even before it is found
            # A chaos schedule tests survival: it leaves one replica standing (a one-replica pool
            # excepted) and waits for a restart when only one is left.
            live = [i for i, s in enumerate(self._slots) if s.alive and (i, s.generation) not in self._hit]
            if len(live) < (2 if len(self._slots) > 1 else 1):
                return
            self._fired += 1
            victim = self._rng.choice(live)
            self._hit.add((victim, self._slots[victim].generation))
            engine = self._slots[victim].engine
            killable = None if engine is None else KILL.of(engine)
            if killable is None:
                raise EngineError(f"fault injection: replica {victim} ({engine}) cannot be killed")
            self._event("fault_injected", victim, tokens=self._delivered_tokens, detail=schedule.mode)
            self._spawn(killable.kill() if schedule.mode == "kill" else killable.hang())

    # ------------------------------------------------------------ the rest of the protocol
    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        wanted = None if request_ids is None else list(request_ids)
        await self._each("abort", lambda e: e.abort(wanted))

    async def load(self) -> EngineLoad:
        loads: list[EngineLoad] = await self._each("load", lambda e: e.load())
        running = sum(x.running for x in loads)
        waiting = sum(x.waiting for x in loads)
        # delivered by a replica, not yet here; or re-queued and not landed yet: still in flight
        undelivered = len(self._tracked) - running - waiting
        return EngineLoad(
            running=running,
            waiting=waiting + max(0, undelivered),
            kv_tokens_used=_total(loads, "kv_tokens_used"),
            kv_tokens_capacity=_total(loads, "kv_tokens_capacity"),
        )

    async def update_weights(self, update: WeightUpdate) -> None:
        """The same update on every live replica; a restarting replica installs it before it serves."""
        self._current = update
        await self._each("update_weights", lambda e: e.update_weights(update))
        self._router.forget_prefixes()

    def remember(self, update: WeightUpdate) -> None:
        """``update`` reached every replica some other way (a weight group's broadcast): a restarting
        replica installs it before it serves, and cached prefixes are stale."""
        self._current = update
        self._router.forget_prefixes()

    async def sleep(self, level: int) -> None:
        """Every live replica releases its memory (``--colocate``); a replica that cannot sleep is an
        error, not a replica failure: colocation was asked of an engine without it."""
        self._check_sleepers()
        self._sleeping = {(i, s.generation) for i, s in enumerate(self._slots) if s.alive and s.engine}
        await self._each("sleep", lambda e: _sleepable(e).sleep(level))

    async def wake_up(self) -> None:
        """Wake the replicas that went to sleep (one restarted since came up awake)."""
        asleep, self._sleeping = self._sleeping, set()
        await self._each("wake_up", lambda e: _sleepable(e).wake_up(), only=asleep)

    def _check_sleepers(self) -> None:
        for i, slot in enumerate(self._slots):
            if slot.alive and slot.engine is not None and SLEEP.of(slot.engine) is None:
                raise EngineError(f"replica {i} ({slot.engine.info.name}) cannot release its memory (sleep)")

    def work(self) -> EngineWork | None:
        """Every replica's work counters summed, the dead ones' up to their failure (``None`` when a
        replica does not count its work)."""
        total = self._retired
        for slot in self._slots:
            if slot.engine is None:
                continue
            counted = ACCOUNTING.of(slot.engine)
            if counted is None:
                return None
            total = _plus(total, counted.work())
        return total

    def export_state(self) -> dict[str, Any]:
        """The replicas' own states (a resumed run continues them), the current weights' version and
        the chaos schedule's progress."""
        return {
            "version": None if self._current is None else self._current.version,
            "replicas": [
                state.export_state()
                if s.alive and s.engine is not None and (state := STATE.of(s.engine))
                else None
                for s in self._slots
            ],
            "chaos": self.chaos_state(),
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        if state["version"] is not None and self._current is None:
            self._current = WeightUpdate(version=state["version"])  # what a restarted replica installs
        for slot, saved in zip(self._slots, state["replicas"], strict=True):
            if saved is not None and slot.engine is not None and (engine := STATE.of(slot.engine)):
                engine.restore_state(saved)
        self.restore_chaos(state.get("chaos"))

    def chaos_state(self) -> dict[str, Any] | None:
        """Where the chaos schedule stands (JSON): tokens delivered, faults fired, the victims' random
        state.  ``None`` without a schedule."""
        if self._schedule is None:
            return None
        version, internal, gauss = self._rng.getstate()
        return {
            "delivered_tokens": self._delivered_tokens,
            "fired": self._fired,
            "rng": [version, list(internal), gauss],
        }

    def restore_chaos(self, state: dict[str, Any] | None) -> None:
        """A resumed run's schedule goes on from the checkpoint: the faults already fired stay fired."""
        if state is None or self._schedule is None:
            return
        self._delivered_tokens = int(state["delivered_tokens"])
        self._fired = int(state["fired"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    def record(self, kind: str, replica: int, detail: str) -> None:
        """An event of the pool's own (``replica_placed``: where a replica started) for the watchers."""
        self._event(kind, replica, detail=detail)

    # ------------------------------------------------------------ helpers
    def _event(self, kind: str, replica: int, **fields: Any) -> None:
        event = FaultEvent(kind=kind, t=asyncio.get_running_loop().time(), replica=replica, **fields)
        for watcher in self._watchers:
            watcher(event)

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, dead: Engine) -> None:
        """Free what a dead replica holds (its process, its GPU, its placement bundle): killed first
        when it can be (a hung one never answers a polite close), then closed, each bounded."""
        if killable := KILL.of(dead):
            await self._bounded(killable.kill())
        await self._bounded(dead.close())

    async def _bounded(self, call: Awaitable[Any]) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(call, self._faults.health_timeout_s)


def _sleepable(engine: Engine) -> Any:
    sleeper = SLEEP.of(engine)
    assert sleeper is not None  # _check_sleepers ran
    return sleeper


def _plus(a: EngineWork, b: EngineWork) -> EngineWork:
    return EngineWork(
        engine_iterations=a.engine_iterations + b.engine_iterations,
        decode_iterations=a.decode_iterations + b.decode_iterations,
        decode_tokens=a.decode_tokens + b.decode_tokens,
        prefill_tokens=a.prefill_tokens + b.prefill_tokens,
        reprefill_tokens=a.reprefill_tokens + b.reprefill_tokens,
        deterministic=a.deterministic and b.deterministic,
    )


def _total(loads: Sequence[EngineLoad], name: str) -> int | None:
    values = [getattr(x, name) for x in loads]
    return None if not values or any(v is None for v in values) else sum(values)


class RouterFront:
    """The engine members a replica pool answers by asking its :class:`ReplicaRouter` (``self._router``,
    set by the pool's constructor); a pool adds how its replicas are made and placed."""

    _router: ReplicaRouter

    @property
    def info(self) -> EngineInfo:
        return self._router.info

    @property
    def router(self) -> ReplicaRouter:
        return self._router

    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        return self._router.generate(requests)

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        await self._router.abort(request_ids)

    async def load(self) -> EngineLoad:
        return await self._router.load()

    async def update_weights(self, update: WeightUpdate) -> None:
        await self._router.update_weights(update)

    def watch_faults(self, callback: Callable[[FaultEvent], None]) -> None:
        self._router.watch_faults(callback)
