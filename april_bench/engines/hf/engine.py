"""The ``hf`` engine: a continuous-batching scheduler over a ``transformers`` causal LM.

Why our own scheduler rather than transformers' continuous-batching manager:
that manager drops a cancelled request without returning what it generated
(``scheduler.clear_cancelled_requests`` in transformers 5.23), has no
per-request seeds, and runs on its own thread; APRIL needs an abort that hands
back the partial tokens and log-probs.  ``benchmarks/hf_bench.py`` measures the
decode-step cost of this scheduler against batch size and context.

The scheduler (one asyncio task, one forward at a time, yielding to the event
loop between forwards so the rollout loop can react):

1. aborts: queued requests return at once with nothing; running requests
   return what they have at the next boundary (no extra step);
2. prefill first: admit queued requests into free slots, up to
   ``max_prefill_tokens`` padded tokens per extend batch; the extend samples
   each request's first token;
3. otherwise one decode step for every running request.

Three decode paths (``decode_path``): ``eager`` builds each step's inputs from
Python lists and appends every token on the host (the CPU default);
``static`` keeps per-slot state, sampling and stop tests on the device and runs
one fixed step per (batch, KV length) bucket, captured in CUDA graphs on a GPU
(``april_bench/engines/hf/static.py``), with the same tokens and log-probs as
``eager`` for the same seeds; ``fused`` is ``static`` with the fused Qwen2/Qwen3
forward (``fused.py``: merged products, Triton kernels on a GPU, attention over
each row's own keys), prefill through the same forward, the sort-free sampler,
every graph captured at start and each step's ``done`` flags read one step late
on CUDA (the CUDA default where the model is a Qwen2/Qwen3; ``static`` for other
models).  ``fused`` agrees with ``eager`` within float tolerance and in
distribution, not bit for bit.  A long extend is split into chunks of
``prefill_chunk_tokens`` padded tokens (same results, bounded activations).

Active sequences occupy slots ``0 .. B-1`` of a :class:`SlotKVCache`; when one
finishes, the last active sequence moves into its slot.  EOS stops a request
unless it replays a length (``replay_len``), in which case EOS is banned until
the length is reached and the request then stops as if it had sampled EOS.
Weights are updated in place from the trainer's state dict; every token is
stamped with the policy version in force when it was sampled.

Several weight versions (consistent rollout, eager path): an update keeps a copy of the
weights it replaces while a request in flight names that version or the rollout loop asked to
retain it (``retain_versions``).  A request naming an old version (``policy_version``) is
prefilled and decoded by that copy: a prefill batch and a decode step run one forward per version
among their sequences, over those sequences' own cache rows.  The engine keeps no KV between
requests, so a resumed partial's prompt and tokens are prefilled again, by the version that
produced them (the same keys and values; the compute is counted as re-prefill).
"""

from __future__ import annotations

import asyncio
import copy
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.hf.cache import SlotKVCache
from april_bench.engines.hf.sampling import position_uniform, sample, sample_sort_free
from april_bench.engines.hf.static import EXTRA_STOPS, Admission, StaticDecoder
from april_bench.engines.protocol import (
    ACCOUNTING,
    HEALTH,
    HISTOGRAM,
    ITERATIONS,
    METRICS,
    SATURATION,
    STATE,
    VERSIONS,
    Completion,
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineSettings,
    EngineWork,
    GenerateRequest,
    WeightUpdate,
)
from april_bench.engines.stream import CompletionStream
from april_bench.models.zoo import build_model
from april_bench.seeding import sample_seed
from april_bench.threads import choose_threads, torch_threads
from april_bench.types import FinishReason

if TYPE_CHECKING:
    from april_bench.engines.hf.fused import FusedQwen

__all__ = ["HFEngine", "build", "check"]

#: Scheduler rounds :meth:`HFEngine.iteration_log` keeps (about 50 MB at the limit).
_ITERATION_LOG_MAX = 1_000_000


@dataclass(slots=True, eq=False)
class _Launch:
    """A decode step launched on the static path whose done flags the host has not read yet."""

    index: int  # the engine's launched-step count after it
    seqs: list[_Seq]  # the active sequences by row when it was launched
    tick: float
    captured: bool
    idle: int = 0  # rows that had finished in the step before (padding in this one)


@dataclass(slots=True, eq=False)
class _Seq:
    request: GenerateRequest
    stream: CompletionStream
    seed: int
    eos: frozenset[int]
    slot: int = -1
    kv: int = 0  # tokens of this sequence in the KV cache
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    t_first: float | None = None
    aborted: bool = False
    step0: int = 0  # the engine's decode-step count when this sequence's kv was last set on the host
    #: ``(version, tokens)`` produced before each weight update that landed while it was live.
    runs: list[tuple[int, int]] = field(default_factory=list)

    @property
    def context(self) -> int:
        return self.request.input_len + len(self.tokens)


