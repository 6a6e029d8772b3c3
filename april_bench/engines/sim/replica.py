"""One simulated inference replica: an SGLang-like continuous-batching scheduler.

State and rules follow ``sglang==0.5.2`` ``managers/scheduler.py`` and
``schedule_policy.py`` (read for this model; see docs/simulator.md):

* **prefill first**: if a waiting request can be admitted, run an extend
  batch of up to ``chunked_prefill_size`` tokens (one request may be split
  across batches); otherwise run decode.  Mixed chunked prefill is off, as in
  SGLang's default;
* **admission** (``PrefillAdder``): a request is admitted while
  ``extend + min(max_new, 4096) < free KV - sum over running of
  min(max_new - output, 4096) * new_token_ratio`` (SGLang reserves for
  ``max_new_tokens``: it cannot know where a response will end); the ratio starts at 0.7 x
  ``schedule_conservativeness`` and decays by (0.7 - 0.098) / 600 per decode step;
* **retraction**: when the pool cannot hold one more token per running
  request, the requests with the fewest output tokens (ties: longest prompt)
  go back to the waiting queue keeping their output, until 20 more decode
  steps fit; they re-prefill prompt + output when readmitted;
* **abort**: queued requests return at once with what they have; running
  requests run one more decode step and return their partial output;
* the prefill that completes a request's context samples its first new token;
* **weight update in flight** (pause / install / continue): the replica stops at
  the end of the forward pass in progress, keeps every request's KV, and after
  the update decodes on with the new version; each request remembers how many
  tokens each version produced;
* **several weight versions** (consistent rollout): a request naming an older
  version (``GenerateRequest.policy_version``) decodes with that version's
  weights, so a decode step over requests of m versions is m forward passes (each
  reads its own weights: priced as m decode runs, one per version's requests),
  and so is an extend batch; the pool shrinks by one weight copy per old version
  held (``kv_capacity``, set by the engine).

Decode runs between events (a request finishing, the pool filling, a new
arrival or an abort) are priced in closed form by :class:`CostModel`.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from april_bench.engines.protocol import Completion, EngineError, GenerateRequest
from april_bench.engines.sim.cost import CostModel, iterations_within
from april_bench.engines.sim.cost_curve import MeasuredCost
from april_bench.engines.sim.speculative import SpeculativeCost
from april_bench.engines.stream import CompletionStream
from april_bench.types import FinishReason
from april_bench.vtime import Hop, hops

__all__ = ["ReplicaSettings", "SimReplica"]

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO = 0.7 * 0.14  # x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600  # ..._DECAY_STEPS
RETRACT_DECODE_STEPS = 20

_WAITING, _PREFILLING, _RUNNING, _DONE = range(4)


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    kv_capacity: int
    max_running: int
    chunk_tokens: int
    schedule_conservativeness: float
    replan_iterations: int
    #: Decode steps a running request makes after an abort reaches it: SGLang runs one more (1); an
    #: engine that returns at the end of the step in progress (the embedded one, vLLM, the fake) 0.
    abort_extra_steps: int = 1
    #: ``sglang`` (the default: admission reserves for max_new_tokens, prefill and decode in separate
    #: forwards, retraction of the requests with the fewest output tokens) or ``vllm`` (vLLM v1's
    #: scheduler: admission on the prompt's KV alone, waiting prefills ride in the running requests'
    #: decode step, and the most recently admitted request is preempted when a step finds no free KV).
    policy: str = "sglang"


@dataclass(slots=True, eq=False)
class _Req:
    request: GenerateRequest
    stream: CompletionStream
    target: int
    reason: FinishReason
    generated: int = 0
    prefilled: int = 0
    state: int = _WAITING
    d0: int = 0
    g0: int = 0
    d_finish: int = 0
    t_first: float | None = None
    retractions: int = 0
    abort: bool = False
    #: Input tokens whose KV is still cached (``resume_kv=keep``): not prefilled again.
    cached: int = 0
    #: ``(version, tokens)`` produced before each weight update that landed while it was live.
    runs: list[tuple[int, int]] = field(default_factory=list)
    #: When it last joined the running batch (the vLLM policy preempts the latest first).
    admitted: int = 0

    @property
    def context(self) -> int:
        return self.request.input_len + self.generated


@dataclass(slots=True)
class _Batch:
    chunks: list[tuple[_Req, int, int]] = field(default_factory=list)  # (req, offset, tokens)


#: The batch of a pass with nothing to prefill (never added to).
_NO_BATCH = _Batch(chunks=[])


class SimReplica:
    """Owns one replica's queues and KV pool; ``run()`` is its scheduler task."""

    def __init__(
        self,
        index: int,
        cost: CostModel | MeasuredCost | SpeculativeCost,
        settings: ReplicaSettings,
        engine_version: list[int],
    ) -> None:
        self.index = index
        self.cost = cost
        self.s = settings
        #: KV-pool tokens now: the settings' less the old weight versions the engine holds.
        self.kv_capacity = settings.kv_capacity
        #: Running requests that name a weight version (their decode may need a forward of its own).
        self.pinned = 0
        self._version = engine_version  # shared one-element list: the engine's policy version
        self.waiting: deque[_Req] = deque()
        self.running: dict[int, _Req] = {}
        #: ``max_new_tokens - g0 + d0`` of every running request, sorted: a request's tokens still to
        #: come are this minus ``D``, so the reserve sums a slice instead of walking every request.
        self._budget_keys: list[int] = []
        self._heap: list[tuple[int, int, _Req]] = []
        self._seq = 0
        self.chunked: _Req | None = None
        self.D = 0  # decode iterations so far
        self.extends = 0  # prefill (extend) batches so far: with D, the replica's forward passes
        # what an engine's own accounting counts (EngineWork), modelled: tokens sampled by decode steps,
        # input tokens prefilled, of them those of resumed requests, and decode steps by batch size
        self.decode_tokens = 0
        self.prefill_tokens = 0
        self.reprefill_tokens = 0
        self.decode_batches: dict[int, int] = {}
        self.retractions = 0  # requests sent back to the queue when the pool ran out (preemptions)
        self.mixed = 0  # vLLM policy: prefill forwards that were also a decode step (one iteration, not two)
        self.first_tokens = 0  # tokens sampled by the forward that completed a request's prefill
        self.ctx_base = 0  # sum(input_len + g0 - d0) over running; context sum = ctx_base + B*D
        self.kv_used = 0
        self.ratio = min(1.0, INIT_NEW_TOKEN_RATIO * settings.schedule_conservativeness)
        self.outstanding = 0
        self._aborts: list[_Req] = []
        self._in_batch: list[_Req] = []  # the extend batch being computed right now
        self._kicked = False
        #: The wait in progress: its continuation (None: not waiting for a kick), whether a kick or its
        #: timer ended it already (the continuation is scheduled), and its timer.
        self._then: Callable[[bool], bool] | None = None
        self._resolved = False
        self._timer: asyncio.TimerHandle | None = None
        #: Set by :meth:`run`: the future its task awaits (cancelled with it), and the loop's methods.
        self._stopped: asyncio.Future[None] | None = None
        self._hop: Callable[[Hop], None] = _unstarted
        self._call_at: Callable[..., Any] = _unstarted
        self._clock: Callable[[], float] = _unstarted
        #: Set by :meth:`pause`: resolved when the replica stops; it waits on ``_resume`` then.
        self._at_pause: asyncio.Future[None] | None = None
        self._resume: asyncio.Future[None] | None = None
        #: The decode run in progress: (start time, batch, context sum, iterations planned).
        self._run: tuple[float, int, int, int] | None = None

    # ------------------------------------------------------------- interface
    @staticmethod
    def check(request: GenerateRequest, settings: ReplicaSettings) -> None:
        if request.replay_len is None:
            raise EngineError(f"{request.request_id}: the simulator needs replay_len (a response length)")
        if request.input_len + 1 > settings.kv_capacity:
            raise EngineError(
                f"{request.request_id}: {request.input_len} context tokens exceed the KV pool "
                f"({settings.kv_capacity} tokens); raise mem_fraction_static or lower the response limit"
            )

    def submit(
        self, request: GenerateRequest, stream: CompletionStream, cached: int = 0, *, front: bool = False
    ) -> None:
        """Queue ``request``; ``front``: before every waiting request (a dead replica's, re-queued)."""
        self.check(request, self.s)
        assert request.replay_len is not None
        target, reason = request.max_new_tokens, FinishReason.LENGTH
        if request.replay_len <= target:
            target, reason = request.replay_len, FinishReason.STOP
        req = _Req(request, stream, target, reason, cached=min(cached, request.input_len - 1))
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)
        self.outstanding += 1
        self.kick()

    def fail(self) -> list[tuple[GenerateRequest, CompletionStream, int, bool]]:
        """The replica dies (:mod:`april_bench.engines.sim.failures`): its live requests as
        ``(request, stream, tokens decoded here and never delivered, abort asked)``, by priority; its
        scheduler task must be cancelled by the caller.  A weight update waiting for it to pause goes on."""
        d = self.D
        if self._run is not None:  # decode iterations completed so far in the run in progress
            start, batch, context_sum, k = self._run
            d += min(k, self.cost.iterations_within(batch, context_sum, k, self._now() - start))
        lost = [
            (r.request, r.stream, r.g0 + d - r.d0 if r.state == _RUNNING else r.generated, r.abort)
            for r in sorted(self._live(), key=lambda r: r.request.priority)
        ]
        for req in self._live():
            req.state = _DONE
        self.waiting.clear()
        self.running.clear()
        self.pinned = 0
        self._budget_keys.clear()
        self._heap.clear()
        self._in_batch = []
        self.chunked = None
        self._aborts = []
        self.outstanding = 0
        self.kv_used = self.ctx_base = 0
        if self._at_pause is not None and not self._at_pause.done():
            self._at_pause.set_result(None)
        return lost

    def request_abort(self, req_filter: set[str] | None) -> None:
        for req in self._live():
            if not req.abort and (req_filter is None or req.request.request_id in req_filter):
                req.abort = True
                self._aborts.append(req)
        if self._aborts:
            self.kick()

    def load(self) -> tuple[int, int]:
        """(running, waiting); requests being prefilled count as running."""
        prefilling = set(map(id, self._in_batch))
        if self.chunked is not None:
            prefilling.add(id(self.chunked))
        return len(self.running) + len(prefilling), len(self.waiting)

    def pause(self) -> asyncio.Future[None]:
        """Stop at the end of the forward pass in progress; the future resolves once stopped."""
        loop = asyncio.get_running_loop()
        self._at_pause, self._resume = loop.create_future(), loop.create_future()
        self.kick()
        return self._at_pause

    def stamp(self, version: int) -> None:
        """While paused: the tokens every live request has so far were produced by ``version`` (a
        request naming its version keeps it: the update does not touch its weights)."""
        for req in self._live():
            if req.request.policy_version is not None:
                continue
            generated = req.g0 + self.D - req.d0 if req.state == _RUNNING else req.generated
            before = sum(n for _, n in req.runs)
            if generated > before:
                req.runs.append((version, generated - before))

    def resume(self) -> None:
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)

    def kick(self) -> None:
        """Something changed (a request, an abort, a pause): a scheduler waiting for a kick wakes in
        the next pass; a busy one finds the kick at its next wait and does not wait."""
        if self._then is not None and not self._resolved and not self._halted():
            self._resolved = True
            self._hop((self._woken, (True,)))
        else:
            self._kicked = True

    # ------------------------------------------------------------ scheduler
    # The scheduler is a chain of callbacks, not a task: each part runs in the loop pass where a
    # scheduler task's step would, so every result is the one a task gives.  A timer or a kick that
    # ends a wait schedules the part after it for the next pass (as resolving the future a task awaits
    # schedules its wake-up), and a wait that need not wait goes on at once (as awaiting a done future
    # does).  Without the task there is no future, no wake-up and no coroutine resumed per wait: the
    # scheduler waits about three times per request.
    async def run(self) -> None:
        """The scheduler, until the task running it is cancelled.  When a pass raises, every live
        request's stream fails with an :class:`EngineError` and this raises the error."""
        loop = asyncio.get_running_loop()
        self._hop, self._call_at = hops(loop), loop.call_at
        self._clock = loop.time
        stopped: asyncio.Future[None] = asyncio.Future(loop=loop)
        self._stopped = stopped
        self._go_on(self._pass)
        try:
            await stopped  # cancelling the task cancels this future: every later part does nothing
        finally:
            self._then = None
            if self._timer is not None:  # what the wait in progress does when its task is cancelled
                self._timer.cancel()
                self._timer = None

    def _halted(self) -> bool:
        """The task running the scheduler was cancelled (the replica failed, the engine closed), or a
        pass raised: what is still scheduled does nothing, as a cancelled task's wake-up does."""
        stopped = self._stopped
        return stopped is None or stopped.done()

    def _go_on(self, part: Callable[[], bool]) -> None:
        """Run ``part`` and, unless it waits, the passes after it (the scheduler's loop)."""
        stopped = self._stopped
        if stopped is None or stopped.done():
            return
        try:
            if part():
                while self._pass():
                    pass
        except Exception as exc:
            error = EngineError(f"simulated replica {self.index} failed: {exc}")
            for req in self._live():
                req.stream.fail(error)
            if not stopped.done():
                stopped.set_exception(exc)

    def _pass(self) -> bool:
        """One pass of the scheduler; False when it waits (its continuation then goes on)."""
        self._kicked = False
        if self._resume is not None:  # a weight update: stopped between forward passes
            assert self._at_pause is not None
            if not self._at_pause.done():
                self._at_pause.set_result(None)
            if not self._resume.done():
                self._resume.add_done_callback(self._resumed)
                return False
            self._resume = self._at_pause = None
            return True
        if self._aborts:
            self._apply_aborts(self._clock())
        vllm = self.s.policy == "vllm"
        if vllm and self.running:
            self._retract_if_full()  # vLLM schedules the running requests' decode first
        # nothing waits and nothing is half prefilled: no extend batch (most passes of a decode-bound
        # replica), without building an empty one
        batch = self._plan_prefill() if self.waiting or self.chunked is not None else _NO_BATCH
        if batch.chunks:
            self._in_batch = [req for req, _, _ in batch.chunks]
            self.extends += 1
            decoding = len(self.running) if vllm else 0  # vLLM: their decode rides in this forward
            seconds = self._prefill_time(batch)
            if decoding:
                seconds += self.cost.decode_run_time(decoding, self.ctx_base + decoding * self.D, 1)
            self._sleep(seconds, functools.partial(self._prefilled, batch, decoding))
            return False
        if self.running:
            self._retract_if_full()
            return self._decode_run()
        if not self.waiting and self.chunked is None:
            self.ratio = min(1.0, INIT_NEW_TOKEN_RATIO * self.s.schedule_conservativeness)
        elif self.waiting:
            raise EngineError(f"replica {self.index}: requests wait but none can be admitted")
        return self._wait(None, _next_pass)

    def _prefilled(self, batch: _Batch, decoding: int) -> bool:
        """An extend batch's forward is over."""
        now = self._clock()
        self._in_batch = []
        if decoding:
            self.mixed += 1
            self._advance(1, now, counted=False)
        firsts = self.first_tokens
        self._complete_prefill(batch, now)
        # one vLLM step, as its stats see it
        if self.s.policy == "vllm" and decoding + self.first_tokens - firsts:
            sampled = decoding + self.first_tokens - firsts
            self.decode_batches[sampled] = self.decode_batches.get(sampled, 0) + 1
            self.decode_tokens += decoding
        return True

    def _resumed(self, _: asyncio.Future[None]) -> None:
        self._go_on(self._after_pause)

    def _after_pause(self) -> bool:
        self._resume = self._at_pause = None
        return True

    # ------------------------------------------------------------- waiting
    def _wait(self, when: float | None, then: Callable[[bool], bool]) -> bool:
        """Wait until ``when`` (forever if None) or a kick, then ``then(kicked)``; True when a kick
        came already (nothing waits: the caller goes on, as after ``then(True)``)."""
        if self._kicked:
            self._kicked = False
            return True
        self._then, self._resolved = then, False
        self._timer = self._call_at(when, self._timed_out) if when is not None else None
        return False

    def _timed_out(self) -> None:
        if self._then is not None and not self._resolved and not self._halted():
            self._resolved = True
            self._hop((self._woken, (False,)))

    def _woken(self, kicked: bool) -> None:
        """The pass after a kick or the timer ended the wait: the wait's continuation."""
        if self._halted():
            return
        then, self._then = self._then, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        assert then is not None
        self._go_on(functools.partial(then, kicked))

    def _sleep(self, seconds: float, then: Callable[[], bool]) -> None:
        """``await asyncio.sleep(seconds)`` (no kick wakes it), then ``then()``: the same timer
        (``now + seconds``), and the pass after it fires."""
        if seconds <= 0:  # asyncio.sleep(0) yields for one pass
            self._hop((self._go_on, (then,)))
            return
        self._timer = self._call_at(self._clock() + seconds, self._slept, then)

    def _slept(self, then: Callable[[], bool]) -> None:
        if not self._halted():
            self._hop((self._go_on, (then,)))

    # -------------------------------------------------------------- decode
    def _prefill_time(self, batch: _Batch) -> float:
        """An extend batch's time: one forward per weight version its requests name."""
        chunks = [(req.request.policy_version, off, n) for req, off, n in batch.chunks]
        versions = {self._version[0] if v is None else v for v, _, _ in chunks}
        if len(versions) == 1:
            return self.cost.prefill_time((off, n) for _, off, n in chunks)
        self.extends += len(versions) - 1
        return sum(
            self.cost.prefill_time(
                (off, n) for v, off, n in chunks if (self._version[0] if v is None else v) == w
            )
            for w in versions
        )

    def _version_batches(self) -> list[tuple[int, int]]:
        """``(batch, context sum)`` of the running requests of each weight version (one forward each)."""
        current = self._version[0]
        groups: dict[int, list[int]] = {}
        for r in self.running.values():
            v = current if r.request.policy_version is None else r.request.policy_version
            group = groups.setdefault(v, [0, 0])
            group[0] += 1
            group[1] += r.request.input_len + r.g0 - r.d0 + self.D
        return [(b, c) for b, c in groups.values()]

    def _iterations(self) -> int:
        """Decode iterations until the next event: the first finish, the pool full, or (a request
        waiting) the replan interval."""
        batch = len(self.running)
        k = self._heap[0][0] - self.D
        k = min(k, (self.kv_capacity - self.kv_used) // batch)
        if self.waiting:
            k = min(k, self.s.replan_iterations)
        return max(k, 1)

    def _decode_run(self) -> bool:
        """Start a decode run to the next event; True when it is over at once (a kick was waiting)."""
        batch = len(self.running)
        context_sum = self.ctx_base + batch * self.D
        heap = self._heap
        while heap and not (
            heap[0][2].state == _RUNNING and heap[0][2].d_finish == heap[0][0]
        ):  # _live_entry
            heapq.heappop(heap)  # stale: an abort moved the finish earlier, or the request left
        k = self._iterations()
        if self.pinned:
            batches = self._version_batches()
            if len(batches) > 1:
                return self._decode_versions(batches, k)
        start = self._clock()
        end = start + self.cost.decode_run_time(batch, context_sum, k)
        self._run = (start, batch, context_sum, k)
        then = functools.partial(self._decoded, start, batch, context_sum, k, end)
        return self._wait(end, then) and then(True)

    def _decoded(self, start: float, batch: int, context_sum: int, k: int, end: float, kicked: bool) -> bool:
        """A decode run's wait ended: at its end, or a kick (the iteration in progress completes)."""
        self._run = None
        now = self._clock()
        if kicked and now < end:
            done = self.cost.iterations_within(batch, context_sum, k, now - start)
            k = min(done + 1, k)  # the iteration in progress completes
            boundary = start + self.cost.decode_run_time(batch, context_sum, k)
            if boundary > now:
                self._sleep(boundary - now, functools.partial(self._decoded_to, k))
                return False
        self._advance(k, now)
        return True

    def _decoded_to(self, k: int) -> bool:
        self._advance(k, self._clock())
        return True

    def _decode_versions(self, batches: list[tuple[int, int]], k: int) -> bool:
        """A decode run over requests of several weight versions: each step is one forward per version."""
        start = self._clock()
        end = start + _versions_run_time(self.cost, batches, k)
        then = functools.partial(self._decoded_versions, batches, start, k, end)
        return self._wait(end, then) and then(True)

    def _decoded_versions(
        self, batches: list[tuple[int, int]], start: float, k: int, end: float, kicked: bool
    ) -> bool:
        now = self._clock()
        if kicked and now < end:
            cost = self.cost
            done = iterations_within(lambda i: _versions_run_time(cost, batches, i), k, now - start)
            k = min(done + 1, k)  # the iteration in progress completes
            if start + _versions_run_time(cost, batches, k) > now:
                self._sleep(
                    start + _versions_run_time(cost, batches, k) - now, functools.partial(self._decoded_to, k)
                )
                return False
        self._advance(k, now)
        return True

    def _advance(self, k: int, now: float, *, counted: bool = True) -> None:
        batch = len(self.running)
        if counted:  # a vLLM mixed step counts its decode where it counts its prefill
            self.decode_tokens += batch * k
            self.decode_batches[batch] = self.decode_batches.get(batch, 0) + k
        self.D += k
        self.kv_used += len(self.running) * k
        self.ratio = max(MIN_NEW_TOKEN_RATIO, self.ratio - NEW_TOKEN_RATIO_DECAY * k)
        heap = self._heap
        D = self.D
        while heap and heap[0][0] <= D:
            d, _, req = heapq.heappop(heap)
            if req.state == _RUNNING and req.d_finish == d:  # _live_entry
                self._finish_running(req, now)

    # --------------------------------------------------------------- prefill
    def _plan_prefill(self) -> _Batch:
        batch = _Batch()
        budget = self.s.chunk_tokens
        if self.chunked is not None:
            req = self.chunked
            n = min(req.context - req.prefilled, budget)
            batch.chunks.append((req, req.prefilled, n))
            self.kv_used += n
            budget -= n
            if req.prefilled + n < req.context:
                return batch
        if not self.waiting or budget <= 0:
            return batch
        vllm = self.s.policy == "vllm"
        free: float
        if vllm:  # the running requests' decode takes a KV slot and a token of the step's budget each
            free = float(self.kv_capacity - self.kv_used - len(self.running))
            budget -= len(self.running)
        else:
            free = self.kv_capacity - self.kv_used - self._running_reserve()
        admitted = len(self.running) + len(batch.chunks)
        while self.waiting and budget > 0 and admitted < self.s.max_running:
            req = self.waiting[0]
            extend = req.context
            # SGLang cannot know the replayed length: it reserves for max_new_tokens.  vLLM admits on
            # the prompt's KV alone and preempts later when a decode step finds none.
            need = (
                extend + 1
                if vllm
                else extend + min(req.request.max_new_tokens - req.generated, CLIP_MAX_NEW_TOKENS)
            )
            # SGLang's rule, except that an empty replica takes any request that fits at all.
            if not (need < free or (admitted == 0 and extend + 1 <= free)):
                break
            self.waiting.popleft()
            req.state = _PREFILLING
            req.prefilled = req.cached  # a kept prefix is in the pool already, not computed again
            self.kv_used += req.cached
            n = min(extend - req.prefilled, budget)
            batch.chunks.append((req, req.prefilled, n))
            self.kv_used += n
            free -= need
            budget -= n
            admitted += 1
            if req.prefilled + n < extend:
                self.chunked = req
                break
        return batch

    def _running_reserve(self) -> float:
        # sum over running requests of min(tokens to come, CLIP): the keys below D + CLIP count their
        # own, the rest CLIP each (integers: the same sum as request by request)
        keys, d = self._budget_keys, self.D
        below = bisect.bisect_left(keys, d + CLIP_MAX_NEW_TOKENS)
        remaining = sum(keys[:below]) - d * below + CLIP_MAX_NEW_TOKENS * (len(keys) - below)
        return remaining * self.ratio

    def _budget_key(self, req: _Req) -> int:
        return req.request.max_new_tokens - req.g0 + req.d0

    def _drop_budget(self, req: _Req) -> None:
        keys = self._budget_keys
        del keys[bisect.bisect_left(keys, self._budget_key(req))]

    def _complete_prefill(self, batch: _Batch, now: float) -> None:
        for req, _, n in batch.chunks:
            req.prefilled += n
            self.prefill_tokens += n
            if req.request.prefix_len > 0:
                self.reprefill_tokens += n
            if req.prefilled < req.context:
                continue  # still chunked
            if self.chunked is req:
                self.chunked = None
            req.generated += 1  # the extend forward samples the first new token
            self.first_tokens += 1
            self.kv_used += 1
            if req.t_first is None:
                req.t_first = now
            if req.generated >= req.target or req.abort:
                req.state = _RUNNING  # so _finish_running's bookkeeping applies
                self._join(req)
                self._finish_running(req, now)
            else:
                self._join(req)

    def _join(self, req: _Req) -> None:
        req.state = _RUNNING
        req.d0, req.g0 = self.D, req.generated
        req.d_finish = self.D + (req.target - req.generated)
        req.admitted = self._seq + 1
        self.running[id(req)] = req
        self.pinned += req.request.policy_version is not None
        bisect.insort(self._budget_keys, self._budget_key(req))
        self.ctx_base += req.request.input_len + req.g0 - req.d0
        self._seq += 1
        heapq.heappush(self._heap, (req.d_finish, self._seq, req))

    # ------------------------------------------------------------ finishing
    def _finish_running(self, req: _Req, now: float) -> None:
        del self.running[id(req)]
        self.pinned -= req.request.policy_version is not None
        self._drop_budget(req)
        req.generated = req.g0 + (self.D - req.d0)
        self.ctx_base -= req.request.input_len + req.g0 - req.d0
        self.kv_used -= req.context
        reason = req.reason if req.generated >= req.target else FinishReason.ABORT
        self._deliver(req, reason, now)

    def _deliver(self, req: _Req, reason: FinishReason, now: float) -> None:
        req.state = _DONE
        self.outstanding -= 1
        runs = None
        if req.runs:
            before = sum(n for _, n in req.runs)
            tail = [(self._version[0], req.generated - before)] if req.generated > before else []
            runs = (*req.runs, *tail)
        pinned = req.request.policy_version
        req.stream.deliver(
            Completion(
                request_id=req.request.request_id,
                num_tokens=req.generated,
                finish_reason=reason,
                policy_version=self._version[0] if pinned is None else pinned,
                version_runs=runs,
                t_done=now,
                t_first_token=req.t_first,
                num_retractions=req.retractions,
                replica=self.index,
            )
        )

    def _apply_aborts(self, now: float) -> None:
        if not self._aborts:
            return
        aborts, self._aborts = self._aborts, []
        for req in aborts:
            if req.state == _DONE:
                continue
            if req.state == _WAITING:
                self.waiting.remove(req)
                self._deliver(req, FinishReason.ABORT, now)
            elif req.state == _PREFILLING and self.chunked is req:
                self.chunked = None
                self.kv_used -= req.prefilled
                self._deliver(req, FinishReason.ABORT, now)
            elif req.state == _RUNNING and self.s.abort_extra_steps == 0:
                self._finish_running(req, now)  # the step in progress was its last
            elif req.state == _RUNNING and req.d_finish > self.D + self.s.abort_extra_steps:
                # SGLang: one more decode step, then return the partial output
                req.d_finish = self.D + self.s.abort_extra_steps
                self._seq += 1
                heapq.heappush(self._heap, (req.d_finish, self._seq, req))

    def _retract_if_full(self) -> None:
        batch = len(self.running)
        if self.kv_capacity - self.kv_used >= batch:
            return
        vllm = self.s.policy == "vllm"
        if vllm:  # vLLM: preempt the latest admitted until this one step fits
            order = sorted(self.running.values(), key=lambda r: -r.admitted)
            steps = 1
        else:  # SGLang: the fewest output tokens first (ties: longest prompt), until 20 steps fit
            order = sorted(self.running.values(), key=lambda r: (self.D - r.d0 + r.g0, -r.request.input_len))
            steps = RETRACT_DECODE_STEPS
        for req in order:
            if len(self.running) <= 1 or self.kv_capacity - self.kv_used >= len(self.running) * steps:
                break
            del self.running[id(req)]
            self.pinned -= req.request.policy_version is not None
            self._drop_budget(req)
            req.generated = req.g0 + (self.D - req.d0)
            self.ctx_base -= req.request.input_len + req.g0 - req.d0
            self.kv_used -= req.context
            req.retractions += 1
            self.retractions += 1
            req.cached = 0  # its KV is freed: readmitted, it re-prefills prompt + output
            if req.abort:  # aborted while running: return its output instead of queueing it again
                self._deliver(req, FinishReason.ABORT, self._now())
                continue
            req.state = _WAITING
            if vllm:
                self.waiting.appendleft(req)  # vLLM puts a preempted request first in line
            else:
                self.waiting.append(req)
        if self.kv_capacity - self.kv_used < len(self.running):
            raise EngineError(
                f"replica {self.index}: one request needs more KV than the pool holds "
                f"({self.kv_capacity} tokens); raise mem_fraction_static or lower the response limit"
            )
        if vllm:
            return  # no SGLang new-token ratio to reset
        remaining = list(self.running.values())
        decoded = sum(r.g0 + self.D - r.d0 for r in remaining)
        max_new = sum(r.request.max_new_tokens for r in remaining) or 1
        self.ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(remaining)) / max_new)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _live(self) -> list[_Req]:
        live = list(self.waiting) + list(self.running.values()) + self._in_batch
        if self.chunked is not None and self.chunked not in self._in_batch:
            live.append(self.chunked)
        return live


def _live_entry(entry: tuple[int, int, _Req]) -> bool:
    d, _, req = entry
    return req.state == _RUNNING and req.d_finish == d


def _next_pass(kicked: bool) -> bool:
    """An idle wait's continuation: the next pass."""
    return True


def _versions_run_time(
    cost: CostModel | MeasuredCost | SpeculativeCost, batches: list[tuple[int, int]], k: int
) -> float:
    """``k`` decode iterations over requests of several weight versions: one forward per version."""
    return sum(cost.decode_run_time(b, c, k) for b, c in batches)


def _unstarted(*args: Any) -> Any:
    raise RuntimeError("the replica's scheduler has not started: run() first")
