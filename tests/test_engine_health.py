"""Health probes of their own: the vLLM server adapter's ``GET /health`` (against a stub server: no
vLLM needed) and the hf engine's ``health()``; and a replica router that finds a sick vLLM replica by
its probe (docs/faults.md: detection)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from april_bench.engines.protocol import (
    HEALTH,
    EngineError,
    EngineInfo,
    FaultEvent,
    GenerateRequest,
    SamplingParams,
)
from april_bench.engines.replicas import FaultOptions, ReplicaRouter
from april_bench.engines.server.process import ServerProcess
from april_bench.engines.vllm.server import VLLMServerEngine
from april_bench.vtime import run_real


class _Stub(ThreadingHTTPServer):
    """Answers like an attached vLLM server's routes that start() and health() use; ``mode``: ok, sick
    (``/health`` 503, as vLLM answers when its engine core died) or hang (``/health`` never answers
    in time)."""

    daemon_threads = True
    mode = "ok"


class _Handler(BaseHTTPRequestHandler):
    server: _Stub

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"{}") -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            if self.server.mode == "hang":
                time.sleep(2.0)
            self._send(503 if self.server.mode == "sick" else 200, b"")
        elif self.path == "/v1/models":
            self._send(200, b'{"data": [{"id": "stub-model"}]}')
        elif self.path == "/version":
            self._send(200, b'{"version": "0.0-stub"}')
        else:
            self._send(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self._send(200 if self.path == "/update_weight_version" else 404)


@pytest.fixture
def stub() -> Iterator[_Stub]:
    server = _Stub(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _vllm(server: _Stub, **kw: Any) -> VLLMServerEngine:
    host, port = server.server_address[:2]
    options = {"url": f"http://{host}:{port}", "control_timeout_s": 0.5, **kw}
    return VLLMServerEngine.Config(**options).build()


async def _probe(engine: VLLMServerEngine) -> str | None:
    try:
        await engine.health()
    except EngineError as exc:
        return str(exc)
    return None


def test_the_vllm_adapter_is_healthy_while_its_server_answers_health_with_200(stub: _Stub) -> None:
    engine = _vllm(stub)
    assert HEALTH.of(engine) is not None

    async def main() -> list[str | None]:
        before = await _probe(engine)  # not started: no client yet
        await engine.start()
        out = [before, await _probe(engine)]
        stub.mode = "sick"
        out.append(await _probe(engine))
        stub.mode = "hang"
        out.append(await _probe(engine))
        stub.mode = "ok"
        out.append(await _probe(engine))
        await engine.close()
        return out

    before, ok, sick, hung, again = run_real(main())
    assert before is not None and "not started" in before
    assert ok is None and again is None
    assert sick is not None and "is unhealthy: GET /health answered 503" in sick
    assert hung is not None and "does not answer GET /health" in hung and "timed out" in hung


def test_a_vllm_server_that_went_away_is_not_healthy(stub: _Stub) -> None:
    engine = _vllm(stub)

    async def main() -> str | None:
        await engine.start()
        stub.shutdown()
        stub.server_close()  # the port refuses connections now
        try:
            return await _probe(engine)
        finally:
            await engine.close()

    gone = run_real(main())
    assert gone is not None and "does not answer GET /health" in gone


def test_a_launched_vllm_server_whose_process_exited_is_dead_without_a_request(stub: _Stub) -> None:
    engine = _vllm(stub)
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    server = ServerProcess(["vllm", "serve"], url=engine.url, name="vllm")
    server.process = process
    engine.server = server  # as if this engine had launched it

    async def main() -> str | None:
        engine._client = None
        await engine.start()  # the stub still answers: only the process tells
        try:
            return await _probe(engine)
        finally:
            engine.server = None  # nothing of ours to stop
            await engine.close()

    exited = run_real(main())
    assert exited is not None and "exited with code 3" in exited


def test_the_router_finds_a_sick_vllm_replica_by_its_health_probe() -> None:
    stubs = [_Stub(("127.0.0.1", 0), _Handler) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in stubs]
    for t in threads:
        t.start()
    events: list[FaultEvent] = []

    async def make(i: int) -> VLLMServerEngine:
        engine = _vllm(stubs[i])
        await engine.start()
        return engine

    async def main() -> list[bool]:
        info = EngineInfo(name="vllm-pool", simulated=False, produces_tokens=True, virtual_time=False)
        faults = FaultOptions(on_failure="continue", health_interval_s=0.05, health_timeout_s=1.0)
        router = ReplicaRouter(make=make, replicas=2, policy="round_robin", faults=faults, info=info)
        router.watch_faults(events.append)
        await router.start()
        stubs[0].mode = "sick"
        # the router probes while requests are out (the stub serves no /v1/completions: as if one were)
        router._busy.set()
        for _ in range(100):
            if not all(router.alive):
                break
            await asyncio.sleep(0.05)
        alive = router.alive
        await router.close()
        return alive

    try:
        alive = run_real(main())
    finally:
        for s in stubs:
            s.shutdown()
            s.server_close()
    assert alive == [False, True]
    failed = [e for e in events if e.kind == "replica_failed"]
    assert [e.replica for e in failed] == [0]
    assert "health check" in (failed[0].detail or "") and "answered 503" in (failed[0].detail or "")


# ---------------------------------------------------------------- the hf engine's health()


def test_the_hf_engine_is_healthy_while_its_scheduler_runs() -> None:
    from test_hf_engine import _engine

    engine = _engine()

    async def main() -> list[str | None]:
        out: list[str | None] = []

        async def probe() -> None:
            try:
                await engine.health()
                out.append(None)
            except EngineError as exc:
                out.append(str(exc))

        await probe()  # not started
        await engine.start()
        await probe()

        def broken(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        engine._prefill = broken  # type: ignore[method-assign]  # the next forward pass fails
        request = GenerateRequest(
            "r", input_len=3, max_new_tokens=4, sampling=SamplingParams(), input_ids=(5, 6, 7)
        )
        with pytest.raises(EngineError, match="hf engine failed"):
            [c async for c in engine.generate([request])]
        await probe()
        await engine.close()
        return out

    before, running, crashed = run_real(main())
    assert before is not None and "not started" in before
    assert running is None
    assert crashed is not None and "scheduler stopped" in crashed and "illegal memory access" in crashed
