"""autom.origin.OriginClient against a real HTTP/1.1 server on 127.0.0.1 (h11 over trio):
kept-alive reuse, a server that closes, a cancel mid-exchange, timeouts, bad answers, TLS,
and the Telegram client's road through a proxy the environment names."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import h11
import httpx
import pytest
import trio

from autom.config import Settings
from autom.origin import OriginClient, environment_proxied
from autom.telegram import open_telegram

Handler = Callable[[h11.Request, bytes], list[bytes] | None]


@dataclass
class Server:
    """Counts its connections and requests; answers each with ``answer`` (raw bytes to write,
    or None: hang), or 200 ``{"ok": true}`` kept alive."""

    url: str = ""
    connections: int = 0
    requests: list[tuple[h11.Request, bytes]] = field(default_factory=list)
    answer: Handler | None = None
    #: close the connection after this many requests on it (0: never)
    close_after: int = 0
    #: when set, every answer waits for it (``inflight``/``most``: requests waiting at once)
    gate: trio.Event | None = None
    inflight: int = 0
    most: int = 0
    #: connections that ended (the client closed its side, or the server did)
    ended: int = 0

    async def serve(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        try:
            await self._serve(stream)
        finally:
            self.ended += 1

    async def _serve(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        served = 0
        try:
            while True:
                request, body = None, b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await stream.receive_some(65536))
                        continue
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert request is not None
                self.requests.append((request, body))
                if self.gate is not None:
                    self.inflight += 1
                    self.most = max(self.most, self.inflight)
                    await self.gate.wait()
                    self.inflight -= 1
                raw = self.answer(request, body) if self.answer is not None else ok(conn)
                if raw is None:
                    await trio.sleep_forever()
                for chunk in raw:
                    await stream.send_all(chunk)
                served += 1
                if self.close_after and served >= self.close_after:
                    await stream.aclose()
                    return
                if self.answer is not None:  # raw answers: one a connection unless they keep it alive
                    conn = h11.Connection(h11.SERVER)
                else:
                    conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            return


def ok(conn: h11.Connection, payload: bytes = b'{"ok":true}') -> list[bytes]:
    head = conn.send(h11.Response(status_code=200, headers=[("Content-Type", "application/json"),
                                                           ("Content-Length", str(len(payload)))]))
    return [head + conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage())]


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[Server]:
    srv = Server()
    listeners = await nursery.start(trio.serve_tcp, srv.serve, 0)
    srv.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    yield srv


async def test_one_connection_kept_alive_for_many_requests(server: Server) -> None:
    client = OriginClient(server.url + "/base/", timeout=5)
    for i in range(5):
        response = await client.post_json("/call", {"i": i, "text": "привет"})
        assert response.status_code == 200 and response.json() == {"ok": True}
    await client.aclose()
    assert server.connections == 1
    request, body = server.requests[0]
    assert request.method == b"POST" and request.target == b"/base/call"
    headers = dict(request.headers)
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"host"] == server.url.removeprefix("http://").encode()
    assert json.loads(body) == {"i": 0, "text": "привет"}
    assert "привет".encode() in body  # UTF-8 as is, as httpx's json=


async def test_a_server_that_closes_idle_connections_costs_a_new_one_not_an_error(server: Server) -> None:
    server.close_after = 1
    client = OriginClient(server.url, timeout=5)
    for _ in range(3):
        assert (await client.post_json("/x", {})).status_code == 200
        await trio.sleep(0.2)  # the server's close reaches us: the idle socket reads EOF
    assert server.connections == 3


async def test_connection_close_answers_are_not_reused(server: Server) -> None:
    def closing(request: h11.Request, body: bytes) -> list[bytes]:
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"]

    server.answer = closing
    client = OriginClient(server.url, timeout=5)
    for _ in range(3):
        assert (await client.post_json("/x", {})).json() == {}
    assert server.connections == 3


async def test_idle_connections_expire(server: Server) -> None:
    client = OriginClient(server.url, timeout=5, keepalive_seconds=0.5)
    await client.post_json("/x", {})
    await client.post_json("/x", {})
    await trio.sleep(0.6)
    await client.post_json("/x", {})
    assert server.connections == 2


async def test_chunked_answer_and_headers_reach_the_caller(server: Server) -> None:
    def chunked(request: h11.Request, body: bytes) -> list[bytes]:
        return [b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"5\r\n{\"ok\"\r\n", b"7\r\n:false}\r\n0\r\n\r\n"]

    server.answer = chunked
    response = await OriginClient(server.url, timeout=5).post_json("/x", {})
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert response.json() == {"ok": False}


async def test_a_cancel_mid_exchange_closes_that_connection(server: Server) -> None:
    hang = True

    def maybe_hang(request: h11.Request, body: bytes) -> list[bytes] | None:
        return None if hang else [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]

    server.answer = maybe_hang
    client = OriginClient(server.url, timeout=5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.post_json, "/x", {})
        with trio.fail_after(5):  # cancelled once the server has the request: mid-exchange
            while not server.requests:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    hang = False
    assert (await client.post_json("/x", {})).json() == {}
    assert server.connections == 2  # the cancelled one was closed, not reused half-read


async def test_failures_raise_httpx_exceptions(server: Server) -> None:
    server.answer = lambda request, body: None  # hangs
    with pytest.raises(httpx.ReadTimeout):
        await OriginClient(server.url, timeout=0.2).post_json("/x", {})
    server.answer = lambda request, body: [b"NOT HTTP AT ALL\r\n\r\n"]
    with pytest.raises(httpx.RemoteProtocolError):
        await OriginClient(server.url, timeout=5).post_json("/x", {})
    server.answer = lambda request, body: [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{}"]
    server.close_after = 1
    with pytest.raises(httpx.RemoteProtocolError):  # closed before the whole body
        await OriginClient(server.url, timeout=5).post_json("/x", {})
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(httpx.ConnectError):
        await OriginClient(f"http://127.0.0.1:{port}", timeout=5).post_json("/x", {})
    with pytest.raises(httpx.InvalidURL):
        OriginClient("ftp://example.com", timeout=5)
    closed = OriginClient(server.url, timeout=5)
    await closed.aclose()
    with pytest.raises(httpx.ConnectError):
        await closed.post_json("/x", {})


async def test_at_most_max_connections_at_once(server: Server) -> None:
    server.gate = trio.Event()
    client = OriginClient(server.url, timeout=5, max_connections=2)
    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(client.post_json, "/x", {"i": i})
        with trio.fail_after(5):
            while len(server.requests) < 2:
                await trio.sleep(0.01)
        await trio.sleep(0.2)
        assert server.most == 2 and len(server.requests) == 2  # the other four wait for a connection
        server.gate.set()
    assert len(server.requests) == 6 and server.connections == 2


async def test_bytes_after_an_answer_are_never_the_next_requests_answer(server: Server) -> None:
    """A server (or a proxy) that writes a second answer, or more body than it announced: the
    connection is closed with its answer, and the next request gets its own on a new one."""
    def twice(request: h11.Request, body: bytes) -> list[bytes]:
        n = len(server.requests)
        return [b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{"n":%d}' % n
                + b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"stale":%d}' % n]

    server.answer = twice
    client = OriginClient(server.url, timeout=5)
    assert [(await client.post_json("/x", {})).json() for _ in range(3)] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert server.connections == 3


async def test_idle_connections_a_burst_left_are_closed_once_past_their_keep_alive(server: Server) -> None:
    """After a burst, steady single calls keep one connection in use: the rest are closed once
    they have waited too long, not left open (half-closed by the server) until the next burst."""
    server.gate = trio.Event()
    client = OriginClient(server.url, timeout=5, max_connections=4, keepalive_seconds=0.3)
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(client.post_json, "/x", {})
        with trio.fail_after(5):
            while server.inflight < 4:
                await trio.sleep(0.01)
        server.gate.set()
    assert server.connections == 4 and server.ended == 0
    with trio.fail_after(10):  # single calls, 0.1 s apart, on the one connection that stays fresh
        while server.ended < 3:
            await client.post_json("/x", {})
            await trio.sleep(0.1)
    assert server.connections == 4  # the three the burst left closed, none opened anew


async def test_timeouts_say_what_was_cut_short(server: Server, nursery: trio.Nursery) -> None:
    """A wait for a free connection (PoolTimeout) or a connect that never completes
    (ConnectTimeout: a TLS handshake no one answers) sent nothing; a silent server: ReadTimeout."""
    server.answer = lambda request, body: None  # hangs
    client = OriginClient(server.url, timeout=0.3, max_connections=1)
    errors: list[BaseException] = []

    async def call() -> None:
        try:
            await client.post_json("/x", {})
        except httpx.HTTPError as exc:
            errors.append(exc)

    async with trio.open_nursery() as calls:  # both at once: their deadlines come together
        calls.start_soon(call)
        calls.start_soon(call)
    assert sorted(type(e).__name__ for e in errors) == ["PoolTimeout", "ReadTimeout"]
    assert len(server.requests) == 1

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    listeners = await nursery.start(trio.serve_tcp, silent, 0)
    port = listeners[0].socket.getsockname()[1]
    with pytest.raises(httpx.ConnectTimeout):
        await OriginClient(f"https://127.0.0.1:{port}", timeout=0.3).post_json("/x", {})


async def test_a_path_http_cannot_carry_is_a_bad_url_without_the_path_in_it(server: Server) -> None:
    client = OriginClient(server.url, timeout=5)
    for token in ("123:with space", "123:line\r\nX-Injected: 1", "123:ключ"):
        with pytest.raises(httpx.InvalidURL) as caught:
            await client.post_json(f"/bot{token}/sendMessage", {})
        assert token not in str(caught.value) and "123" not in str(caught.value)
    assert server.requests == []


def self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


async def test_https_verifies_the_server(server: Server, nursery: trio.Nursery, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def tls(stream: trio.SocketStream) -> None:
        wrapped = trio.SSLStream(stream, server_ctx, server_side=True, https_compatible=True)
        try:
            await wrapped.do_handshake()
        except trio.BrokenResourceError:
            await stream.aclose()
            return
        await server.serve(wrapped)

    listeners = await nursery.start(trio.serve_tcp, tls, 0)
    port = listeners[0].socket.getsockname()[1]
    trusted = ssl.create_default_context(cafile=str(cert))
    client = OriginClient(f"https://localhost:{port}", timeout=5, ssl_context=trusted)
    assert (await client.post_json("/x", {"a": 1})).json() == {"ok": True}
    assert (await client.post_json("/x", {"a": 2})).status_code == 200
    assert server.connections == 1
    assert dict(server.requests[0][0].headers)[b"host"] == f"localhost:{port}".encode()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(httpx.ConnectError) as refused:  # an unknown issuer: refused, not sent
            await OriginClient(f"https://localhost:{port}", timeout=5,
                               ssl_context=ssl.create_default_context()).post_json("/x", {})
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)  # the cause, not an empty BrokenResourceError
    assert len(server.requests) == 2
    with trio.fail_after(5):  # the refused handshakes' sockets closed (not left to the garbage collector)
        while len(os.listdir("/proc/self/fd")) > before:
            await trio.sleep(0.01)


async def test_telegram_goes_through_the_proxy_the_environment_names(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """With HTTP(S)_PROXY set, the Telegram client keeps httpx, which sends through the proxy
    (here the test server, which sees the absolute URL a proxy is asked for)."""
    api = "http://api.telegram.invalid"
    monkeypatch.setenv("HTTP_PROXY", server.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert environment_proxied(api)
    monkeypatch.setenv("NO_PROXY", "api.telegram.invalid")
    assert not environment_proxied(api)
    monkeypatch.delenv("NO_PROXY")
    payload = b'{"ok":true,"result":{"message_id":5}}'
    server.answer = lambda request, body: [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)]
    settings = Settings(telegram_api=api, telegram_bot_token="123:proxy", http_timeout_seconds=5)
    async with open_telegram(settings) as tg:
        sent = await tg.send_message(1, "via the proxy")
    assert sent == {"message_id": 5}
    request, body = server.requests[0]
    assert request.target == b"http://api.telegram.invalid/bot123:proxy/sendMessage"
    assert json.loads(body)["text"] == "via the proxy"
