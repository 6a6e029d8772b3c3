"""Servers over https://: the HTTP client speaks TLS with certificate and hostname checks, and the
SGLang and vLLM server configs take https URLs.  The server presents the vendored self-signed
certificate (tests/data/tls); the client trusts it through SSL_CERT_FILE, as a user would a private CA."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from april_bench.engines.server.http import HTTPClient, HTTPError

TLS = Path(__file__).parent / "data" / "tls"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")]
            if length:
                await reader.readexactly(int(length[0].split(b":")[1]))
            writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n{"ok": true}')
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _serve_tls(body) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(TLS / "localhost.pem", TLS / "localhost.key")
        server = await asyncio.start_server(_handle, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        try:
            await asyncio.wait_for(body(port), 10)
        finally:
            server.close()

    asyncio.run(main())


def test_https_requests_and_streams_with_a_trusted_certificate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(TLS / "localhost.pem"))  # trust exactly this certificate

    async def body(port: int) -> None:
        for host in ("localhost", "127.0.0.1"):  # the certificate names both
            client = HTTPClient(f"https://{host}:{port}")
            try:
                assert client.tls is not None and client.tls.verify_mode == ssl.CERT_REQUIRED
                response = await client.get("/health")
                assert response.status == 200 and response.json() == {"ok": True}
                again = await client.post("/generate", {"a": 1})  # on the kept-alive TLS connection
                assert again.json() == {"ok": True}
                stream = client.stream("/v1/completions", {"stream": True})
                assert await stream.open() == 200
                assert await stream.body() == b'{"ok": true}'
                stream.close()
            finally:
                await client.aclose()

    _serve_tls(body)


def test_an_untrusted_certificate_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "none.pem"
    empty.write_text("")
    monkeypatch.setenv("SSL_CERT_FILE", str(empty))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))

    async def body(port: int) -> None:
        client = HTTPClient(f"https://localhost:{port}")
        try:
            with pytest.raises(HTTPError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                await client.get("/health")
        finally:
            await client.aclose()

    _serve_tls(body)


def test_server_configs_take_https_urls() -> None:
    from april_bench.config import ConfigError
    from april_bench.engines.sglang.engine import SGLangEngine
    from april_bench.engines.vllm.server import VLLMServerEngine

    for config in (SGLangEngine.Config, VLLMServerEngine.Config):
        assert config(url="https://rl-cluster.example:30000").url.startswith("https://")
        with pytest.raises(ConfigError, match="http:// or https://"):
            config(url="ftp://host:1")
    assert HTTPClient("https://host").port == 443 and HTTPClient("http://host").port == 80
    with pytest.raises(ValueError, match="https://"):
        HTTPClient("ws://host:1")


def test_https_over_a_unix_socket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Both transports of the client at once: TLS (the URL's host checked against the certificate)
    on a Unix socket instead of host:port."""
    monkeypatch.setenv("SSL_CERT_FILE", str(TLS / "localhost.pem"))
    path = str(tmp_path / "s.sock")

    async def main() -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(TLS / "localhost.pem", TLS / "localhost.key")
        server = await asyncio.start_unix_server(_handle, path, ssl=context)
        client = HTTPClient("https://localhost", unix_socket=path)
        try:
            assert (await client.get("/health", timeout=10)).json() == {"ok": True}
            stream = client.stream("/v1/completions", {"stream": True})
            assert await stream.open() == 200
            assert await stream.body() == b'{"ok": true}'
            stream.close()
            wrong = HTTPClient("https://rl-cluster.example", unix_socket=path)  # not the certificate's name
            with pytest.raises(HTTPError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                await wrong.get("/health", timeout=10)
            await wrong.aclose()
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())
