"""A fake SGLang server: SGLang 0.5.23's native HTTP API over a deterministic token rule.

Run it in-process (``FakeSGLangServer.Config(...).build()``, ``await start()``)
or as a process that accepts ``sglang.launch_server``'s core flags::

    python -m april_bench.engines.sglang.fake_server --model-path fake --port 30000 \\
        --max-running-requests 64 --decode-step-s 0.02 --http-latency-s 0.005

so :class:`~april_bench.engines.sglang.SGLangEngine` can launch it exactly as
it launches SGLang (``launch_module="april_bench.engines.sglang.fake_server"``).

Endpoints (same paths, bodies and status codes as SGLang): ``/generate``,
``/abort_request``, ``/pause_generation``, ``/continue_generation``,
``/flush_cache``, ``/update_weights_from_disk``, ``/update_weight_version``,
``/init_weights_update_group`` and ``/update_weights_from_distributed`` (the fake
really joins the sender's gloo group, april-bench's
:class:`~april_bench.collective.WeightGroup`, as one worker, and receives every
tensor; it keeps them for ``/get_weights_by_name`` and computes nothing with them),
``/release_memory_occupation``, ``/resume_memory_occupation``,
``/health``, ``/health_generate``, ``/ready``, ``/server_info`` and
``/get_server_info``, ``/model_info`` and ``/get_model_info``, ``/v1/loads``,
and ``/metrics`` with ``--enable-metrics``.  What each request state does on
abort is described in :mod:`.fake_scheduler`.

Timing: every decode step gives each running request one token and takes
``decode_step_s + decode_step_per_request_s * batch + prefill_s_per_token *
tokens admitted``; at most ``max_running_requests`` run, the rest wait; a
request reaches the scheduler ``http_latency_s`` after the server receives it.

Deviations from real SGLang, on purpose or for lack of a model:

* ids in, ids out only (as ``--skip-tokenizer-init``): no ``text``, no tokenizer;
  one request per ``/generate`` call (no batches), no ``stream``, no ``n > 1``;
* ``sampling_seed`` is always honoured (SGLang only with
  ``--enable-deterministic-inference``); a request without one uses
  ``--random-seed``; ``temperature`` 0 ignores the seed; ``top_p``/``top_k``
  are accepted and ignored;
* no prefix cache (``cached_tokens`` is always 0), no chunked prefill, no
  speculative decoding, one data-parallel rank; ``--tp-size``,
  ``--mem-fraction-static``, ``--chunked-prefill-size`` are accepted and ignored;
* the KV pool (``--max-total-tokens``, unlimited by default) admits a request
  while 20 more decode steps fit, and retracts the requests with the fewest
  output tokens when a step no longer fits - SGLang's rules, without its
  ``new_token_ratio`` reservation;
* a weight update checks that ``model_path`` is a directory and sleeps
  ``weight_load_s``; it loads nothing;
* memory release and resume work without ``--enable-memory-saver``, record
  each call (:attr:`FakeSGLangServer.memory_calls`), and take
  ``memory_switch_s``; a release with requests running or queued, and a
  ``/generate`` while released, get HTTP 400 (SGLang has no guard there: a
  request would run on freed memory);
* a client that disconnects has its request aborted at once (SGLang polls
  every 4 s); data a client sends while its request is pending closes the
  connection (HTTP/1.1 without pipelining, which is all httpx does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.sglang.fake_http import (
    JSON,
    TEXT,
    Call,
    Disconnected,
    Response,
    json_response,
    serve_connection,
)
from april_bench.engines.sglang.fake_requests import FakeSettings, RequestError
from april_bench.engines.sglang.fake_scheduler import FakeScheduler

__all__ = ["FakeSGLangServer", "main"]

SGLANG_API_VERSION = "0.5.23"  # the API this fake answers like


class FakeSGLangServer(Configurable):
    """An asyncio HTTP/1.1 server on loopback that answers like SGLang."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        host: str = param("127.0.0.1", help="address to bind (keep it on loopback)")
        port: int = param(0, help="port to bind (0: any free port)")
        model_path: str = param("fake-model", help="reported as the model path; nothing is loaded")
        weight_version: str = param("default", help="initial weight version label (SGLang --weight-version)")
        decode_step_s: float = param(0.01, help="seconds per decode step (one token per running request)")
        decode_step_per_request_s: float = param(
            0.0, help="extra seconds per decode step per running request"
        )
        prefill_s_per_token: float = param(0.0, help="extra seconds per token admitted (prefill) in a step")
        http_latency_s: float = param(
            0.0, help="seconds from receiving a request to it reaching the scheduler"
        )
        max_running_requests: int = param(64, help="requests decoded together; the rest wait")
        max_total_tokens: int | None = param(None, help="KV pool tokens (None: unlimited, never retracts)")
        context_length: int = param(32768, help="prompt + max_new_tokens limit; longer requests get HTTP 400")
        vocab_size: int = param(32000, help="token ids are drawn from [0, vocab_size)")
        eos_token_id: int = param(2, help="the model's EOS id")
        eos_probability: float = param(0.0, help="chance of EOS at each position (0: run to max_new_tokens)")
        force_stream_interval: int = param(
            50, help="a non-streaming request's tokens reach the tokenizer every N"
        )
        weight_load_s: float = param(0.0, help="seconds a weight update takes")
        memory_switch_s: float = param(0.0, help="seconds a memory release or resume takes")
        random_seed: int = param(0, help="seed of requests that carry no sampling_seed")
        enable_metrics: bool = param(False, help="serve /metrics and timing fields (SGLang --enable-metrics)")
        api_key: str | None = param(None, help="require 'Authorization: Bearer <key>' (SGLang --api-key)")
        startup_s: float = param(0.0, help="seconds /health answers 503 after start (a model load)")

        def __post_init__(self) -> None:
            if self.decode_step_s <= 0:
                raise ConfigError("decode_step_s must be > 0")
            for name in ("decode_step_per_request_s", "prefill_s_per_token", "http_latency_s"):
                if getattr(self, name) < 0:
                    raise ConfigError(f"{name} must be >= 0")
            if self.max_running_requests < 1 or self.force_stream_interval < 1:
                raise ConfigError("max_running_requests and force_stream_interval must be >= 1")
            if not 0 <= self.eos_token_id < self.vocab_size:
                raise ConfigError(f"eos_token_id must be in [0, vocab_size={self.vocab_size})")
            if not 0 <= self.eos_probability < 1:
                raise ConfigError("eos_probability must be in [0, 1)")

    def __init__(self, config: Config) -> None:
        self.config = config
        self.scheduler: FakeScheduler | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._port = config.port
        self._ready_at = 0.0
        self._model_path = config.model_path
        #: Every release and resume, in order, with the tags asked for (``None``: all).
        self.memory_calls: list[tuple[str, list[str] | None]] = []
        self.released = False
        #: ``/init_weights_update_group``'s groups by name (april_bench.collective.WeightGroup: this
        #: fake is one worker, rank ``rank_offset``), and the tensors the last update received.
        self.weight_groups: dict[str, Any] = {}
        self.received: dict[str, Any] = {}
        self._routes: dict[str, dict[str, Callable[[Call], Awaitable[Response]]]] = {
            "/generate": {"POST": self._generate, "PUT": self._generate},
            "/abort_request": {"POST": self._abort},
            "/pause_generation": {"POST": self._pause},
            "/continue_generation": {"POST": self._continue},
            "/flush_cache": {"GET": self._flush_cache, "POST": self._flush_cache},
            "/update_weights_from_disk": {"POST": self._update_weights_from_disk},
            "/update_weight_version": {"POST": self._update_weight_version},
            "/init_weights_update_group": {"POST": self._init_weights_update_group},
            "/update_weights_from_distributed": {"POST": self._update_weights_from_distributed},
            "/get_weights_by_name": {"GET": self._get_weights_by_name, "POST": self._get_weights_by_name},
            "/release_memory_occupation": {"GET": self._release, "POST": self._release},
            "/resume_memory_occupation": {"GET": self._resume, "POST": self._resume},
            "/health": {"GET": self._health},
            "/health_generate": {"GET": self._health},
            "/ready": {"GET": self._health},
            "/server_info": {"GET": self._server_info},
            "/get_server_info": {"GET": self._server_info},
            "/model_info": {"GET": self._model_info},
            "/get_model_info": {"GET": self._model_info},
            "/v1/loads": {"GET": self._loads},
        }
        if config.enable_metrics:
            self._routes["/metrics"] = {"GET": self._metrics}

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self._port}"

    async def start(self) -> None:
        c = self.config
        settings = FakeSettings(
            **{f.name: getattr(c, f.name) for f in dataclasses.fields(FakeSettings)}  # same names
        )
        self.scheduler = FakeScheduler(settings, c.weight_version)
        self.scheduler.start()
        self._server = await asyncio.start_server(self._serve, c.host, c.port, limit=1 << 24)
        self._port = self._server.sockets[0].getsockname()[1]
        self._ready_at = asyncio.get_running_loop().time() + c.startup_s

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self.scheduler is not None:
            await self.scheduler.stop()
            self.scheduler = None

    # ------------------------------------------------------------------ HTTP
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await serve_connection(reader, writer, self._dispatch)
        finally:
            self._connections.discard(task)

    async def _dispatch(
        self, method: str, target: str, headers: dict[str, str], body: bytes, reader: asyncio.StreamReader
    ) -> Response:
        path, _, query = target.partition("?")
        methods = self._routes.get(path)
        if methods is None:
            return json_response(404, {"detail": "Not Found"})
        handler = methods.get(method)
        if handler is None:
            return json_response(405, {"detail": "Method Not Allowed"})
        key = self.config.api_key
        if (
            key
            and path not in ("/health", "/health_generate")
            and headers.get("authorization") != f"Bearer {key}"
        ):
            return json_response(401, {"error": "Unauthorized"})
        try:
            data = json.loads(body) if body else {}
        except ValueError as exc:
            return json_response(400, {"error": {"message": f"invalid JSON body: {exc}"}})
        if not isinstance(data, dict):
            return json_response(400, {"error": {"message": "the body must be a JSON object"}})
        call = Call(data, {k: v[-1] for k, v in parse_qs(query).items()}, reader)
        try:
            return await handler(call)
        except RequestError as exc:
            return json_response(400, {"error": {"message": str(exc)}})

    @property
    def _sched(self) -> FakeScheduler:
        assert self.scheduler is not None, "the fake server is not started"
        return self.scheduler

    # ---------------------------------------------------------------- routes
    async def _generate(self, call: Call) -> Response:
        if self.released:
            raise RequestError("the fake SGLang server released its memory: resume_memory_occupation first")
        if call.data.get("stream"):
            raise RequestError("the fake SGLang server does not stream; send stream=false")
        if (
            isinstance(call.data.get("input_ids"), list)
            and call.data["input_ids"]
            and isinstance(call.data["input_ids"][0], list)
        ):
            raise RequestError("the fake SGLang server takes one request per /generate call")
        request = self._sched.submit(call.data)
        future = request.future
        gone: asyncio.Future[Any] = asyncio.ensure_future(call.reader.read(1))
        try:
            await asyncio.wait([future, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
        if not future.done():  # the client went away: SGLang aborts the request and drops its output
            self._sched.abort(request.rid)
            raise Disconnected
        return json_response(200, future.result())

    async def _release(self, call: Call) -> Response:
        if self._sched.running or self._sched.waiting:
            raise RequestError("release_memory_occupation with requests running or queued")
        if self.released:
            raise RequestError("the memory is released already")
        self.memory_calls.append(("release", call.data.get("tags")))
        self.released = True
        await asyncio.sleep(self.config.memory_switch_s)
        return 200, JSON, b""

    async def _resume(self, call: Call) -> Response:
        if not self.released:
            raise RequestError("resume_memory_occupation: the memory is not released")
        self.memory_calls.append(("resume", call.data.get("tags")))
        await asyncio.sleep(self.config.memory_switch_s)
        self.released = False
        return 200, JSON, b""

    async def _abort(self, call: Call) -> Response:
        self._sched.abort(str(call.data.get("rid") or ""), bool(call.data.get("abort_all", False)))
        return 200, JSON, b""

    async def _pause(self, call: Call) -> Response:
        await self._sched.pause(str(call.data.get("mode", "abort")))
        return json_response(200, {"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, call: Call) -> Response:
        self._sched.resume()
        return json_response(200, {"message": "Generation continued successfully.", "status": "ok"})

    async def _flush_cache(self, call: Call) -> Response:
        if self._sched.running or self._sched.waiting:
            return 400, TEXT, b"Flush cache failed: requests are running or queued.\n"
        return 200, TEXT, b"Cache flushed.\nPlease check backend logs for more details.\n"

    async def _update_weights_from_disk(self, call: Call) -> Response:
        if not isinstance(call.data.get("model_path"), str):
            raise RequestError("model_path (a checkpoint directory) is required")
        version = call.data.get("weight_version")
        ok, message = await self._sched.update_weights(
            call.data["model_path"],
            None if version is None else str(version),
            abort_all=bool(call.data.get("abort_all_requests", False)),
            flush=bool(call.data.get("flush_cache", True)),
        )
        if ok:
            self._model_path = call.data["model_path"]
            if version is not None:
                message += f" Weight version updated to {version}."
        return json_response(
            200 if ok else 400, {"success": ok, "message": message, "num_paused_requests": 0}
        )

    async def _init_weights_update_group(self, call: Call) -> Response:
        """Join the sender's group as rank ``rank_offset`` (SGLang: ``rank_offset + tp_rank`` per
        worker; this fake has one).  Blocks until every member joined, as SGLang's does."""
        from april_bench.collective import WeightGroup

        fields = ("master_address", "master_port", "rank_offset", "world_size")
        missing = [f for f in fields if f not in call.data]
        if missing:
            raise RequestError(f"{', '.join(missing)} required")
        d = call.data
        address = f"tcp://{d['master_address']}:{int(d['master_port'])}"
        try:
            group = await asyncio.to_thread(
                WeightGroup,
                address,
                int(d["rank_offset"]),
                int(d["world_size"]),
                backend=str(d.get("backend", "nccl")),
            )
        except Exception as exc:  # SGLang answers success=False with the reason
            return json_response(200, {"success": False, "message": f"Failed to init group: {exc}."})
        self.weight_groups[str(d.get("group_name", "weight_update_group"))] = group
        return json_response(200, {"success": True, "message": "Succeeded to init group."})

    async def _update_weights_from_distributed(self, call: Call) -> Response:
        """Receive one broadcast per named tensor from the group's rank 0 (under the writer lock, as a
        disk update); the tensors are kept (``received``, ``/get_weights_by_name``), nothing computes
        with them."""
        d = call.data
        names, dtypes, shapes = d.get("names"), d.get("dtypes"), d.get("shapes")
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)):
            raise RequestError("names, dtypes and shapes (lists) are required")
        if not len(names) == len(dtypes) == len(shapes):
            raise RequestError("names, dtypes and shapes must have the same length")
        group = self.weight_groups.get(str(d.get("group_name", "weight_update_group")))
        if group is None:
            raise RequestError(f"no weight update group {d.get('group_name')!r}: init it first")

        async def load() -> str | None:
            try:
                self.received = await asyncio.to_thread(group.receive_each, names, dtypes, shapes)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return None

        version = d.get("weight_version")
        ok, message = await self._sched.update_weights(
            None,
            None if version is None else str(version),
            abort_all=bool(d.get("abort_all_requests", False)),
            flush=bool(d.get("flush_cache", True)),
            load=load,
        )
        return json_response(200 if ok else 400, {"success": ok, "message": message})

    async def _get_weights_by_name(self, call: Call) -> Response:
        """The first ``truncate_size`` rows of a tensor the last distributed update received."""
        name = call.data.get("name")
        if name not in self.received:
            raise RequestError(f"no received tensor {name!r} (the fake loads weights only from a group)")
        rows = self.received[name][: int(call.data.get("truncate_size", 100))]
        return json_response(200, rows.tolist())

    async def _update_weight_version(self, call: Call) -> Response:
        if "new_version" not in call.data:
            raise RequestError("new_version is required")
        if call.data.get("abort_all_requests", True):
            self._sched.abort(abort_all=True)
        version = str(call.data["new_version"])
        self._sched.set_version(version)
        body = {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        return json_response(200, body)

    async def _health(self, call: Call) -> Response:
        up = asyncio.get_running_loop().time() >= self._ready_at
        return (200 if up else 503), TEXT, b""

    async def _server_info(self, call: Call) -> Response:
        c = self.config
        info = {
            "model_path": c.model_path,
            "host": c.host,
            "port": self._port,
            "skip_tokenizer_init": True,
            "context_length": c.context_length,
            "max_running_requests": c.max_running_requests,
            "max_total_num_tokens": c.max_total_tokens,
            "random_seed": c.random_seed,
            "enable_metrics": c.enable_metrics,
            "internal_states": [{"load": self._sched.load()["num_total_tokens"]}],
            "version": SGLANG_API_VERSION,
            "frontend": "python",
            "april_bench_fake": c.to_dict() | {"api_key": None},
        }
        return json_response(200, info)

    async def _model_info(self, call: Call) -> Response:
        path = self._model_path
        info = {
            "model_path": path,
            "served_model_name": path,
            "tokenizer_path": None,
            "is_generation": True,
            "weight_version": self._sched.weight_version,
        }
        return json_response(200, info)

    async def _loads(self, call: Call) -> Response:
        load = self._sched.load()
        include = {s.strip() for s in call.query.get("include", "all").split(",")}
        if not include & {"queues", "all"}:
            del load["queues"]
        body = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": SGLANG_API_VERSION,
            "accelerator": None,
            "num_accelerators": 1,
            "loads": [load],
        }
        return json_response(200, body)

    async def _metrics(self, call: Call) -> Response:
        s = self._sched
        load = s.load()
        labels = f'{{model_name="{self.config.model_path}",engine_type="unified",tp_rank="0",pp_rank="0"}}'
        gauges = {
            "num_running_reqs": load["num_running_reqs"],
            "num_queue_reqs": load["num_waiting_reqs"],
            "num_used_tokens": load["num_used_tokens"],
            "token_usage": load["token_usage"],
            "gen_throughput": load["gen_throughput"],
            "num_retracted_reqs": load["queues"]["retracted"],
        }
        lines = []
        for name, value in gauges.items():
            lines += [f"# TYPE sglang:{name} gauge", f"sglang:{name}{labels} {float(value)}"]
        for name, value in s.counters.items():
            lines += [f"# TYPE sglang:{name} counter", f"sglang:{name}{labels} {float(value)}"]
        return 200, "text/plain; version=0.0.4; charset=utf-8", ("\n".join(lines) + "\n").encode()


# -------------------------------------------------------------------- command line
_IGNORED_FLAGS = {  # sglang.launch_server flags the fake accepts and ignores
    "--skip-tokenizer-init": None,
    "--enable-deterministic-inference": None,
    "--enable-memory-saver": None,
    "--trust-remote-code": None,
    "--tp-size": int,
    "--mem-fraction-static": float,
    "--chunked-prefill-size": int,
    "--dtype": str,
    "--log-level": str,
}
_TYPES: dict[str, Callable[[str], Any]] = {"float": float, "int": int, "str": str, "int | None": int}
_TYPES["str | None"] = str


def parse_args(argv: Sequence[str]) -> FakeSGLangServer.Config:
    """``sglang.launch_server``-style flags (plus the fake's own) -> a config."""
    parser = argparse.ArgumentParser(prog="python -m april_bench.engines.sglang.fake_server")
    for field in dataclasses.fields(FakeSGLangServer.Config):
        flags = ["--" + field.name.replace("_", "-")]
        if field.name == "model_path":
            flags.append("--model")
        field_default = 30000 if field.name == "port" else field.default  # sglang's default port
        kind = str(field.type)
        help_text = field.metadata.get("help", "")
        if kind == "bool":
            parser.add_argument(*flags, dest=field.name, action="store_true", help=help_text)
        else:
            parser.add_argument(
                *flags, dest=field.name, type=_TYPES[kind], default=field_default, help=help_text
            )
    for flag, ignored in _IGNORED_FLAGS.items():
        if ignored is None:
            parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
        else:
            parser.add_argument(flag, type=ignored, help=argparse.SUPPRESS)
    args = vars(parser.parse_args(list(argv)))
    names = {f.name for f in dataclasses.fields(FakeSGLangServer.Config)}
    return FakeSGLangServer.Config(**{k: v for k, v in args.items() if k in names})


async def _serve_until_signalled(config: FakeSGLangServer.Config) -> None:
    server = config.build()
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"fake SGLang server listening on {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(_serve_until_signalled(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
