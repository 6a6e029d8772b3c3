"""The scheduler behind the fake SGLang server: queues, decode steps, abort, retraction, weights.

It reproduces what SGLang 0.5.23 does with a request in each state (read from
``tokenizer_manager.py`` and ``scheduler.py``; see :mod:`.fake_server` for the
deviations):

* **in transit** (received, not yet in the scheduler: HTTP, tokenization, or
  held at the pause / weight-update gate): an abort cannot reach it; it lands
  later and runs until aborted again.  An abort by rid marks the rid as sent
  and SGLang ignores later aborts of the same rid (``state.abort_sent``), so
  only an abort-all catches a late arrival;
* **waiting** (never run, or *retracted* back to the queue): popped at once and
  answered with ``{"type": "abort", "message": "Abort in waiting queue"}`` and
  only the tokens already forwarded to the tokenizer - nothing for a request
  that never ran, and for a retracted non-streaming request only the tokens up
  to its last forced flush (every ``force_stream_interval`` = 50 tokens);
* **running**: marked ``to_finish``; it decodes one more token and returns
  every token with ``{"type": "abort", "message": "Aborted"}``, even if that
  token is EOS or its last allowed one (the abort is checked first);
* abort matches by rid **prefix**; an empty rid without ``abort_all`` is ignored.

Tokens are a pure function of (first input id, seed, absolute position), so a
request resumed from ``prompt + partial`` continues exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from april_bench.engines.sglang.fake_requests import (
    FakeRequest,
    FakeSettings,
    RequestError,
    fake_sglang_token,
    parse_generate_body,
    weight_version_spans,
)

__all__ = ["FakeScheduler"]

RETRACT_DECODE_STEPS = 20  # after a retraction the pool must fit this many more steps (SGLang's rule)


class FakeScheduler:
    """One data-parallel rank of a fake SGLang server; runs on the server's event loop."""

    def __init__(self, settings: FakeSettings, weight_version: str) -> None:
        self.s = settings
        self.weight_version = weight_version
        self.states: dict[str, FakeRequest] = {}  # every received, unfinished request (rid_to_state)
        self.waiting: deque[FakeRequest] = deque()
        self.running: list[FakeRequest] = []
        self.paused: str | None = None  # None, "abort", "retract" or "in_place"
        self.counters = {
            "num_requests_total": 0,
            "prompt_tokens_total": 0,
            "generation_tokens_total": 0,
            "num_aborted_requests_total": 0,
            "num_retracted_requests_total": 0,
            "cached_tokens_total": 0,
        }
        self.gen_throughput = 0.0
        self._readers = 0  # requests past the gate and unfinished (model_update_lock readers)
        self._writers = 0  # weight updates waiting or running
        self._gate = asyncio.Event()
        self._gate.set()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._transit: set[asyncio.Task[None]] = set()

    # --------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._transit) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for req in self.states.values():
            if not req.future.done():
                req.future.cancel()

    # -------------------------------------------------------------- requests
    def submit(self, body: dict[str, Any]) -> FakeRequest:
        """Validate a ``/generate`` body and start the request; ``request.future`` resolves to its output."""
        req = parse_generate_body(body, self.s)
        if req.rid in self.states:
            raise RequestError(f"Duplicate request ID detected: {req.rid}")
        self.states[req.rid] = req
        self.counters["num_requests_total"] += 1
        task = asyncio.ensure_future(self._land(req))
        self._transit.add(task)
        task.add_done_callback(self._transit.discard)
        return req

    async def _land(self, req: FakeRequest) -> None:
        if self.s.http_latency_s > 0:
            await asyncio.sleep(self.s.http_latency_s)
        while not self._gate.is_set():  # paused, or a weight update holds the lock
            await self._gate.wait()
        if req.future.done() or req.rid not in self.states:
            return
        self._readers += 1
        self._idle.clear()
        self.waiting.append(req)
        self._wake.set()

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        """``/abort_request``: tokenizer-side rid check, then the scheduler's prefix match."""
        if not abort_all:
            if not rid:
                return  # SGLang: "Ignore abort_request with empty rid and abort_all=False"
            state = self.states.get(rid)
            if state is None or state.abort_sent:
                return
            state.abort_sent = True
        self.counters["num_aborted_requests_total"] += 1
        for req in [r for r in self.waiting if abort_all or r.rid.startswith(rid)]:
            self.waiting.remove(req)
            self._finish_waiting_abort(req)
        for req in self.running:
            if abort_all or req.rid.startswith(rid):
                req.to_finish = True

    # ----------------------------------------------------------- pause, weights
    async def pause(self, mode: str) -> None:
        if mode not in ("abort", "retract", "in_place"):
            raise RequestError(f"mode must be abort, retract or in_place, got {mode!r}")
        self.paused = mode
        self._gate.clear()
        if mode == "abort":
            while self._readers:
                self.abort(abort_all=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), 1.0)
        elif mode == "retract":
            for req in self.running:
                self._retract(req)
            self.running.clear()

    def resume(self) -> None:
        self.paused = None
        self._open_gate()
        self._wake.set()

    async def update_weights(
        self,
        model_path: str | None,
        version: str | None,
        *,
        abort_all: bool,
        flush: bool,
        load: Callable[[], Awaitable[str | None]] | None = None,
    ) -> tuple[bool, str]:
        """``/update_weights_from_disk`` (``model_path``) and ``/update_weights_from_distributed``
        (``load``: receives the tensors, returns an error or None): waits for in-flight requests (the
        writer lock) unless paused."""
        if abort_all:
            self.abort(abort_all=True)
        locked = self.paused is None
        if locked:
            self._writers += 1
            self._gate.clear()
        try:
            if locked:
                await self._idle.wait()
            if load is not None:
                error = await load()
                if error is not None:
                    return False, f"Failed to update parameter online: {error}"
            elif model_path is None or not os.path.isdir(model_path):
                return False, f"Failed to update weights: {model_path!r} is not a checkpoint directory."
            if self.s.weight_load_s:
                await asyncio.sleep(self.s.weight_load_s)
            if version is not None:
                self.set_version(version)
            if flush and (self.running or self.waiting):
                return False, (
                    "Weights were updated, but the cache was not flushed because requests are still "
                    "running or queued. Retract or finish them, then call /flush_cache."
                )
            return True, "Succeeded to update model weights."
        finally:
            if locked:
                self._writers -= 1
                self._open_gate()

    def set_version(self, version: str) -> None:
        if version == self.weight_version:
            return
        for req in [*self.running, *self.waiting]:
            req.version_events.append((self.weight_version, len(req.output_ids)))
        self.weight_version = version

    def _open_gate(self) -> None:
        if self.paused is None and self._writers == 0:
            self._gate.set()

    # ------------------------------------------------------------ scheduling
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.paused in ("retract", "in_place") or not (self.running or self.waiting):
                self._wake.clear()
                await self._wake.wait()
                continue
            prefill = self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = len(self.running)
            step = self.s.decode_step_s + self.s.decode_step_per_request_s * batch
            step += self.s.prefill_s_per_token * prefill
            await asyncio.sleep(step)
            if self.paused in ("retract", "in_place") and not self.running:
                continue
            self._decode(loop.time())
            self.gen_throughput = batch / step if step > 0 else 0.0
            self._retract_if_full()

    def _admit(self) -> int:
        prefill = 0
        while self.waiting and len(self.running) < self.s.max_running_requests:
            req = self.waiting[0]
            if self.s.max_total_tokens is not None and self.running:
                need = self.kv_used + req.context + RETRACT_DECODE_STEPS * (len(self.running) + 1)
                if need > self.s.max_total_tokens:
                    break
            self.waiting.popleft()
            self.running.append(req)
            prefill += req.context
        return prefill

    def _decode(self, now: float) -> None:
        still: list[FakeRequest] = []
        for req in self.running:
            token, logprob = fake_sglang_token(
                req.input_ids[0],
                req.seed,
                req.context,
                vocab_size=self.s.vocab_size,
                eos_token_id=self.s.eos_token_id,
                eos_probability=self.s.eos_probability,
            )
            req.output_ids.append(token)
            req.logprobs.append(logprob)
            if req.t_first is None:
                req.t_first = now
            self.counters["generation_tokens_total"] += 1
            finish = self._finish_reason(req, token)
            if finish is not None:
                req.forwarded = len(req.output_ids)
                self._complete(req, finish, now)
                continue
            if len(req.output_ids) % self.s.force_stream_interval == 0:
                req.forwarded = len(req.output_ids)
            still.append(req)
        self.running = still

    def _finish_reason(self, req: FakeRequest, token: int) -> dict[str, Any] | None:
        if req.to_finish:  # checked first, as in Req.update_finish_state
            return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        if not req.ignore_eos and (token in req.stop_ids or token == self.s.eos_token_id):
            return {"type": "stop", "matched": token}
        if len(req.output_ids) >= req.max_new_tokens:
            return {"type": "length", "length": req.max_new_tokens}
        return None

    def _retract_if_full(self) -> None:
        cap = self.s.max_total_tokens
        if cap is None or self.kv_used + len(self.running) <= cap:
            return
        # SGLang retracts the requests with the fewest output tokens (ties: the longest prompt) first.
        self.running.sort(key=lambda r: (len(r.output_ids), -len(r.input_ids)), reverse=True)
        while len(self.running) > 1 and self.kv_used + RETRACT_DECODE_STEPS * len(self.running) > cap:
            self._retract(self.running.pop())

    def _retract(self, req: FakeRequest) -> None:
        req.retractions += 1
        self.counters["num_retracted_requests_total"] += 1
        self.waiting.append(req)  # back of the queue, as _add_request_to_queue(is_retracted=True)

    @property
    def kv_used(self) -> int:
        return sum(r.context for r in self.running)

    # ------------------------------------------------------------- outputs
    def _complete(self, req: FakeRequest, finish: dict[str, Any], now: float) -> None:
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": finish,
            "prompt_tokens": len(req.input_ids),
            "weight_version": self.weight_version,
            "num_retractions": req.retractions,
            "reasoning_tokens": 0,
            "completion_tokens": len(req.output_ids),
            "cached_tokens": 0,
        }
        if self.s.enable_metrics and req.t_first is not None:
            meta["first_token_latency"] = req.t_first - req.t_received
        self._deliver(req, req.output_ids, req.logprobs, meta)

    def _finish_waiting_abort(self, req: FakeRequest) -> None:
        n = req.forwarded
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
            "weight_version": self.weight_version,
            "e2e_latency": asyncio.get_running_loop().time() - req.t_received,
            "completion_tokens": n,
        }
        self._deliver(req, req.output_ids[:n], req.logprobs[:n], meta)

    def _deliver(self, req: FakeRequest, ids: list[int], logprobs: list[float], meta: dict[str, Any]) -> None:
        meta["weight_versions"] = weight_version_spans(req.version_events, self.weight_version, len(ids))
        meta["weight_version"] = meta["weight_versions"][-1]["version"]
        if req.return_logprob:
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)]
        self.states.pop(req.rid, None)
        self.counters["prompt_tokens_total"] += len(req.input_ids)
        if not req.future.done():
            req.future.set_result({"output_ids": list(ids), "meta_info": meta})
        self._readers -= 1
        if self._readers == 0:
            self._idle.set()

    # -------------------------------------------------------------- reports
    def load(self) -> dict[str, Any]:
        """One entry of ``/v1/loads``' ``loads`` list (core fields and the queues section)."""
        cap = self.s.max_total_tokens or 0
        used = self.kv_used
        return {
            "dp_rank": 0,
            "timestamp": time.time(),
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "num_used_tokens": used,
            "num_total_tokens": used + sum(r.context for r in self.waiting),
            "max_total_num_tokens": cap,
            "max_running_requests": self.s.max_running_requests,
            "token_usage": round(used / cap, 4) if cap else 0.0,
            "gen_throughput": round(self.gen_throughput, 2),
            "cache_hit_rate": 0.0,
            "utilization": 1.0 if self.running else 0.0,
            "queues": {
                "waiting": len(self.waiting),
                "grammar": 0,
                "paused": len(self.running) if self.paused in ("retract", "in_place") else 0,
                "retracted": sum(1 for r in self.waiting if r.retractions),
                "prealloc_ready": 0,
            },
        }
