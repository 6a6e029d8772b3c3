"""The liveness probe of an engine behind an HTTP server (SGLang's and vLLM's ``GET /health``)."""

from __future__ import annotations

import os
import signal
import subprocess

from april_bench.engines.protocol import EngineError
from april_bench.engines.server.http import HTTPClient, HTTPError
from april_bench.engines.server.process import ServerProcess

__all__ = ["check_health", "freeze_server", "kill_server"]


async def check_health(http: HTTPClient, *, name: str, url: str, server: object, timeout_s: float) -> None:
    """Return when the server answers ``GET /health`` with 200; raise :class:`EngineError` when it
    does not, or when the server process this engine launched has exited (found without a request)."""
    if isinstance(server, ServerProcess) and server.process is not None:
        code = server.process.poll()
        if code is not None:
            raise EngineError(f"the {name} server at {url} exited with code {code} (log: {server.log_path})")
    try:
        response = await http.get("/health", timeout=timeout_s)
    except HTTPError as exc:
        raise EngineError(f"the {name} server at {url} does not answer GET /health: {exc}") from None
    if response.status != 200:
        raise EngineError(f"the {name} server at {url} is unhealthy: GET /health answered {response.status}")


def kill_server(server: object, *, name: str) -> None:
    """Fault injection: SIGKILL a launched server's process group (what an OOM kill does)."""
    process = _process(server, name)
    os.killpg(process.pid, signal.SIGKILL)


def freeze_server(server: object, *, name: str) -> None:
    """Fault injection: SIGSTOP a launched server's process group, so it answers nothing (a hang);
    stopping the engine later still ends it (SIGKILL reaches a stopped process)."""
    process = _process(server, name)
    os.killpg(process.pid, signal.SIGSTOP)


def _process(server: object, name: str) -> subprocess.Popen[bytes]:
    if not isinstance(server, ServerProcess) or server.process is None:
        raise EngineError(f"fault injection needs a {name} server this engine launched (not an attached one)")
    return server.process
