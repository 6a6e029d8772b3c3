"""What every server adapter does the same way, whichever server it drives: where its server is (one
it launched on loopback, or one it attaches to by URL), the HTTP client to it between ``start`` and
``close``, and the liveness probe.  The SGLang adapter and vLLM's server adapter both build on it."""

from __future__ import annotations

from typing import Any

from april_bench.engines.protocol import EngineError
from april_bench.engines.server.health import check_health
from april_bench.engines.server.http import HTTPClient
from april_bench.engines.server.process import ServerHandle, free_port

__all__ = ["ServerAdapter", "loopback_url"]


def loopback_url(host: str, port: int | None) -> tuple[int, str]:
    """``(port, url)`` of a server to launch on ``host``: ``port``, or a free one when it is ``None``."""
    port = port or free_port(host)
    return port, f"http://{host}:{port}"


class ServerAdapter:
    """The part of a server adapter that is the same for every server.

    A subclass sets ``server`` (the server it launched, ``None`` to attach to ``config.url``),
    ``_client = None`` and ``config`` (with ``url`` and ``control_timeout_s``), and names itself in
    :attr:`server_name` (messages and the health probe) and :attr:`engine_title` (the not-started
    error).  Its ``start`` calls :meth:`_connect` and its ``close`` :meth:`_disconnect`.
    """

    server_name = "server"
    engine_title = "server"
    server: ServerHandle | None
    _client: HTTPClient | None
    config: Any

    @property
    def url(self) -> str:
        """The server's address: the launched server's, or the ``url`` attached to."""
        if self.server is not None:
            return self.server.url
        assert self.config.url is not None
        return str(self.config.url).rstrip("/")

    @property
    def _http(self) -> HTTPClient:
        if self._client is None:
            raise EngineError(f"the {self.engine_title} engine is not started: await engine.start() first")
        return self._client

    async def _connect(self, **client_options: Any) -> bool:
        """Start the launched server (if any) and open the client to it; ``False`` when already started."""
        if self._client is not None:
            return False
        if self.server is not None:
            await self.server.start()
        self._client = HTTPClient(self.url, **client_options)
        return True

    async def _disconnect(self) -> None:
        """Close the client, then stop the launched server (an attached one keeps running)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self.server is not None:
            await self.server.stop()

    async def health(self) -> None:
        """``GET /health`` (:class:`~april_bench.engines.protocol.HealthCheck`)."""
        await check_health(
            self._http,
            name=self.server_name,
            url=self.url,
            server=self.server,
            timeout_s=self.config.control_timeout_s,
        )
