"""The vllm server adapter's streaming and abort against a scripted OpenAI-style server (no vLLM).

The adapter against a real ``vllm serve`` is the conformance suite (``tests/conformance``, marker
``vllm``); this checks the client side where vLLM is not installed: tokens and log-probs accumulated
from the event stream, an abort that hangs the stream up (the server sees the disconnect) and returns
what was streamed, and a request aborted before its first token that returns none.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from april_bench.engines.protocol import GenerateRequest, SamplingParams
from april_bench.engines.vllm.server import VLLMServerEngine
from april_bench.types import FinishReason


class ScriptedServer:
    """``/v1/completions`` streams one token per ``step_s`` (id = position + 10, log-prob -0.5)."""

    def __init__(self, step_s: float = 0.01) -> None:
        self.step_s = step_s
        self.bodies: list[dict[str, Any]] = []
        self.disconnects = 0
        self.calls: list[tuple[str, Any]] = []  # every other request: its path and JSON body

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")]
                raw = await reader.readexactly(int(length[0].split(b":")[1])) if length else b""
                path = head.split(b" ")[1].decode()
                if path == "/v1/completions":
                    await self._stream(json.loads(raw), reader, writer)
                    return
                self.calls.append((path, json.loads(raw) if raw else None))
                reply = {"/v1/models": {"data": [{"id": "m"}]}, "/version": {"version": "0.0-test"}}.get(
                    path, {}
                )
                data = json.dumps(reply).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _stream(self, body: dict[str, Any], reader: asyncio.StreamReader, writer: Any) -> None:
        self.bodies.append(body)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        hung_up = asyncio.ensure_future(reader.read())  # b"" when the client disconnects
        delay = float(body.get("queued_s", 0.0))
        for i in range(body["max_tokens"]):
            await asyncio.wait([hung_up], timeout=self.step_s + (delay if i == 0 else 0.0))
            if hung_up.done():
                self.disconnects += 1
                return
            last = i == body["max_tokens"] - 1
            choice = {
                "token_ids": [10 + i],
                "logprobs": {"token_logprobs": [-0.5]},
                "finish_reason": "length" if last else None,
            }
            event = b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        done = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()
        hung_up.cancel()


def request(rid: str, budget: int, seed: int | None = 1) -> GenerateRequest:
    return GenerateRequest(rid, 2, budget, SamplingParams(seed=seed), input_ids=(5, 6))


def run(body: Any, server: ScriptedServer) -> None:
    async def main() -> None:
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        engine = VLLMServerEngine.Config(url=f"http://127.0.0.1:{port}").build()
        await engine.start()
        try:
            await asyncio.wait_for(body(engine), 20)
        finally:
            await engine.close()
            listener.close()

    asyncio.run(main())


def test_streamed_tokens_and_logprobs_are_accumulated_into_one_completion() -> None:
    server = ScriptedServer()

    async def body(engine: VLLMServerEngine) -> None:
        done = [c async for c in engine.generate([request("a", 5), request("b", 3, seed=None)])]
        by_id = {c.request_id: c for c in done}
        assert by_id["a"].output_ids == (10, 11, 12, 13, 14) and by_id["a"].logprobs == (-0.5,) * 5
        assert by_id["a"].finish_reason is FinishReason.LENGTH and by_id["a"].t_first_token is not None
        assert by_id["b"].num_tokens == 3

    run(body, server)
    assert all(b["stream"] for b in server.bodies)
    assert {b["request_id"].rsplit("-", 1)[0] for b in server.bodies} == {"a", "b"}
    assert all(isinstance(b["seed"], int) for b in server.bodies)  # none given: one derived from the id


def test_abort_hangs_up_and_returns_what_was_streamed_and_nothing_for_a_queued_request() -> None:
    server = ScriptedServer()

    async def body(engine: VLLMServerEngine) -> None:
        stream = engine.generate([request("long", 10_000), request("other", 10_000)])
        await asyncio.sleep(0.3)
        await engine.abort(["long"])
        first = await anext(aiter(stream))
        assert first.request_id == "long" and first.finish_reason is FinishReason.ABORT
        assert 0 < first.num_tokens < 10_000
        assert first.output_ids == tuple(range(10, 10 + first.num_tokens))
        assert first.logprobs == (-0.5,) * first.num_tokens
        await engine.abort(None)
        rest = [c async for c in stream]
        assert [(c.request_id, c.finish_reason) for c in rest] == [("other", FinishReason.ABORT)]
        early = engine.generate([request("early", 10)])
        await engine.abort(None)  # before a token (or even the request) reached the server
        (c,) = [c async for c in early]
        assert (c.finish_reason, c.num_tokens) == (FinishReason.ABORT, 0)
        for _ in range(100):  # the server saw both streams hang up
            if server.disconnects >= 2:
                break
            await asyncio.sleep(0.01)

    run(body, server)
    assert server.disconnects >= 2


def test_weights_over_a_group_go_to_the_workers_through_collective_rpc() -> None:
    """``join_weight_group`` and ``receive_weights`` (collective.EngineWorkers) are april-bench's worker
    extension's methods through ``/collective_rpc`` (string arguments only), the receive between a
    pause and a resume, then the new version."""
    server = ScriptedServer()

    async def body(engine: VLLMServerEngine) -> None:
        assert engine.weight_workers() == 1
        server.calls.clear()
        await engine.join_weight_group("tcp://10.0.0.1:1234", 3, 5, "gloo")
        await engine.receive_weights(7)
        assert server.calls == [
            (
                "/collective_rpc",
                {"method": "join_weight_group", "args": ["tcp://10.0.0.1:1234", "3", "5", "gloo", "60.0"]},
            ),
            ("/pause?mode=abort&clear_cache=true", None),
            ("/collective_rpc", {"method": "receive_weights"}),
            ("/resume", None),
            ("/update_weight_version", {"new_version": "7"}),
        ]
        assert engine.version == 7

    run(body, server)
