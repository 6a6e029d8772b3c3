"""A small asyncio HTTP/1.1 client for one server (http or https, TCP or Unix socket): JSON in, bytes out.

Why not httpx: its connection pool checks every pooled connection on every
request (``httpcore`` ``_assign_requests_to_connections`` -> ``has_expired``),
which is quadratic in the number of open connections.  The adapter holds one
connection per running request (hundreds), and
``benchmarks/sglang_fake_bench.py`` measured ~10 ms of client time per request
at 64 concurrent ones - more than the decode steps it was timing.  This client
does what the adapter needs and nothing else: ``Content-Length`` and chunked
responses, a LIFO pool of idle connections that expire after
``keepalive_s`` (uvicorn closes idle ones after 5 s), one retry when a reused
connection turns out to be closed before any response byte arrived, and a
connection closed on cancellation (the server then aborts the request).
:meth:`HTTPClient.stream` reads a server-sent-events response as it arrives, on
a connection of its own that the caller may hang up (how a client cancels a
streamed request).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

__all__ = ["HTTPClient", "HTTPError", "HTTPResponse", "HTTPStream"]


class HTTPError(OSError):
    """The server could not be reached, or broke the connection."""


@dataclass(frozen=True, slots=True)
class HTTPResponse:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0

    def close(self) -> None:
        self.writer.close()


class HTTPClient:
    """Requests to ``base_url`` (``http://host:port`` or ``https://host:port``) over at most
    ``max_connections`` connections; to the Unix socket ``unix_socket`` instead of ``host:port``
    when given (``base_url`` then still names the scheme and the ``host`` header).

    ``https``: TLS with the system's trust store and hostname checks (``ssl.create_default_context``;
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` point it at a private CA), or the context given as ``tls``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 4096,
        keepalive_s: float = 2.0,
        tls: ssl.SSLContext | None = None,
        unix_socket: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"only http:// or https://host:port URLs are supported, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        #: Connect to this Unix socket instead of host:port (a server only its owner can reach).
        self.unix_socket = unix_socket
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._keepalive_s = keepalive_s
        self._closed = False

    async def get(
        self, path: str, params: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> HTTPResponse:
        target = f"{path}?{urlencode(params)}" if params else path
        return await self.request("GET", target, None, timeout)

    async def post(self, path: str, body: Any = None, timeout: float | None = None) -> HTTPResponse:
        return await self.request("POST", path, b"" if body is None else json.dumps(body).encode(), timeout)

    async def request(
        self, method: str, target: str, body: bytes | None, timeout: float | None
    ) -> HTTPResponse:
        if self._closed:
            raise HTTPError("the HTTP client is closed")
        async with self._slots:
            if timeout is None:
                return await self._request(method, target, body)
            try:
                return await asyncio.wait_for(self._request(method, target, body), timeout)
            except TimeoutError:
                raise HTTPError(f"{method} {target} timed out after {timeout:g} s") from None

    def stream(self, path: str, body: Any) -> HTTPStream:
        """A POST whose response is read as it arrives (:meth:`HTTPStream.open`, then ``events``);
        nothing is sent until ``open``, and :meth:`HTTPStream.close` may come at any point."""
        if self._closed:
            raise HTTPError("the HTTP client is closed")
        payload = self._payload("POST", path, json.dumps(body).encode())
        return HTTPStream(self.host, self.port, payload, tls=self.tls, unix_socket=self.unix_socket)

    def _payload(self, method: str, target: str, body: bytes | None) -> bytes:
        head = f"{method} {target} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n{self._headers}"
        if body is not None:
            head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        return (head + "\r\n").encode("latin-1") + (body or b"")

    async def _request(self, method: str, target: str, body: bytes | None) -> HTTPResponse:
        payload = self._payload(method, target, body)
        for attempt in range(2):
            conn, reused = await self._connection()
            try:
                conn.writer.write(payload)
                await conn.writer.drain()
                status, keep, data = await _read_response(conn.reader)
            except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
                conn.close()
                if reused and attempt == 0 and not getattr(exc, "partial", b""):
                    continue  # the server had closed this idle connection: nothing was processed
                raise HTTPError(f"{method} {target} at {self.host}:{self.port}: {exc!r}") from None
            except BaseException:  # cancelled mid-request: the server sees the disconnect
                conn.close()
                raise
            if keep and not self._closed:
                conn.idle_since = asyncio.get_running_loop().time()
                self._idle.append(conn)
            else:
                conn.close()
            return HTTPResponse(status, data)
        raise AssertionError("unreachable")

    async def _connection(self) -> tuple[_Connection, bool]:
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < self._keepalive_s and not conn.reader.at_eof():
                return conn, True
            conn.close()
        try:
            reader, writer = await _open(self.host, self.port, self.tls, self.unix_socket)
        except OSError as exc:  # ssl.SSLError (a certificate the client does not trust) included
            raise HTTPError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return _Connection(reader, writer), False

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
            with contextlib.suppress(OSError):
                await conn.writer.wait_closed()


async def _open(
    host: str, port: int, tls: ssl.SSLContext | None, unix_socket: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``host:port``, or to the Unix socket ``unix_socket`` when given; over TLS
    (with ``host`` as the name the certificate must carry) when ``tls``, on either transport."""
    secure: dict[str, Any] = {} if tls is None else {"ssl": tls, "server_hostname": host}
    if unix_socket is not None:
        return await asyncio.open_unix_connection(unix_socket, limit=1 << 26, **secure)
    return await asyncio.open_connection(host, port, limit=1 << 26, **secure)


class HTTPStream:
    """One request on its own connection, its response body read piece by piece as it arrives.

    :meth:`close` hangs up at any point, before or during :meth:`open` included: a server that
    streams (uvicorn/Starlette) sees the disconnect and cancels the request.  After a hang-up,
    ``events`` simply ends; a connection the *server* breaks is an :class:`HTTPError`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        payload: bytes,
        *,
        tls: ssl.SSLContext | None = None,
        unix_socket: str | None = None,
    ) -> None:
        self._host, self._port, self._payload, self._tls = host, port, payload, tls
        self._unix_socket = unix_socket
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.StreamReader | None = None
        self._chunked = False
        self._length: int | None = None
        self.status = 0
        self.closed = False

    async def open(self) -> int:
        """Connect, send the request, read the response head; the HTTP status."""
        try:
            reader, writer = await _open(self._host, self._port, self._tls, self._unix_socket)
        except OSError as exc:
            raise HTTPError(f"cannot connect to {self._host}:{self._port}: {exc}") from None
        self._reader, self._writer = reader, writer
        if self.closed:  # hung up while connecting
            writer.close()
            return 0
        try:
            writer.write(self._payload)
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
            if self.closed:
                return 0
            raise HTTPError(f"POST to {self._host}:{self._port}: {exc!r}") from None
        self.status = int(head[0].split(" ", 2)[1])
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._length = int(headers["content-length"]) if "content-length" in headers else None
        return self.status

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body as it arrives (de-chunked); ends at its end or at a hang-up."""
        reader = self._reader
        if reader is None or self.closed:
            return
        try:
            if self._chunked:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                    if size == 0:
                        return
                    data = await reader.readexactly(size)
                    await reader.readexactly(2)
                    yield data
            left = self._length
            while left is None or left > 0:
                data = await reader.read(1 << 16 if left is None else min(left, 1 << 16))
                if not data:
                    return
                left = None if left is None else left - len(data)
                yield data
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
            if self.closed:
                return
            raise HTTPError(f"the server at {self._host}:{self._port} broke the stream: {exc!r}") from None

    async def events(self) -> AsyncIterator[str]:
        """The ``data:`` payload of each server-sent event, in order."""
        pending = b""
        async for piece in self.pieces():
            pending += piece.replace(b"\r\n", b"\n")
            *whole, pending = pending.split(b"\n\n")
            for event in whole:
                data = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
                if data:
                    yield b"\n".join(data).decode("utf-8", "replace")

    async def body(self) -> bytes:
        return b"".join([piece async for piece in self.pieces()])

    def close(self) -> None:
        """Hang up (idempotent)."""
        self.closed = True
        if self._writer is not None:
            self._writer.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:  # no length: the body runs to the end of the connection
        return status, False, await reader.read()
    keep = headers.get("connection", "").lower() != "close"
    return status, keep, body


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
