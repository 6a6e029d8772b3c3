"""The few lines of HTTP/1.1 the fake SGLang server needs, on ``asyncio.start_server``.

Why not a web framework: the fake must ship in the package and run wherever
april-bench runs, and an ASGI stack (starlette + uvicorn) or aiohttp would be
two or three new dependencies for JSON over loopback.  This handles
``Content-Length`` bodies and keep-alive, which is what httpx sends; chunked
request bodies get 411.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["JSON", "TEXT", "Disconnected", "Dispatch", "Response", "json_response", "serve_connection"]

Response = tuple[int, str, bytes]  # status, content type, body
#: (method, target, lower-cased headers, body, reader) -> response; the reader lets a handler
#: notice that its client went away while it waited.
Dispatch = Callable[[str, str, dict[str, str], bytes, asyncio.StreamReader], Awaitable[Response]]
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}
_REASONS |= {405: "Method Not Allowed", 411: "Length Required", 503: "Service Unavailable"}


@dataclass(frozen=True, slots=True)
class Call:
    """What a route handler gets: the JSON body, the query arguments, the connection's reader."""

    data: dict[str, Any]
    query: dict[str, str]
    reader: asyncio.StreamReader


class Disconnected(Exception):
    """The client went away while its request was pending."""


def json_response(status: int, body: Any) -> Response:
    return status, JSON, json.dumps(body).encode()


async def serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, dispatch: Dispatch
) -> None:
    """Answer requests on one connection until the client closes it (or sends ``Connection: close``)."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, headers = _parse_head(head)
            if "chunked" in headers.get("transfer-encoding", ""):
                await _write(writer, (411, TEXT, b"chunked bodies are not supported\n"), keep=False)
                return
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            response = await dispatch(method, target, headers, body, reader)
            keep = headers.get("connection", "").lower() != "close"
            await _write(writer, response, keep=keep)
            if not keep:
                return
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, Disconnected):
        return
    except asyncio.CancelledError:  # the server is stopping
        return
    finally:
        writer.close()


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return method, target, headers


async def _write(writer: asyncio.StreamWriter, response: Response, *, keep: bool) -> None:
    status, ctype, body = response
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\ncontent-type: {ctype}\r\n"
        f"content-length: {len(body)}\r\nconnection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()
