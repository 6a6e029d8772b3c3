"""Start a server process on loopback, wait until it is healthy, and stop it with its children.

Shared by the SGLang and vLLM server adapters.  The server runs in a session of
its own (``start_new_session``), so stopping it signals the whole process
group: ``sglang.launch_server`` spawns scheduler and detokenizer processes, and
``vllm serve`` its engine core, that must not outlive it.  ``SIGTERM`` first, then
``SIGKILL`` after ``stop_timeout_s``; a finalizer does the same if the owner
is collected or the interpreter exits without calling :meth:`ServerProcess.stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from april_bench.engines.protocol import EngineError
from april_bench.engines.server.http import HTTPClient, HTTPError

__all__ = ["ServerHandle", "ServerProcess", "flag_args", "free_port", "group_alive"]


@runtime_checkable
class ServerHandle(Protocol):
    """A server the engine starts and stops: a launched process or an in-process fake."""

    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the server binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def flag_args(name: str, value: Any) -> list[str]:
    """``engine_args`` entry -> command-line words: ``--name value``; ``True`` is a bare flag,
    ``False``/``None`` are left out, a list gives several values."""
    flag = name if name.startswith("--") else "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if value is False or value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [flag, *(str(v) for v in value)]
    return [flag, str(value)]


def group_alive(pgid: int) -> bool:
    """True while any process of the group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class ServerProcess:
    """``command`` run as a server at ``url``; :meth:`start` returns once ``/health`` answers 200."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        url: str,
        env: Mapping[str, str] | None = None,
        log_path: str | None = None,
        health_timeout_s: float = 900.0,
        stop_timeout_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
        name: str = "sglang",
        unix_socket: str | None = None,
    ) -> None:
        self.command = list(command)
        #: What error messages and the default log file call the server (``sglang``, ``vllm``).
        self.name = name
        self.unix_socket = unix_socket
        self.url = url
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else None
        self.health_timeout_s = health_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.headers = dict(headers or {})
        self.process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        #: The log is a temporary file of ours: removed at stop unless the server failed (it is named
        #: in the error then).
        self._temporary_log = False
        self._keep_log = False

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def start(self) -> None:
        if self.process is not None:
            return
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"{self.name}-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._temporary_log = True
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            try:
                self.process = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env},
                    start_new_session=True,
                )
            except OSError as exc:
                raise EngineError(f"cannot start the {self.name} server ({self.command[0]}): {exc}") from None
        self._finalizer = weakref.finalize(self, _kill_group, self.process.pid)
        try:
            await self._wait_healthy()
        except BaseException:
            self._keep_log = True  # the error names it
            await self.stop()
            raise

    async def _wait_healthy(self) -> None:
        assert self.process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.health_timeout_s
        client = HTTPClient(self.url, headers=self.headers, max_connections=1, unix_socket=self.unix_socket)
        try:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise EngineError(
                        f"the {self.name} server exited with code {code} while starting: "
                        f"{self._last_log_line()} (log: {self.log_path})"
                    )
                with contextlib.suppress(HTTPError):
                    if (await client.get("/health", timeout=30.0)).status == 200:
                        return
                if loop.time() > deadline:
                    raise EngineError(
                        f"the {self.name} server was not healthy {self.health_timeout_s:.0f} s after launch; "
                        f"raise launch_timeout_s or read its log: {self.log_path}"
                    )
                await asyncio.sleep(0.25)
        finally:
            await client.aclose()

    async def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it if still there after ``stop_timeout_s``."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() not in (None, 0):
            self._keep_log = True  # it died on its own: its log says why
        pgid = process.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_timeout_s
        while (process.poll() is None or group_alive(pgid)) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        _kill_group(pgid)
        while process.poll() is None:
            await asyncio.sleep(0.01)
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._temporary_log and not self._keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def _last_log_line(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "no log"
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else "empty log"