class HFEngine(Configurable):
    """Continuous batching over a Hugging Face causal LM, on CPU or CUDA."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        model: str = param("tiny", help="named architecture (random weights) or a checkpoint directory")
        device: str = param("auto", help="cpu, cuda, cuda:N, or auto (cuda when available)")
        dtype: str = param("auto", help="float32, bfloat16, float16, float64, or auto (bf16 on cuda)")
        max_running_requests: int = param(128, help="decode slots (concurrent sequences)")
        max_context_len: int = param(1024, help="prompt + response tokens per slot")
        max_prefill_tokens: int = param(4096, help="padded tokens per extend (prefill) batch")
        eos_token_ids: tuple[int, ...] = param((), help="stop tokens (default: the model config's EOS)")
        seed: int = param(0, help="base of the per-request seeds of requests that carry none")
        threads: int | None = param(
            None,
            help="torch intra-op threads (default: 1 on a CPU, for a shared machine; torch's choice on cuda)",
        )
        decode_path: str = param(
            "auto",
            help="eager; static (device-side state, CUDA graphs, the transformers forward: eager's exact "
            "tokens); fused (static with the fused Qwen2/Qwen3 forward and the sort-free sampler: within "
            "float tolerance of eager); or auto (fused on cuda for Qwen2/Qwen3, else static; eager on cpu)",
        )
        fused_kernels: str = param(
            "auto", help="the fused forward's kernels: triton, torch, or auto (triton on cuda)"
        )
        read_done_late: bool | None = param(
            None,
            help="launch decode step t+1 before reading step t's done flags (default: on cuda, fused path)",
        )
        cuda_graphs: bool = param(True, help="capture the static decode step in CUDA graphs (cuda only)")
        cuda_graph_max_batch: int = param(256, help="largest batch captured in a CUDA graph")
        prefill_chunk_tokens: int | None = param(
            None, help="padded tokens per prefill forward; longer extends run in chunks (default: no chunks)"
        )
        engine_args: dict[str, Any] = param(
            help="passed to from_pretrained / from_config unchanged", default_factory=dict
        )

        def __post_init__(self) -> None:
            if self.max_running_requests < 1 or self.max_context_len < 2 or self.max_prefill_tokens < 1:
                raise ConfigError(
                    "max_running_requests, max_context_len and max_prefill_tokens must be positive"
                )
            if self.decode_path not in ("auto", "eager", "static", "fused"):
                raise ConfigError(
                    f"decode_path must be eager, static, fused or auto; got {self.decode_path!r}"
                )
            if self.fused_kernels not in ("auto", "torch", "triton"):
                raise ConfigError(f"fused_kernels must be triton, torch or auto; got {self.fused_kernels!r}")
            if self.cuda_graph_max_batch < 1 or (
                self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1
            ):
                raise ConfigError("cuda_graph_max_batch and prefill_chunk_tokens must be positive")

    def __init__(
        self,
        config: Config,
        *,
        module: torch.nn.Module | None = None,
        vocab_size: int | None = None,
        weights: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.config = config
        self.device = _device(config.device)
        # set around each forward, not for the process: a trainer in the same process has its own
        self.threads = choose_threads(config.threads, self.device.type)
        self.dtype = _dtype(config.dtype, self.device)
        # a transformers PreTrainedModel (typed Any: nn.Module's attribute typing does not know it)
        self.model: Any = (
            module
            if module is not None
            else build_model(
                config.model,
                vocab_size=vocab_size,
                dtype=self.dtype,
                device=self.device,
                seed=config.seed,
                model_kwargs=dict(config.engine_args),
            )
        )
        self.model.eval()
        if weights is not None:
            self.model.load_state_dict(weights)
        self.version = 0
        #: Old weight versions held (version -> a copy of the model), and those the loop asked to keep.
        self._old: dict[int, Any] = {}
        self._retained: set[int] = set()
        eos = config.eos_token_ids or _config_eos(self.model.config)
        self._eos = frozenset(eos)
        self._waiting: deque[_Seq] = deque()
        self._active: list[_Seq] = []
        self._cache: SlotKVCache | None = None
        self._static: StaticDecoder | None = None
        self._fused: FusedQwen | None = None
        self._path = self._decode_path()
        self._lag = 0  # decode steps launched ahead of the host's read of their done flags
        self._pending: deque[_Launch] = deque()
        self._launched = 0  # decode steps launched (the static paths advance positions on the device)
        self._last_read: float | None = None
        self.capture_seconds = 0.0
        self._kv_bound = 0  # at least the largest kv of an active sequence (static path)
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._step_times: dict[int, list[float]] = {}
        #: Decode steps by batch size, and one ``(kind, batch, tokens, context, cpu_s)`` per scheduler
        #: round (a prefill's forwards or one decode step; ``cpu_s`` the scheduler thread's CPU time):
        #: what ``simcheck`` compares with the simulator and fits its time model to.
        self._decode_batches: dict[int, int] = {}
        self._iteration_log: list[tuple[str, int, int, int, float, float, float, int]] = []
        # engine_iterations: forward passes (decode steps + prefill forwards, chunks counted apiece);
        # decode_tokens: tokens sampled by decode steps; reprefill_tokens: prompt_tokens of resumes
        self._counters = {
            "decode_steps": 0,
            "prefill_batches": 0,
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "engine_iterations": 0,
            "decode_tokens": 0,
            "reprefill_tokens": 0,
        }
        self._info = EngineInfo(
            name="hf",
            simulated=False,
            produces_tokens=True,
            virtual_time=False,
            replicas=1,
            hardware=self.device.type,
            model=config.model,
            weight_formats=("state_dict", "path", "none"),
            capabilities=frozenset(
                {ACCOUNTING, HEALTH, HISTOGRAM, ITERATIONS, METRICS, SATURATION, STATE, VERSIONS}
            ),
            dtype=str(self.dtype).removeprefix("torch."),
        )

    # ------------------------------------------------------------ protocol
    @property
    def info(self) -> EngineInfo:
        return self._info

    def _decode_path(self) -> str:
        """The decode path the config asks for, resolved for this device and model."""
        from april_bench.engines.hf.fused import unsupported

        path = self.config.decode_path
        reason = unsupported(self.model)
        if path == "auto":
            if self.device.type != "cuda":
                return "eager"
            return "fused" if reason is None else "static"
        if path == "fused" and reason is not None:
            raise ConfigError(f"decode_path=fused: {reason}; use --engine-arg decode_path=static")
        return path

    @property
    def decode_path(self) -> str:
        """The decode path in use: ``eager``, ``static`` or ``fused``."""
        return self._path

    async def start(self) -> None:
        self._cache = SlotKVCache.for_model(
            self.model.config,
            slots=self.config.max_running_requests,
            max_len=self.config.max_context_len,
            dtype=self.dtype,
            device=self.device,
        )
        if self._path in ("static", "fused"):
            if self._path == "fused":
                from april_bench.engines.hf.fused import FusedQwen

                try:
                    self._fused = FusedQwen(self.model, self._cache, kernels=self.config.fused_kernels)
                except ValueError as exc:
                    raise EngineError(f"hf engine: {exc}") from None
            self._static = StaticDecoder(
                self.model,
                self._cache,
                eos=self._eos,
                cuda_graphs=self.config.cuda_graphs,
                max_graph_batch=self.config.cuda_graph_max_batch,
                fused=self._fused,
            )
            late = self.config.read_done_late
            self._lag = int(
                late if late is not None else (self._fused is not None and self.device.type == "cuda")
            )
            tick = time.perf_counter()
            with torch_threads(self.threads):
                self._static.capture_all()  # every graph before the first request (fused forward on cuda)
            self.capture_seconds = time.perf_counter() - tick
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        while self._pending and self._static is not None:  # nothing is left in flight on the device
            self._pending.popleft()
            self._static.finished()

    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        if self._task is None or self._wake is None:
            raise EngineError("hf engine not started: call await engine.start() first")
        if self._task.done():
            raise EngineError("the hf engine's scheduler stopped") from self._task.exception()
        for req in requests:
            if req.input_ids is None:
                raise EngineError(
                    f"{req.request_id}: the hf engine needs input_ids (token ids), not just lengths"
                )
            if self._static is not None and len(self._eos | set(req.sampling.stop_token_ids)) > (
                len(self._eos) + EXTRA_STOPS
            ):
                raise EngineError(
                    f"{req.request_id}: more than {EXTRA_STOPS} stop ids beyond EOS; use "
                    "--engine-arg decode_path=eager"
                )
            if req.policy_version is not None and req.policy_version != self.version:
                if req.policy_version not in self._old:
                    raise EngineError(
                        f"{req.request_id}: weight version {req.policy_version} is not held (current "
                        f"{self.version}, old {sorted(self._old)}); retain_versions it before the update"
                    )
                if self._static is not None:
                    raise EngineError(
                        f"{req.request_id}: an old weight version decodes on the eager path only; use "
                        "--engine-arg decode_path=eager"
                    )
            if req.input_len + req.max_new_tokens > self.config.max_context_len:
                raise EngineError(
                    f"{req.request_id}: {req.input_len} + {req.max_new_tokens} tokens exceed max_context_len "
                    f"{self.config.max_context_len}; raise --engine-arg max_context_len"
                )
        stream = CompletionStream(len(requests))
        for req in requests:
            seed = req.sampling.seed
            if seed is None:  # distinct requests must not share draws: derive one from the request id
                seed = sample_seed(self.config.seed, zlib.crc32(req.request_id.encode()), 0)
            eos = self._eos | frozenset(req.sampling.stop_token_ids)
            self._waiting.append(_Seq(req, stream, seed, eos))
        self._wake.set()
        return stream

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        wanted = None if request_ids is None else set(request_ids)
        for seq in [*self._waiting, *self._active]:
            if wanted is None or seq.request.request_id in wanted:
                seq.aborted = True
        if self._wake is not None:
            self._wake.set()

    async def load(self) -> EngineLoad:
        return EngineLoad(running=len(self._active), waiting=len(self._waiting))

    async def health(self) -> None:
        """Healthy while its scheduler runs (:class:`~april_bench.engines.protocol.HealthCheck`)."""
        if self._task is None:
            raise EngineError("hf engine not started")
        if self._task.done():
            error = None if self._task.cancelled() else self._task.exception()
            raise EngineError(f"the hf engine's scheduler stopped: {error}")

    async def update_weights(self, update: WeightUpdate) -> None:
        """Installed between two forward passes (the scheduler yields to the loop after each one, and
        nothing here awaits): in-flight sequences keep their KV and decode on with the new weights."""
        self._settle()
        if self._active or self._waiting:
            self._pull(list(self._active))  # the static path keeps recent tokens on the device
            for seq in [*self._waiting, *self._active]:
                if seq.request.policy_version is not None:
                    continue  # it names its weights: the update does not touch them
                before = sum(n for _, n in seq.runs)
                if len(seq.tokens) > before:
                    seq.runs.append((self.version, len(seq.tokens) - before))
        if self.version in self._retained or self.version in self._live_versions():
            self._old[self.version] = copy.deepcopy(self.model)  # the weights it replaces stay held
        if update.weights is not None:
            self.model.load_state_dict(update.weights)
        elif update.path is not None:
            from april_bench.models.checkpoint import load_state_dict

            self._load_checkpoint_weights(load_state_dict(update.path))
        if self._fused is not None and not self._fused.weights_shared():
            raise EngineError(
                "hf engine: the model's q/k/v or gate/up parameters were replaced, not copied into; the "
                "fused "
                "decode path reads them through merged tensors (use decode_path=static)"
            )
        if self.device.type == "cuda":  # load_state_dict only queues the copies: time them here
            torch.cuda.synchronize(self.device)
        self.version = update.version
        self._prune()

    def retain_versions(self, versions: Collection[int]) -> None:
        self._retained = set(versions)
        self._prune()

    def held_versions(self) -> tuple[int, ...]:
        return tuple(sorted(self._old))

    def _live_versions(self) -> set[int]:
        return {
            s.request.policy_version
            for s in [*self._waiting, *self._active]
            if s.request.policy_version is not None
        }

    def _prune(self) -> None:
        """Free every old version no request in flight names and the loop did not ask to keep."""
        keep = self._retained | self._live_versions()
        self._old = {v: m for v, m in self._old.items() if v != self.version and v in keep}

    def _version_of(self, seq: _Seq) -> int:
        return self.version if seq.request.policy_version is None else seq.request.policy_version

    def _model_for(self, seq: _Seq) -> Any:
        """The weights ``seq`` generates with: its named old version's copy, else the current model."""
        version = seq.request.policy_version
        return self.model if version is None or version == self.version else self._old[version]

    def _load_checkpoint_weights(self, state: dict[str, torch.Tensor]) -> None:
        """A saved checkpoint leaves out the output embedding a tied model shares with its input one."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        if unexpected or set(missing) - tied:
            raise EngineError(
                f"the checkpoint does not fit the hf engine's model: missing {sorted(set(missing) - tied)}, "
                f"unexpected {sorted(unexpected)}"
            )

    def export_state(self) -> dict[str, Any]:
        """The policy version (weights come back from the trainer on resume)."""
        return {"version": self.version}

    def restore_state(self, state: dict[str, Any]) -> None:
        self.version = state["version"]

    @property
    def step_times(self) -> dict[int, list[float]]:
        """Recent decode-step seconds by batch size (the last 64 of each), measured by the scheduler."""
        return {batch: list(times) for batch, times in self._step_times.items()}

    def _round_counts(self) -> tuple[int, int, int]:
        c = self._counters
        return c["prompt_tokens"], c["decode_steps"], c["decode_tokens"]

    def _log_round(
        self, before: tuple[int, int, int], context: int, cpu_s: float, t: float, wall_s: float
    ) -> None:
        """Log one scheduler round from the work it counted (a prefill, or decode steps read), with
        the loop time it started at and its wall seconds."""
        prompt, steps, tokens = (now - then for now, then in zip(self._round_counts(), before, strict=True))
        if steps:
            self._decode_batches[tokens // steps] = self._decode_batches.get(tokens // steps, 0) + steps
        if len(self._iteration_log) >= _ITERATION_LOG_MAX:
            return
        if prompt:
            self._iteration_log.append(("prefill", len(self._active), prompt, prompt, cpu_s, t, wall_s, 1))
        elif steps:
            self._iteration_log.append(("decode", tokens // steps, tokens, context, cpu_s, t, wall_s, steps))

    def decode_histogram(self) -> dict[int, int]:
        """Decode steps by batch size since the engine started."""
        return dict(self._decode_batches)

    def iteration_count(self) -> int:
        return len(self._iteration_log)

    def iteration_log(self, start: int = 0) -> list[tuple[str, int, int, int, float, float, float, int]]:
        """One ``(kind, batch, tokens, context, cpu_s, t, wall_s, steps)`` per scheduler round since the
        engine started (from index ``start``; at most the first million rounds):
        ``prefill`` (its forwards; ``batch`` the running requests after it, ``tokens`` and ``context``
        the tokens prefilled) or ``decode`` (a step over ``batch`` requests holding ``context`` tokens
        of KV); ``cpu_s`` is the scheduler thread's CPU time for the round, which a loaded machine
        barely moves (all of the engine's compute with one intra-op thread, the CPU default; on a GPU
        it is the host's launch time only); ``t`` the event loop's time at the round's start and
        ``wall_s`` the round's wall seconds; ``steps`` the decode steps it read (the static path
        pipelines them; 1 for a prefill)."""
        return self._iteration_log[start:]

    def reset_step_times(self) -> None:
        self._step_times.clear()

    @property
    def static_decoder(self) -> StaticDecoder | None:
        """The static decode path's state once started, or ``None`` on the eager path."""
        return self._static

    def metrics(self) -> dict[str, float]:
        kv = self.config.max_running_requests * self.config.max_context_len
        used = sum(self._kv(s) for s in self._active)
        return {
            "running": float(len(self._active)),
            "waiting": float(len(self._waiting)),
            "kv_usage": used / kv,
            **{name: float(value) for name, value in self._counters.items()},
        }

    def work(self) -> EngineWork:
        """Exact counts: the scheduler's choices depend only on the requests, their order and the
        seeds (never on a clock), so the same requests give the same counts at any load."""
        c = self._counters
        return EngineWork(
            engine_iterations=c["engine_iterations"],
            decode_iterations=c["decode_steps"],
            decode_tokens=c["decode_tokens"],
            prefill_tokens=c["prompt_tokens"],
            reprefill_tokens=c["reprefill_tokens"],
        )

    def saturated_tokens_per_s(self, concurrency: int, mean_context: float) -> float | None:
        """Measured: ``B`` tokens over this engine's median observed decode step at batch ``B``."""
        batch = min(concurrency, self.config.max_running_requests)
        observed = [b for b in self._step_times if b >= batch] or sorted(self._step_times)[-1:]
        if not observed:
            return None
        b = min(observed)
        times = sorted(self._step_times[b])
        return b / times[len(times) // 2]

    # ------------------------------------------------------------ scheduler
    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._return_aborted(loop)
                before, tick, context = self._round_counts(), time.thread_time(), 0
                started = loop.time()
                if self._waiting and len(self._active) < self.config.max_running_requests:
                    with torch_threads(self.threads):
                        self._settle(loop)
                        self._prefill(loop)
                elif self._active:
                    context = sum(self._kv(s) for s in self._active)
                    with torch_threads(self.threads):
                        self._decode(loop)
                elif self._pending:
                    self._settle(loop)
                else:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                self._log_round(before, context, time.thread_time() - tick, started, loop.time() - started)
                await asyncio.sleep(0)  # let the rollout loop react between forwards
        except Exception as exc:
            error = EngineError(f"hf engine failed: {exc}")
            for seq in [*self._waiting, *self._active]:
                seq.stream.fail(error)
            raise

    def _return_aborted(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        if any(s.aborted for s in self._waiting):
            keep: deque[_Seq] = deque()
            for seq in self._waiting:
                if seq.aborted:
                    self._deliver(seq, FinishReason.ABORT, now)
                else:
                    keep.append(seq)
            self._waiting = keep
        if not any(s.aborted for s in self._active):
            return
        self._settle(loop)  # the steps in flight first: a sequence they finished is not an abort
        aborted = [s for s in self._active if s.aborted]
        self._pull(aborted)
        self._release_many(aborted)
        for seq in aborted:
            self._deliver(seq, FinishReason.ABORT, now)

    def _prefill(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._cache is not None
        free = self.config.max_running_requests - len(self._active)
        batch: list[_Seq] = []
        while self._waiting and len(batch) < free:
            seq = self._waiting[0]
            width = max([s.context for s in batch] + [seq.context])
            if batch and width * (len(batch) + 1) > self.config.max_prefill_tokens:
                break
            batch.append(self._waiting.popleft())
        models = [self._model_for(seq) for seq in batch]
        if any(m is not self.model for m in models):  # one forward per weight version, on its own rows
            order = sorted(range(len(batch)), key=lambda i: self._version_of(batch[i]))
            batch, models = [batch[i] for i in order], [models[i] for i in order]
        start = len(self._active)
        for i, seq in enumerate(batch):
            seq.slot = start + i
            self._active.append(seq)
        logits = []
        lo = 0
        while lo < len(batch):
            hi = lo + 1
            while hi < len(batch) and models[hi] is models[lo]:
                hi += 1
            logits.append(self._prefill_forward(batch[lo:hi], start + lo, models[lo]))
            lo = hi
        for seq in batch:
            seq.kv = seq.context
            seq.step0 = self._launched
        self._counters["prefill_batches"] += 1
        self._counters["prompt_tokens"] += sum(s.context for s in batch)
        self._counters["reprefill_tokens"] += sum(s.context for s in batch if s.request.prefix_len > 0)
        self._append_tokens(batch, torch.cat(logits), loop.time())
        if self._static is not None:
            self._admit([s for s in batch if s.slot >= 0])

    def _prefill_forward(self, batch: list[_Seq], start: int, model: Any) -> torch.Tensor:
        """Prefill ``batch`` (in slots ``start ..``) with ``model``'s weights; the last positions' logits."""
        assert self._cache is not None
        width = max(s.context for s in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        for i, seq in enumerate(batch):
            full = [*seq.request.input_ids, *seq.tokens]  # type: ignore[misc]
            ids[i, : len(full)] = torch.tensor(full)
        lengths = torch.tensor([s.context for s in batch])
        positions = torch.arange(width)
        causal = positions[None, :] <= positions[:, None]
        valid = positions[None, :] < lengths[:, None]
        # columns per forward: all of them unless prefill_chunk_tokens splits the extend
        chunk = width
        if self.config.prefill_chunk_tokens is not None:
            chunk = max(1, min(width, self.config.prefill_chunk_tokens // len(batch)))
        last: torch.Tensor | None = None
        with torch.inference_mode():
            for lo in range(0, width, chunk):
                hi = min(width, lo + chunk)
                mask = (causal[None, lo:hi, :hi] & valid[:, None, :hi])[:, None]
                self._counters["engine_iterations"] += 1
                if self._fused is not None:  # causal attention by construction: no mask
                    hidden = self._fused.prefill(ids[:, lo:hi].to(self.device), start, lo)
                else:
                    self._cache.bind_prefill(start, len(batch), hi - lo, offset=lo)
                    hidden = model.base_model(
                        input_ids=ids[:, lo:hi].to(self.device),
                        position_ids=positions[lo:hi].expand(len(batch), hi - lo).to(self.device),
                        attention_mask=mask.to(self.device),
                        past_key_values=self._cache,
                        use_cache=True,
                    ).last_hidden_state
                if last is None:
                    last = hidden.new_empty(len(batch), hidden.shape[-1])
                ends = ((lengths - 1 >= lo) & (lengths - 1 < hi)).nonzero().flatten()
                last[ends] = hidden[ends, lengths[ends] - 1 - lo]
            assert last is not None
            logits: torch.Tensor = model.get_output_embeddings()(last)
        return logits

    def _admit(self, seqs: list[_Seq]) -> None:
        """Hand prefilled sequences that are still running to the static decode path."""
        assert self._static is not None
        self._static.admit(
            [
                Admission(
                    slot=s.slot,
                    tokens=s.tokens,
                    logprobs=s.logprobs,
                    position=s.kv,
                    temperature=s.request.sampling.temperature,
                    top_p=s.request.sampling.top_p,
                    seed=s.seed,
                    replay_len=s.request.replay_len,
                    max_new_tokens=s.request.max_new_tokens,
                    stops=s.eos,
                )
                for s in seqs
            ]
        )
        self._kv_bound = max((self._kv(s) for s in self._active), default=0)

    def _kv(self, seq: _Seq, upto: int | None = None) -> int:
        """Tokens of ``seq`` in the KV cache after decode step ``upto`` (default: every step launched;
        the static paths advance them on the device only)."""
        if self._static is None:
            return seq.kv
        return seq.kv + (self._launched if upto is None else upto) - seq.step0

    def _pull(self, seqs: list[_Seq], upto: int | None = None) -> None:
        """Copy the static path's tokens and log-probs of ``seqs`` back into them: those of the steps
        up to ``upto`` (sequences that finished in the step just read), or of every step launched."""
        if self._static is None or not seqs:
            return
        counts = [len(s.tokens) + self._kv(s, upto) - s.kv for s in seqs]
        pulled = self._static.pull([s.slot for s in seqs], counts, behind_read=upto is not None)
        for seq, (tokens, logprobs) in zip(seqs, pulled, strict=True):
            seq.tokens, seq.logprobs = tokens, logprobs
            seq.kv, seq.step0 = self._kv(seq, upto), self._launched if upto is None else upto

    def _decode_static(self, loop: asyncio.AbstractEventLoop) -> None:
        """Launch one step over the active sequences; read the flags of the step ``lag`` launches back."""
        assert self._static is not None
        active = self._active
        tick = loop.time()
        nucleus = any(s.request.sampling.top_p < 1 for s in active)
        captured = self._static.launch(len(active), self._kv_bound + 1, nucleus=nucleus)
        self._launched += 1
        self._kv_bound += 1
        self._pending.append(_Launch(self._launched, list(active), tick, captured))
        while len(self._pending) > self._lag:
            self._read_step(loop)

    def _settle(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Read every launched step's flags (before the host changes slots: prefill, abort, weights)."""
        while self._pending:
            self._read_step(loop)

    def _read_step(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """The oldest launched step's done flags: count its work, deliver the sequences it finished."""
        assert self._static is not None
        launch = self._pending.popleft()
        finished = self._static.finished()
        now = (loop or asyncio.get_running_loop()).time()
        tokens = len(launch.seqs) - launch.idle
        if tokens:  # a step launched after its every row had finished produced nothing: not an iteration
            self._counters["decode_steps"] += 1
            self._counters["engine_iterations"] += 1
            self._counters["decode_tokens"] += tokens
            self._counters["generation_tokens"] += tokens
        # the step time: from its launch, or from the previous step's read when it was launched before it
        begin = launch.tick if self._last_read is None else max(launch.tick, self._last_read)
        if not launch.captured and tokens:  # a step that captured a graph measures the capture
            self._record_step(len(launch.seqs), now - begin)
        self._last_read = now if self._pending else None
        if not finished:
            return
        seqs = [launch.seqs[i] for i in finished]
        if self._pending:
            self._pending[0].idle += len(seqs)  # they rode along as padding in the step launched after
        self._pull(seqs, upto=launch.index)
        self._release_many(seqs)
        for seq in seqs:
            reason = self._finish_reason(seq, seq.tokens[-1])
            self._deliver(seq, reason or FinishReason.STOP, now)
        self._kv_bound = max((self._kv(s) for s in self._active), default=0)

    def _record_step(self, batch: int, seconds: float) -> None:
        times = self._step_times.setdefault(batch, [])
        times.append(seconds)
        if len(times) > 64:
            del times[0]

    def _decode(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._static is not None:
            self._decode_static(loop)
            return
        assert self._cache is not None
        active = self._active
        if any(s.request.policy_version not in (None, self.version) for s in active):
            self._decode_versions(loop)
            return
        positions = torch.tensor([s.kv for s in active], device=self.device)
        last = torch.tensor([[s.tokens[-1]] for s in active], device=self.device)
        self._cache.bind_decode(len(active), positions)
        span = torch.arange(self._cache.kv_len, device=self.device)
        mask = (span[None, :] <= positions[:, None])[:, None, None, :]
        tick = loop.time()
        with torch.inference_mode():
            out = self.model(
                input_ids=last,
                position_ids=positions[:, None],
                attention_mask=mask,
                past_key_values=self._cache,
                use_cache=True,
            )
            logits = out.logits[:, -1]
        for seq in active:
            seq.kv += 1
        self._counters["decode_steps"] += 1
        self._counters["engine_iterations"] += 1
        self._counters["decode_tokens"] += len(active)
        self._append_tokens(list(active), logits, loop.time())
        self._record_step(len(active), loop.time() - tick)

    def _decode_versions(self, loop: asyncio.AbstractEventLoop) -> None:
        """One decode step over sequences of several weight versions: a forward per version, over its
        sequences' own cache rows; then every sequence samples as in one step."""
        assert self._cache is not None
        active = list(self._active)
        groups: dict[int, list[_Seq]] = {}
        for seq in active:
            groups.setdefault(self._version_of(seq), []).append(seq)
        tick = loop.time()
        logits = {}
        with torch.inference_mode():
            for group in groups.values():
                positions = torch.tensor([s.kv for s in group], device=self.device)
                rows = torch.tensor([s.slot for s in group], device=self.device)
                self._cache.bind_decode_rows(rows, positions)
                span = torch.arange(self._cache.kv_len, device=self.device)
                mask = (span[None, :] <= positions[:, None])[:, None, None, :]
                out = self._model_for(group[0])(
                    input_ids=torch.tensor([[s.tokens[-1]] for s in group], device=self.device),
                    position_ids=positions[:, None],
                    attention_mask=mask,
                    past_key_values=self._cache,
                    use_cache=True,
                )
                for seq, row in zip(group, out.logits[:, -1], strict=True):
                    logits[id(seq)] = row
                self._counters["decode_steps"] += 1
                self._counters["engine_iterations"] += 1
        for seq in active:
            seq.kv += 1
        self._counters["decode_tokens"] += len(active)
        self._append_tokens(active, torch.stack([logits[id(s)] for s in active]), loop.time())
        self._record_step(len(active), loop.time() - tick)

    def _append_tokens(self, seqs: list[_Seq], logits: torch.Tensor, now: float) -> None:
        sp = [s.request.sampling for s in seqs]
        banned = None
        replaying = [
            s.request.replay_len is not None and len(s.tokens) + 1 < s.request.replay_len for s in seqs
        ]
        if any(replaying) and self._eos:
            banned = torch.zeros_like(logits, dtype=torch.bool)
            eos = torch.tensor(sorted(self._eos), device=logits.device)
            for i, flag in enumerate(replaying):
                if flag:
                    banned[i, eos] = True
        temperature = torch.tensor([p.temperature for p in sp], device=logits.device)
        top_p = torch.tensor([p.top_p for p in sp], device=logits.device)
        uniforms = torch.tensor([position_uniform(s.seed, s.context) for s in seqs], device=logits.device)
        if self._fused is not None:  # the decode steps' sampler, so a resumed sequence draws as it would have
            assert self._static is not None
            tokens, logprobs = sample_sort_free(
                logits,
                temperature,
                top_p,
                uniforms,
                torch.tensor(replaying, device=logits.device) & self._static.has_eos,
                self._static.ban_tokens,
                nucleus=any(p.top_p < 1 for p in sp),
                threshold=self._fused.ops.top_p_threshold,
            )
        else:
            tokens, logprobs = sample(logits, temperature, top_p, uniforms, banned)
        self._counters["generation_tokens"] += len(seqs)
        for seq, token, logprob in zip(seqs, tokens.tolist(), logprobs.tolist(), strict=True):
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            if seq.t_first is None:
                seq.t_first = now
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self._release(seq)
                self._deliver(seq, reason, now)

    def _finish_reason(self, seq: _Seq, token: int) -> FinishReason | None:
        req, n = seq.request, len(seq.tokens)
        if req.replay_len is not None and n >= req.replay_len:
            return FinishReason.STOP
        if req.replay_len is None and token in seq.eos:
            return FinishReason.STOP
        if n >= req.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def _release(self, seq: _Seq) -> None:
        """Free ``seq``'s slot, moving the last active sequence into it."""
        self._release_many([seq])

    def _release_many(self, seqs: Sequence[_Seq]) -> None:
        """Free the slots of ``seqs`` as if one after the other (each filled by the last active sequence),
        then move the surviving sequences' KV and state in one batch: a gather and a scatter per tensor,
        not two copies per layer and twelve per sequence."""
        assert self._cache is not None
        if not seqs:
            return
        before = len(self._active)
        origin: dict[int, tuple[_Seq, int]] = {}
        for seq in seqs:
            last = self._active.pop()
            if last is not seq:
                origin.setdefault(id(last), (last, last.slot))
                last.slot = seq.slot
                self._active[seq.slot] = last
            seq.slot = -1
        moved = [(seq, slot) for seq, slot in origin.values() if seq.slot >= 0 and seq.slot != slot]
        if moved:
            src, dst = [slot for _, slot in moved], [seq.slot for seq, _ in moved]
            self._cache.move_many(src, dst, max(self._kv(seq) for seq, _ in moved))
            if self._static is not None:
                self._static.move_many(src, dst)
        if self._static is not None:
            self._static.clear_many(range(len(self._active), before))

    def _deliver(self, seq: _Seq, reason: FinishReason, now: float) -> None:
        runs = None
        if seq.runs:
            before = sum(n for _, n in seq.runs)
            tail = [(self.version, len(seq.tokens) - before)] if len(seq.tokens) > before else []
            runs = (*seq.runs, *tail)
        seq.stream.deliver(
            Completion(
                request_id=seq.request.request_id,
                num_tokens=len(seq.tokens),
                finish_reason=reason,
                policy_version=self._version_of(seq),
                version_runs=runs,
                t_done=now,
                t_first_token=seq.t_first,
                output_ids=tuple(seq.tokens),
                logprobs=tuple(seq.logprobs),
            )
        )


def check(config: HFEngine.Config, settings: EngineSettings) -> None:
    """What only this machine can say about ``config``: its device and dtype names, and whether the KV
    cache fits the device."""
    device = _device(config.device)
    _dtype(config.dtype, device)
    _check_kv_fits(config, settings.vocab_size, device)


def build(config: HFEngine.Config, settings: EngineSettings) -> HFEngine:
    """The embedded engine for ``config``, starting from ``settings``' weights."""
    check(config, settings)
    weights = settings.initial_weights() if settings.initial_weights is not None else None
    return config.build(vocab_size=settings.vocab_size, weights=weights)


def _check_kv_fits(config: HFEngine.Config, vocab_size: int | None, device: torch.device) -> None:
    """Refuse a slot KV cache larger than the device's memory, naming the knobs."""
    from april_bench.models.zoo import model_config

    if Path(config.model).is_dir():
        return  # a checkpoint's shape is known only once loaded; SlotKVCache allocation checks it
    shape = model_config(config.model, vocab_size=vocab_size)
    if config.max_context_len > shape.max_position_embeddings:
        raise ConfigError(
            f"prompt + response need {config.max_context_len} tokens but {config.model} holds "
            f"{shape.max_position_embeddings}; lower --max-response-len"
        )
    heads = getattr(shape, "num_key_value_heads", None) or shape.num_attention_heads
    head_dim = getattr(shape, "head_dim", None) or shape.hidden_size // shape.num_attention_heads
    dtype_bytes = (
        2
        if config.dtype in ("bfloat16", "float16") or (config.dtype == "auto" and device.type == "cuda")
        else 4
    )
    per_token = 2 * shape.num_hidden_layers * heads * head_dim * dtype_bytes
    need = per_token * config.max_running_requests * config.max_context_len
    have = _device_memory(device)
    if have is not None and need > have:
        raise ConfigError(
            f"the hf engine's KV cache needs {need / 2**30:,.1f} GiB ({config.max_running_requests} slots x "
            f"{config.max_context_len} tokens) but the {device.type} has {have / 2**30:,.1f} GiB; lower "
            "--max-response-len or --engine-arg max_running_requests"
        )


def _device_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--engine-arg device=cuda but no CUDA device is visible; use device=cpu")
    return device


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {
            "float32": torch.float32,
            "bfloat16": torch.bfloat16,
            "float16": torch.float16,
            "float64": torch.float64,
        }[name]
    except KeyError:
        raise ConfigError(
            f"dtype must be float32, bfloat16, float16, float64 or auto; got {name!r}"
        ) from None


def _config_eos(config: Any) -> tuple[int, ...]:
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
