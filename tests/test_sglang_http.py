"""The adapter's HTTP/1.1 client against a scripted loopback server: body framings, keep-alive, retries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from april_bench.engines.server.http import HTTPClient, HTTPError


def serve(replies: list[bytes], close_after: Callable[[int], bool] = lambda i: False):
    """A server that answers the i-th request on any connection with ``replies[i]``; returns (run, seen)."""
    seen: list[tuple[int, bytes]] = []  # (connection number, request head)
    counter = {"conn": 0, "req": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = counter["conn"] = counter["conn"] + 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")]
                if length:
                    await reader.readexactly(int(length[0].split(b":")[1]))
                i = counter["req"]
                counter["req"] += 1
                seen.append((conn, head.split(b"\r\n")[0]))
                writer.write(replies[i])
                await writer.drain()
                if close_after(i):
                    break
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    return handle, seen


def run(handle, body) -> None:
    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HTTPClient(f"http://127.0.0.1:{port}")
        try:
            await asyncio.wait_for(body(client), 10)
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())


def test_content_length_chunked_and_close_delimited_bodies_are_read_whole() -> None:
    replies = [
        b'HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n{"a":1}',
        b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{"b"\r\n3\r\n:2}\r\n0\r\n\r\n',
        b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\nno length",
    ]
    handle, seen = serve(replies, close_after=lambda i: i == 2)

    async def body(client: HTTPClient) -> None:
        assert (await client.get("/a")).json() == {"a": 1}
        assert (await client.post("/b", {"x": 1})).json() == {"b": 2}
        last = await client.get("/c", {"include": "core,queues"})
        assert (last.status, last.text) == (400, "no length")

    run(handle, body)
    assert [conn for conn, _ in seen] == [1, 1, 1]  # one kept-alive connection
    assert seen[2][1] == b"GET /c?include=core%2Cqueues HTTP/1.1"


def test_a_reused_connection_the_server_closed_is_retried_once_on_a_new_one() -> None:
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    handle, seen = serve([ok, ok], close_after=lambda i: i == 0)  # closes without saying so

    async def body(client: HTTPClient) -> None:
        assert (await client.get("/1")).text == "ok"
        await asyncio.sleep(0.05)
        assert (await client.get("/2")).text == "ok"

    run(handle, body)
    assert [conn for conn, _ in seen] == [1, 2]


def test_an_unreachable_server_is_an_http_error_and_a_timeout_too() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        client = HTTPClient(f"http://127.0.0.1:{port}")
        with pytest.raises(HTTPError, match="cannot connect"):
            await client.get("/health")

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # never answers; returns when the client hangs up
            writer.close()

        quiet = await asyncio.start_server(silent, "127.0.0.1", 0)
        slow = HTTPClient(f"http://127.0.0.1:{quiet.sockets[0].getsockname()[1]}")
        with pytest.raises(HTTPError, match=r"timed out after 0\.1 s"):
            await slow.get("/health", timeout=0.1)
        await slow.aclose()
        await asyncio.sleep(0.05)
        quiet.close()
        await quiet.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 10))


def _streaming_server(events: list[bytes], *, hold: bool, seen: list[str]):
    """Answers one POST with a chunked event stream; ``hold`` keeps it open and records the hang-up."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")]
        await reader.readexactly(int(length[0].split(b":")[1]))
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in events:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        if hold:
            seen.append("eof" if not await reader.read() else "data")  # the client hung up
        else:
            writer.write(b"0\r\n\r\n")
        writer.close()

    return handle


def test_a_stream_yields_each_event_as_it_arrives_across_chunk_boundaries() -> None:
    pieces = [b'data: {"a": 1}\n', b'\ndata: {"a"', b": 2}\n\ndata: [DONE]\n\n"]

    async def body(client: HTTPClient) -> None:
        stream = client.stream("/v1/completions", {"stream": True})
        assert await stream.open() == 200
        assert [e async for e in stream.events()] == ['{"a": 1}', '{"a": 2}', "[DONE]"]
        stream.close()

    run(_streaming_server(pieces, hold=False, seen=[]), body)


def test_hanging_up_a_stream_ends_it_quietly_and_the_server_sees_the_disconnect() -> None:
    seen: list[str] = []

    async def body(client: HTTPClient) -> None:
        stream = client.stream("/v1/completions", {})
        assert await stream.open() == 200
        got = []
        async for event in stream.events():
            got.append(event)
            stream.close()  # mid-stream: no error, the iteration just ends
        assert got == ["1"]
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        early = client.stream("/v1/completions", {})
        early.close()  # before it was sent: open() sends nothing
        assert await early.open() == 0 and [e async for e in early.events()] == []

    run(_streaming_server([b"data: 1\n\n", b"data: 2\n\n"], hold=True, seen=seen), body)
    assert seen == ["eof"]
