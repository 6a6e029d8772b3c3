"""A deterministic fake engine for tests and strategy experiments.

Every running request emits one token every ``token_time_s`` seconds of the
loop's clock, independent of batch size, so schedules are exact and easy to
write down by hand.  Token ids are a pure function of the request's first
input ids and the absolute position, so a resumed request continues with
exactly the tokens an uninterrupted one would have produced.

Abort follows SGLang: a running request finishes the token it is decoding and
returns with it; a queued request returns at once with nothing.  Requests reach
the engine ``landing_delays`` after ``generate()`` (a stand-in for HTTP
transit): one that lands after an abort runs on until aborted again, the race
the rollout loop's re-abort exists for.

Its work counters (:class:`~april_bench.engines.protocol.EngineWork`) treat it as
an engine that steps all running requests together: an engine iteration is an
instant at which some running request completes a token, so requests decoding
in step share iterations and a lone straggler costs one iteration per token.
A request is prefilled when it starts running (a queued request aborted before
it starts never is).

A weight update with requests in flight pauses decoding for ``weight_sync_s``:
the tokens a running request completed before the update carry the old
version, the one it was decoding is recomputed after the pause with the new
weights, and so are the rest; requests that land during the pause wait for it,
and an abort issued during it takes effect when it ends.

It holds old weight versions (:class:`~april_bench.engines.protocol.WeightVersions`): a request
naming one (``policy_version``) carries that version on every token, an update leaves it alone,
and a resumed partial on its own version prefills only its last input token (its KV is kept).

It sleeps as a colocated engine does (:class:`~april_bench.engines.protocol.Sleepable`, what
``--colocate`` asks of vLLM and SGLang): ``sleep(level)`` with nothing in flight takes ``switch_s``
and records the call in :attr:`FakeEngine.switches`; until ``wake_up()`` (``switch_s`` again)
``generate`` raises, and after a level-2 sleep (weights dropped) it raises until the next weight
update.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.protocol import (
    ACCOUNTING,
    SATURATION,
    SLEEP,
    STATE,
    VERSIONS,
    Completion,
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineWork,
    GenerateRequest,
    WeightUpdate,
)
from april_bench.engines.stream import CompletionStream
from april_bench.types import FinishReason

__all__ = ["FakeEngine", "fake_token"]

VOCAB = 1000


def fake_token(seed: int, position: int) -> int:
    """The token a fake engine emits at ``position`` of a sequence whose first id is ``seed``."""
    return (seed * 7919 + position * 104729) % VOCAB


@dataclass(slots=True)
class _Request:
    request: GenerateRequest
    stream: CompletionStream
    target: int
    reason: FinishReason
    start: float = 0.0
    handle: asyncio.TimerHandle | None = None
    aborted: bool = False
    #: ``(version, tokens)`` generated before each weight update that landed while it ran.
    runs: list[tuple[int, int]] = field(default_factory=list)
    #: When its first token came, if before a weight update moved ``start``.
    first: float | None = None


class FakeEngine(Configurable):
    """One token per ``token_time_s`` per running request; exact, seeded, instant to run."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        token_time_s: float = param(1.0, help="seconds per generated token, per request")
        max_running: int | None = param(None, help="concurrent requests; the rest queue (None: unlimited)")
        landing_delays: tuple[float, ...] = param(
            (0.0,), help="seconds from submit to landing, cycled over requests in submission order"
        )
        default_len: int = param(16, help="response length when a request has no replayed length")
        weight_sync_s: float = param(0.0, help="seconds update_weights takes")
        switch_s: float = param(0.0, help="seconds a sleep and a wake-up each take (--colocate)")

        def __post_init__(self) -> None:
            if self.token_time_s <= 0:
                raise ConfigError("token_time_s must be > 0")
            if self.max_running is not None and self.max_running < 1:
                raise ConfigError("max_running must be >= 1 or None")
            if not self.landing_delays or min(self.landing_delays) < 0:
                raise ConfigError("landing_delays needs at least one delay, all >= 0")
            if self.switch_s < 0:
                raise ConfigError("switch_s must be >= 0")

    def __init__(self, config: Config) -> None:
        self.config = config
        self.version = 0
        self._running: dict[str, _Request] = {}
        self._queued: deque[_Request] = deque()
        self._submitted = 0
        self._info = EngineInfo(
            name="fake",
            simulated=True,
            produces_tokens=True,
            virtual_time=True,
            capabilities=frozenset({ACCOUNTING, STATE, SATURATION, VERSIONS, SLEEP}),
        )
        #: Every sleep and wake-up, in order: ``("sleep", level)`` / ``("wake_up", None)``.
        self.switches: list[tuple[str, int | None]] = []
        #: The level it sleeps at (``None``: awake); whether a level-2 sleep dropped its weights.
        self.asleep: int | None = None
        self._weights_dropped = False
        #: Old weight versions held, and those the loop asked to keep for requests still to come.
        self._held: set[int] = set()
        self._retained: set[int] = set()
        #: Set while no update is in progress; requests landing and aborts wait for it.
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._landing: list[_Request] = []
        # token instants (in units of 1e-6 token times) of returned requests not yet final, and the
        # count of those that are: no request still to return can complete a token before them
        self._instants: set[int] = set()
        self._instant_heap: list[int] = []
        self._final_instants = 0
        self._work = {"decode_tokens": 0, "prefill_tokens": 0, "reprefill_tokens": 0}

    @property
    def info(self) -> EngineInfo:
        return self._info

    async def start(self) -> None:
        """Nothing to start: the fake engine is a schedule in this process."""

    async def close(self) -> None:
        """Nothing to release."""

    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        if self.asleep is not None:
            raise EngineError(f"the fake engine is asleep (level {self.asleep}): wake_up() before generating")
        if self._weights_dropped:
            raise EngineError("the fake engine dropped its weights in a level-2 sleep: update_weights first")
        stream = CompletionStream(len(requests))
        loop = asyncio.get_running_loop()
        for req in requests:
            if req.policy_version is not None and req.policy_version not in (self.version, *self._held):
                raise EngineError(
                    f"{req.request_id}: weight version {req.policy_version} is not held (current "
                    f"{self.version}, old {sorted(self._held)}); retain_versions it before the update"
                )
        for req in requests:
            target, reason = req.max_new_tokens, FinishReason.LENGTH
            wanted = req.replay_len if req.replay_len is not None else self.config.default_len
            if wanted <= target:
                target, reason = wanted, FinishReason.STOP
            entry = _Request(req, stream, target, reason)
            delays = self.config.landing_delays
            delay = delays[self._submitted % len(delays)]
            self._submitted += 1
            if delay > 0:
                loop.call_later(delay, self._land, entry)
            else:
                self._land(entry)
        return stream

    def _land(self, entry: _Request) -> None:
        if not self._unpaused.is_set():
            self._landing.append(entry)  # lands when the update ends
            return
        if self.config.max_running is None or len(self._running) < self.config.max_running:
            self._start(entry)
        else:
            self._queued.append(entry)

    def _start(self, entry: _Request) -> None:
        loop = asyncio.get_running_loop()
        entry.start = loop.time()
        req = entry.request
        # a partial resumed on its own version keeps its KV: only the last input token is computed
        prefill = 1 if req.prefix_len > 0 and req.policy_version is not None else req.input_len
        self._work["prefill_tokens"] += prefill
        if req.prefix_len > 0:
            self._work["reprefill_tokens"] += prefill
        self._running[entry.request.request_id] = entry
        entry.handle = loop.call_at(
            entry.start + entry.target * self.config.token_time_s, self._finish, entry
        )

    def _finish(self, entry: _Request) -> None:
        del self._running[entry.request.request_id]
        self._deliver(entry, entry.reason)
        if self._queued and (self.config.max_running is None or len(self._running) < self.config.max_running):
            self._start(self._queued.popleft())

    def _deliver(self, entry: _Request, reason: FinishReason) -> None:
        loop = asyncio.get_running_loop()
        n = entry.target
        dt = self.config.token_time_s
        req = entry.request
        seed = req.input_ids[0] if req.input_ids else 0
        first = req.input_len
        self._count_tokens(entry, n, loop.time())
        runs = None
        if entry.runs:
            before = sum(k for _, k in entry.runs)
            runs = (*entry.runs, (self.version, n - before)) if n > before else tuple(entry.runs)
        entry.stream.deliver(
            Completion(
                request_id=req.request_id,
                num_tokens=n,
                finish_reason=reason,
                policy_version=self.version if req.policy_version is None else req.policy_version,
                version_runs=runs,
                t_done=loop.time(),
                t_first_token=entry.first if entry.first is not None else entry.start + dt if n else None,
                output_ids=tuple(fake_token(seed, first + i) for i in range(n)),
                logprobs=tuple(-0.1 * (1 + (first + i) % 7) for i in range(n)),
            )
        )

    def _count_tokens(self, entry: _Request, n: int, now: float) -> None:
        dt = self.config.token_time_s
        self._work["decode_tokens"] += n
        for i in range(1, n + 1):
            instant = round((entry.start + i * dt) / dt * 1e6)
            if instant not in self._instants:
                self._instants.add(instant)
                heapq.heappush(self._instant_heap, instant)
        live = [e.start for e in self._running.values()] + [now]
        floor = round(min(live) / dt * 1e6)
        while self._instant_heap and self._instant_heap[0] < floor:
            self._instants.discard(heapq.heappop(self._instant_heap))
            self._final_instants += 1

    def work(self) -> EngineWork:
        """Exact counts of the returned requests' work (the fake runs on a virtual clock)."""
        iterations = self._final_instants + len(self._instants)
        return EngineWork(
            engine_iterations=iterations,
            decode_iterations=iterations,
            decode_tokens=self._work["decode_tokens"],
            prefill_tokens=self._work["prefill_tokens"],
            reprefill_tokens=self._work["reprefill_tokens"],
        )

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        await self._unpaused.wait()  # an abort issued during an update lands when it ends
        loop = asyncio.get_running_loop()
        now = loop.time()
        dt = self.config.token_time_s
        hit = [e for e in self._queued if request_ids is None or e.request.request_id in request_ids]
        for entry in hit:
            self._queued.remove(entry)
        for entry in hit:  # queued requests return at once, with nothing
            entry.target = 0
            entry.start = now
            self._deliver(entry, FinishReason.ABORT)
        for entry in list(self._running.values()):
            if entry.aborted or (request_ids is not None and entry.request.request_id not in request_ids):
                continue
            done = math.floor((now - entry.start) / dt + 1e-9)
            keep = min(done + 1, entry.target)  # the token being decoded still completes
            if keep < entry.target:
                entry.aborted = True
                entry.target = keep
                entry.reason = FinishReason.ABORT
                assert entry.handle is not None
                entry.handle.cancel()
                entry.handle = loop.call_at(entry.start + keep * dt, self._finish, entry)

    async def load(self) -> EngineLoad:
        return EngineLoad(running=len(self._running), waiting=len(self._queued))

    def export_state(self) -> dict[str, Any]:
        return {"version": self.version, "submitted": self._submitted}

    def restore_state(self, state: dict[str, Any]) -> None:
        self.version = state["version"]
        self._submitted = state["submitted"]

    async def sleep(self, level: int) -> None:
        """Release the (pretend) accelerator memory; refused with requests in flight."""
        if level not in (1, 2):
            raise EngineError(f"sleep level must be 1 or 2, got {level}")
        if self._running or self._queued or self._landing:
            raise EngineError("sleep with requests in flight: abort and drain first")
        if self.asleep is not None:
            raise EngineError("the fake engine is asleep already")
        self.switches.append(("sleep", level))
        self.asleep = level
        await asyncio.sleep(self.config.switch_s)

    async def wake_up(self) -> None:
        if self.asleep is None:
            raise EngineError("wake_up: the fake engine is not asleep")
        self.switches.append(("wake_up", None))
        await asyncio.sleep(self.config.switch_s)
        self._weights_dropped = self.asleep == 2
        self.asleep = None

    async def update_weights(self, update: WeightUpdate) -> None:
        """Pause, install, continue: see the module docstring for what in-flight requests see."""
        if not self._unpaused.is_set():
            raise EngineError("update_weights while another update is in progress")
        if self.asleep is not None:
            raise EngineError("update_weights while asleep: wake_up() first")
        self._weights_dropped = False
        loop = asyncio.get_running_loop()
        now = loop.time()
        dt = self.config.token_time_s
        done: dict[str, int] = {}
        for rid, entry in self._running.items():
            assert entry.handle is not None
            entry.handle.cancel()
            done[rid] = min(math.floor((now - entry.start) / dt + 1e-9), entry.target)
            before = sum(k for _, k in entry.runs)
            if done[rid] > before and entry.request.policy_version is None:  # a pinned one keeps its own
                entry.runs.append((self.version, done[rid] - before))
            if done[rid] and entry.first is None:
                entry.first = entry.start + dt
        self._unpaused.clear()
        try:
            if self.config.weight_sync_s:
                await asyncio.sleep(self.config.weight_sync_s)
            self._held.add(self.version)
            self.version = update.version
            self._prune()
        finally:
            self._unpaused.set()
        resumed = loop.time()
        for rid, entry in self._running.items():  # continue where each stopped, with the new weights
            entry.start = resumed - done[rid] * dt
            entry.handle = loop.call_at(entry.start + entry.target * dt, self._finish, entry)
        landing, self._landing = self._landing, []
        for entry in landing:
            self._land(entry)

    def retain_versions(self, versions: Collection[int]) -> None:
        self._retained = set(versions)
        self._prune()

    def held_versions(self) -> tuple[int, ...]:
        return tuple(sorted(self._held))

    def _prune(self) -> None:
        """Free every old version no request in flight names and the loop did not ask to keep."""
        live = {e.request.policy_version for e in [*self._running.values(), *self._queued, *self._landing]}
        self._held = {v for v in self._held if v != self.version and (v in self._retained or v in live)}

    def saturated_tokens_per_s(self, concurrency: int, mean_context: float) -> float | None:
        if self.config.max_running is not None:
            concurrency = min(concurrency, self.config.max_running)
        return concurrency / self.config.token_time_s
