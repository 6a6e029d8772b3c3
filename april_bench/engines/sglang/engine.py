"""The ``sglang`` engine: the Engine protocol over SGLang's native HTTP API.

One non-streaming ``POST /generate`` per request, with ``rid``,
``input_ids``, ``return_logprob`` and the sampling parameters.  Why not
streaming: APRIL needs the final tokens and log-probs of every request, and an
aborted request's ``/generate`` already returns them in-band (HTTP 200,
``finish_reason.type == "abort"``) - the same contract the APRIL reference
relies on.  Streaming would only add TTFT; cumulative chunks cost O(n^2) JSON,
incremental ones one HTTP chunk per token for hundreds of requests, and a
dropped stream loses the partial (SGLang aborts it 2 s later, unreported).
With ``enable_metrics`` the server reports ``first_token_latency`` anyway.

Request ids: SGLang aborts by rid *prefix* and rejects duplicate in-flight
rids, so each submission gets ``rid = f"{request_id}#{uuid4().hex}"``: fixed-
length unique suffixes are never a prefix of one another, and our id stays
readable in server logs.

``abort(None)`` is ``{"abort_all": true}``.  Abort is asynchronous in SGLang:
a request still in transit (or held by a pause or weight update) when the
abort arrives lands later and runs on, and SGLang ignores a second abort of
the same rid - only abort-all catches it, which is what the rollout loop's
re-abort sends.

Weights: ``WeightUpdate.path`` -> ``/update_weights_from_disk`` (a Hugging
Face checkpoint directory) with ``weight_version = str(version)``; a
version-only update -> ``/update_weight_version``.  Over a process group
(:class:`~april_bench.collective.EngineWorkers`): ``/init_weights_update_group``
(``master_address``, ``master_port``, ``rank_offset``, ``world_size``,
``group_name``, ``backend``) once, then per update
``/update_weights_from_distributed`` (``names``, ``dtypes``, ``shapes``,
``group_name``, ``flush_cache``, ``weight_version``) while the sender
broadcasts each tensor in that order.  Every completion's
``meta_info.weight_version`` (or ``weight_versions`` spans) is parsed back
into its policy version, so versions come from the server, not from us.

Sleep (``--colocate``): ``POST /release_memory_occupation {}`` frees the
weights, the KV cache and the CUDA graphs (every tag) and
``/resume_memory_occupation {}`` takes them back; a launched server gets
``--enable-memory-saver``, which SGLang needs for both.  The level is not
SGLang's notion: every tag is released, and the weight update after the wake
loads the new weights.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.protocol import (
    HEALTH,
    KILL,
    METRICS,
    SLEEP,
    Capability,
    Completion,
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineSettings,
    GenerateRequest,
    WeightUpdate,
)
from april_bench.engines.server.adapter import ServerAdapter, loopback_url
from april_bench.engines.server.health import freeze_server, kill_server
from april_bench.engines.server.http import HTTPClient, HTTPError
from april_bench.engines.server.metrics import parse_prometheus
from april_bench.engines.server.process import ServerHandle, ServerProcess, flag_args
from april_bench.engines.sglang.wire import VersionMap, error_message, generate_payload, parse_generate_output
from april_bench.engines.stream import CompletionStream

__all__ = ["SGLangEngine", "launch_command"]

#: What the adapter implements beyond the protocol (:attr:`EngineInfo.capabilities`).
_CAPABILITIES: frozenset[Capability[Any]] = frozenset({HEALTH, KILL, METRICS, SLEEP})

MIN_SGLANG = "0.5.9"  # oldest version whose API this adapter was checked against (/v1/loads, sampling_seed)

#: The weight group's name on the server (``group_name`` of ``/init_weights_update_group``).
WEIGHT_GROUP = "april_bench_weights"

#: Seconds an attached server may refuse connections before the run stops (nothing listens there).
ATTACH_REFUSED_S = 3.0


@dataclass(slots=True)
class _InFlight:
    rid: str
    task: asyncio.Task[None]


class SGLangEngine(ServerAdapter, Configurable):
    """An SGLang server, launched on loopback by april-bench or attached by URL."""

    server_name = engine_title = "sglang"

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        model_path: str | None = param(None, help="checkpoint to launch SGLang with (omit to attach by url)")
        url: str | None = param(
            None, help="attach to a running SGLang server (http://host:port or https://host:port)"
        )
        eos_token_ids: tuple[int, ...] = param(
            (), help="the tokenizer's EOS ids: stop ids of every request, and how an abort on EOS is told"
        )
        context_length: int | None = param(None, help="--context-length of a launched server")
        seed: int = param(0, help="--random-seed of a launched server")
        deterministic: bool = param(
            False, help="--enable-deterministic-inference: SGLang honours per-request seeds only then"
        )
        tp_size: int = param(1, help="--tp-size of a launched server")
        mem_fraction_static: float | None = param(None, help="--mem-fraction-static (None: SGLang's choice)")
        max_running_requests: int | None = param(None, help="--max-running-requests (None: SGLang's choice)")
        chunked_prefill_size: int | None = param(None, help="--chunked-prefill-size (None: SGLang's choice)")
        enable_metrics: bool = param(True, help="--enable-metrics: /metrics and first-token latency")
        enable_memory_saver: bool = param(
            False, help="--enable-memory-saver: release and resume memory (set by --colocate)"
        )
        engine_args: dict[str, Any] = param(
            help="more launch flags, appended as --name value (True: bare flag)", default_factory=dict
        )
        env: dict[str, str] = param(
            help="extra environment of a launched server (e.g. SGLANG_RETURN_ORIGINAL_LOGPROB=1)",
            default_factory=dict,
        )
        python: str = param("", help="interpreter with sglang installed (default: this one)")
        launch_module: str = param("sglang.launch_server", help="module run with python -m to launch")
        host: str = param("127.0.0.1", help="address a launched server binds (loopback)")
        port: int | None = param(None, help="port of a launched server (None: a free one)")
        api_key: str | None = param(None, help="SGLang --api-key (sent as a bearer token)")
        launch_timeout_s: float = param(900.0, help="seconds to wait for the server to become healthy")
        control_timeout_s: float = param(60.0, help="timeout of abort, load and info calls")
        weight_update_timeout_s: float = param(1800.0, help="timeout of a weight update")
        max_connections: int = param(4096, help="HTTP connections to the server (one per running request)")
        log_file: str | None = param(None, help="a launched server's log (default: a temp file)")

        def __post_init__(self) -> None:
            if self.model_path and self.url:
                raise ConfigError("set either model_path (launch SGLang) or url (attach), not both")
            if self.url is not None and not self.url.startswith(("http://", "https://")):
                raise ConfigError(f"url must start with http:// or https://, got {self.url!r}")
            if self.tp_size < 1 or self.max_connections < 1:
                raise ConfigError("tp_size and max_connections must be >= 1")

    def __init__(self, config: Config, *, server: ServerHandle | None = None) -> None:
        """``server``: a server to start and stop with the engine (an in-process fake, for tests)."""
        if server is None and config.model_path:
            port, url = loopback_url(config.host, config.port)
            server = ServerProcess(
                launch_command(config, port),
                url=url,
                env=config.env,
                log_path=config.log_file,
                health_timeout_s=config.launch_timeout_s,
                headers=_headers(config),
            )
        elif server is None and not config.url:
            raise ConfigError("the sglang engine needs model_path (to launch a server) or url (to attach)")
        self.config = config
        self.server = server
        self._client: HTTPClient | None = None
        self._inflight: dict[str, _InFlight] = {}
        self._versions = VersionMap("default")
        self._info = EngineInfo(
            name="sglang",
            simulated=False,
            produces_tokens=True,
            virtual_time=False,
            model=config.model_path or "",
            weight_formats=("path", "none"),
            capabilities=_CAPABILITIES,
        )
        self._snapshot: dict[str, float] = {}
        self._counters = {"requests": 0, "aborted_requests": 0, "generation_tokens": 0, "preemptions": 0}

    # ------------------------------------------------------------ lifecycle
    @property
    def info(self) -> EngineInfo:
        return self._info

    async def start(self) -> None:
        c = self.config
        if not await self._connect(headers=_headers(c), max_connections=c.max_connections):
            return
        try:
            await self._describe()
        except BaseException:
            await self.close()
            raise

    async def _describe(self) -> None:
        await self._wait_healthy()  # an attached server may still be loading its model
        server = await self._get_json("/server_info")
        model = await self._get_json("/model_info")
        loads = await self._get_json("/v1/loads", params={"include": "core"})
        self._versions = VersionMap(str(model.get("weight_version", "default")))
        fake = server.get("april_bench_fake")
        version = server.get("version")
        accelerator, count = loads.get("accelerator"), loads.get("num_accelerators")
        self._info = EngineInfo(
            name="sglang",
            simulated=fake is not None,
            produces_tokens=True,
            virtual_time=False,
            model=str(model.get("model_path") or self.config.model_path or ""),
            version=None if version is None else (f"{version} (april-bench fake)" if fake else str(version)),
            hardware=f"{count}x {accelerator}" if accelerator else "",
            weight_formats=("path", "none"),
            capabilities=_CAPABILITIES,
        )

    async def _wait_healthy(self) -> None:
        """Wait for ``GET /health``: a launched server up to ``launch_timeout_s``; an attached one that
        refuses connections fails after :data:`ATTACH_REFUSED_S` (nothing listens there: a server still
        loading its model accepts connections)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.launch_timeout_s
        refused_since: float | None = None
        while True:
            try:
                if (await self._http.get("/health", timeout=self.config.control_timeout_s)).status == 200:
                    return
                refused_since = None
            except HTTPError as exc:
                if self.server is None and str(exc).startswith("cannot connect"):
                    refused_since = loop.time() if refused_since is None else refused_since
                    if loop.time() - refused_since >= ATTACH_REFUSED_S:
                        raise EngineError(
                            f"nothing answers at {self.url} (connections refused for "
                            f"{ATTACH_REFUSED_S:g} s): start the SGLang server there, or fix --engine-url"
                        ) from None
            if loop.time() > deadline:
                raise EngineError(f"the sglang server at {self.url} is not healthy (GET /health)")
            await asyncio.sleep(0.5)

    async def kill(self) -> None:
        """Fault injection (:data:`~april_bench.engines.protocol.KILL`): SIGKILL the launched server."""
        kill_server(self.server, name="sglang")

    async def hang(self) -> None:
        """Fault injection: SIGSTOP the launched server, so it answers nothing."""
        freeze_server(self.server, name="sglang")

    async def close(self) -> None:
        """Fail what is still in flight, close the connections, stop a launched server."""
        inflight, self._inflight = self._inflight, {}
        for entry in inflight.values():
            entry.task.cancel()
        await asyncio.gather(*(e.task for e in inflight.values()), return_exceptions=True)
        await self._disconnect()

    # ------------------------------------------------------------ generation
    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        if self._client is None:
            raise EngineError("the sglang engine is not started: await engine.start() first")
        stream = CompletionStream(len(requests))
        for request in requests:
            if request.request_id in self._inflight:
                raise EngineError(f"request id {request.request_id!r} is already in flight")
            rid = f"{request.request_id}#{uuid.uuid4().hex}"
            task = asyncio.ensure_future(self._run(request, rid, stream))
            self._inflight[request.request_id] = _InFlight(rid, task)
            self._counters["requests"] += 1
        return stream

    async def _run(self, request: GenerateRequest, rid: str, stream: CompletionStream) -> None:
        loop = asyncio.get_running_loop()
        t_sent = loop.time()
        try:
            payload = generate_payload(request, rid, self.config.eos_token_ids)
            response = await self._http.post("/generate", payload)  # no timeout: requests run long
            if response.status != 200:
                message = error_message(response.body, response.status)
                raise EngineError(f"sglang rejected {request.request_id}: {message}")
            out = parse_generate_output(
                response.json(), request, versions=self._versions, eos_token_ids=self.config.eos_token_ids
            )
        except asyncio.CancelledError:
            stream.fail(EngineError(f"the sglang engine was closed with {request.request_id} in flight"))
            raise
        except HTTPError as exc:
            stream.fail(EngineError(f"sglang /generate for {request.request_id} failed: {exc}"))
            return
        except (EngineError, ValueError) as exc:
            stream.fail(exc if isinstance(exc, EngineError) else EngineError(f"{request.request_id}: {exc}"))
            return
        finally:
            self._inflight.pop(request.request_id, None)
        now = loop.time()
        n = len(out.output_ids)
        self._counters["generation_tokens"] += n
        self._counters["preemptions"] += out.num_retractions
        if out.finish_reason == "abort":
            self._counters["aborted_requests"] += 1
        latency = out.first_token_latency
        stream.deliver(
            Completion(
                request_id=request.request_id,
                num_tokens=n,
                finish_reason=out.finish_reason,
                policy_version=out.policy_version,
                t_done=now,
                t_first_token=t_sent + latency if latency is not None and n else None,
                output_ids=out.output_ids,
                logprobs=out.logprobs,
                num_retractions=out.num_retractions,
            )
        )

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        if request_ids is None:
            await self._post_ok("/abort_request", {"rid": "", "abort_all": True})
            return
        rids = [self._inflight[i].rid for i in request_ids if i in self._inflight]
        await asyncio.gather(*(self._post_ok("/abort_request", {"rid": rid}) for rid in rids))

    async def load(self) -> EngineLoad:
        body = await self._get_json("/v1/loads", params={"include": "core,queues"})
        loads = body.get("loads") or []
        total = {key: sum(int(d.get(key) or 0) for d in loads) for key in _LOAD_KEYS}
        capacity = total["max_total_num_tokens"]
        retracted = sum(int((d.get("queues") or {}).get("retracted") or 0) for d in loads)
        self._snapshot = {
            "running": float(total["num_running_reqs"]),
            "waiting": float(total["num_waiting_reqs"]),
            "kv_usage": total["num_used_tokens"] / capacity if capacity else 0.0,
            "retracted_waiting": float(retracted),
            **{f"sglang_{key}": float(value) for key, value in total.items()},
        }
        return EngineLoad(
            running=total["num_running_reqs"],
            waiting=total["num_waiting_reqs"],
            kv_tokens_used=total["num_used_tokens"],
            kv_tokens_capacity=total["max_total_num_tokens"] or None,
        )

    async def update_weights(self, update: WeightUpdate) -> None:
        if self._inflight:
            raise EngineError("update_weights while requests are in flight: abort and drain first")
        version = str(update.version)
        if update.format == "state_dict":
            raise EngineError(
                "the sglang engine takes weights as a checkpoint directory (WeightUpdate.path), "
                "not a state dict"
            )
        if update.format == "path":
            body = {"model_path": update.path, "weight_version": version, "flush_cache": True}
            path = "/update_weights_from_disk"
        else:
            body, path = {"new_version": version, "abort_all_requests": False}, "/update_weight_version"
        try:
            response = await self._http.post(path, body, timeout=self.config.weight_update_timeout_s)
        except HTTPError as exc:
            raise EngineError(f"sglang POST {path} at {self.url} failed: {exc}") from None
        if response.status != 200:
            raise EngineError(f"sglang {path} failed: {error_message(response.body, response.status)}")

    # ------------------------------------------ weights over a process group (collective.EngineWorkers)
    def weight_workers(self) -> int:
        """The server's tensor-parallel workers, each a receiving rank (``rank_offset + tp_rank``)."""
        return self.config.tp_size

    def weight_wire(self) -> str:
        return "per_tensor"  # SGLang's: one broadcast per tensor, names, dtypes and shapes by HTTP

    async def join_weight_group(self, address: str, first: int, world: int, backend: str) -> None:
        """``/init_weights_update_group``: the server's workers join the group the sender hosts at
        ``address`` (blocks until every member joined)."""
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        body = {
            "master_address": host,
            "master_port": int(port),
            "rank_offset": first,
            "world_size": world,
            "group_name": WEIGHT_GROUP,
            "backend": backend,
        }
        await self._post_success("/init_weights_update_group", body)

    async def receive_weights(self, version: int, header: dict[str, list[Any]] | None = None) -> None:
        """``/update_weights_from_distributed``: the workers receive one broadcast per tensor of
        ``header`` and load them; completions after it carry ``version`` (its ``weight_version``)."""
        if header is None:
            raise EngineError("the sglang engine receives weights per tensor: it needs their header")
        if self._inflight:
            raise EngineError("receive_weights while requests are in flight: abort and drain first")
        body = {
            **header,
            "group_name": WEIGHT_GROUP,
            "flush_cache": True,
            "abort_all_requests": False,
            "weight_version": str(version),
        }
        await self._post_success("/update_weights_from_distributed", body)

    async def _post_success(self, path: str, body: dict[str, Any]) -> None:
        """A weight route: HTTP 200 with ``{"success": true, ...}``, else one error with its message."""
        try:
            response = await self._http.post(path, body, timeout=self.config.weight_update_timeout_s)
        except HTTPError as exc:
            raise EngineError(f"sglang POST {path} at {self.url} failed: {exc}") from None
        data = response.json() if response.status == 200 else None
        if not isinstance(data, dict) or not data.get("success", False):
            message = data.get("message") if isinstance(data, dict) else None
            raise EngineError(
                f"sglang {path} failed: {message or error_message(response.body, response.status)}"
            )

    # ------------------------------------------------------- SGLang extras
    def metrics(self) -> dict[str, float]:
        """Our counters, plus the server's load as of the last :meth:`load` or :meth:`refresh_metrics`."""
        return {**{k: float(v) for k, v in self._counters.items()}, **self._snapshot}

    async def refresh_metrics(self) -> dict[str, float]:
        """Fetch ``/v1/loads`` and, if the server serves it, ``/metrics``; then :meth:`metrics`."""
        await self.load()
        response = await self._http.get("/metrics", timeout=self.config.control_timeout_s)
        if response.status == 200:
            self._snapshot |= parse_prometheus(response.text, prefix="sglang:")
        return self.metrics()

    async def pause_generation(self, mode: str = "abort") -> None:
        """``/pause_generation``: ``abort`` everything, ``retract`` to the queue, or freeze ``in_place``."""
        await self._post_ok("/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        await self._post_ok("/continue_generation", {})

    async def sleep(self, level: int) -> None:
        """``/release_memory_occupation`` of every tag (:class:`~april_bench.engines.protocol.Sleepable`;
        ``level`` is vLLM's notion: SGLang releases weights, KV cache and CUDA graphs alike)."""
        if self._inflight:
            raise EngineError("sleep with requests in flight: abort and drain first")
        await self._post_ok("/release_memory_occupation", {}, timeout=self.config.weight_update_timeout_s)

    async def wake_up(self) -> None:
        await self._post_ok("/resume_memory_occupation", {}, timeout=self.config.weight_update_timeout_s)

    async def flush_cache(self) -> bool:
        """``/flush_cache``: False when SGLang refuses because requests are running or queued."""
        response = await self._http.post("/flush_cache", timeout=self.config.control_timeout_s)
        return response.status == 200

    # ---------------------------------------------------------------- HTTP
    async def _get_json(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        try:
            response = await self._http.get(path, params, timeout=self.config.control_timeout_s)
            data = response.json() if response.status == 200 else None
        except HTTPError as exc:
            raise EngineError(f"sglang GET {path} at {self.url} failed: {exc}") from None
        except ValueError:
            raise EngineError(f"sglang GET {path} returned a body that is not JSON") from None
        if response.status == 404:
            raise EngineError(
                f"the server at {self.url} has no {path}: april-bench needs sglang>={MIN_SGLANG}"
            )
        if response.status != 200:
            raise EngineError(f"sglang GET {path}: {error_message(response.body, response.status)}")
        if not isinstance(data, dict):
            raise EngineError(f"sglang GET {path} returned {type(data).__name__}, not an object")
        return data

    async def _post_ok(self, path: str, body: dict[str, Any], timeout: float | None = None) -> None:
        try:
            response = await self._http.post(path, body, timeout=timeout or self.config.control_timeout_s)
        except HTTPError as exc:
            raise EngineError(f"sglang POST {path} at {self.url} failed: {exc}") from None
        if response.status != 200:
            raise EngineError(f"sglang POST {path}: {error_message(response.body, response.status)}")


def _headers(config: SGLangEngine.Config) -> dict[str, str]:
    return {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}


_LOAD_KEYS = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens")


def check_installed(config: SGLangEngine.Config, settings: EngineSettings) -> None:
    """Refuse a server this machine cannot launch, before launching anything: SGLang must be installed
    here or in ``python=``, unless ``url`` attaches to a running server."""
    if config.url is None and not config.python and importlib.util.find_spec("sglang") is None:
        raise ConfigError(
            "engine sglang: SGLang is not installed here (it needs CUDA: pip install 'sglang[all]'); point "
            "--engine-arg python=/path/to/env/bin/python at an environment that has it, or attach to a "
            "running server with --engine-url http://host:port"
        )


def serve(config: SGLangEngine.Config, settings: EngineSettings) -> SGLangEngine:
    """SGLang serving the experiment's starting checkpoint (launched on loopback) unless the options
    name a ``model_path`` or attach by ``url``."""
    check_installed(config, settings)
    if config.url is None and config.model_path is None:
        if settings.checkpoint is None:
            raise ConfigError("engine sglang needs a checkpoint directory to serve; this task has none")
        config = config.replace(model_path=settings.checkpoint())
    return config.build()


def launch_command(config: SGLangEngine.Config, port: int) -> list[str]:
    """``python -m sglang.launch_server ...`` for ``config``: ids in, ids out, on ``host:port``."""
    flags: dict[str, Any] = {
        "--model-path": config.model_path,
        "--host": config.host,
        "--port": port,
        "--skip-tokenizer-init": True,
        "--tp-size": config.tp_size,
        "--random-seed": config.seed,
        "--weight-version": "0",
        "--context-length": config.context_length,
        "--mem-fraction-static": config.mem_fraction_static,
        "--max-running-requests": config.max_running_requests,
        "--chunked-prefill-size": config.chunked_prefill_size,
        "--enable-metrics": config.enable_metrics,
        "--enable-deterministic-inference": config.deterministic,
        "--enable-memory-saver": config.enable_memory_saver,
        "--api-key": config.api_key,
    }
    words = [config.python or sys.executable, "-m", config.launch_module]
    for name, value in [*flags.items(), *config.engine_args.items()]:
        words += flag_args(name, value)
    return words
