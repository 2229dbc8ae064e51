"""Keep-alive connections survive answers given before the request body was read.

hypercorn recycles a keep-alive connection only when h11 has seen the whole
request body by the time the response ends; otherwise it closes the connection,
and a client that reuses it sees a reset ("Server disconnected without sending a
response"). Many of our answers come before the body is read: a 404 for an
unknown source, Quart's 404/405, a 401. ``DrainRequestBody`` (autom/web/serve.py)
reads the rest of a bounded body first. With 300 KB bodies the race hit about
one request in three before it; these tests make it happen.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from autom.admission import FAIL_LIMIT
from tests.support.http_app import TELEGRAM_SECRET, running_app

ROUNDS = 60
BODY = b"x" * 300_000  # well under MAX_BODY_BYTES (1 MiB), several socket reads


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/hooks/no-such-source", {}, 404),
        ("/no/such/route", {}, 404),
        ("/health", {}, 405),
        ("/hooks/telegram", {"X-Telegram-Bot-Api-Secret-Token": "wrong-" + TELEGRAM_SECRET}, 401),
    ],
    ids=["unknown-source", "unknown-route", "wrong-method", "bad-signature"],
)
async def test_answers_before_the_body_keep_the_connection(
    db: Any, path: str, headers: dict[str, str], status: int
) -> None:
    async with running_app(db) as app:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=app.url, limits=limits, timeout=10.0) as client:
            client_ports = set()
            # a failed delivery (401, 404) counts against the client: more than FAIL_LIMIT
            # within FAIL_WINDOW and it is refused (429, Connection: close)
            for _ in range(ROUNDS if status not in (401, 404) or path.startswith("/no") else FAIL_LIMIT):
                response = await client.post(path, content=BODY, headers=headers)  # a reset raises here
                assert response.status_code == status
                assert "connection" not in response.headers
                client_ports.add(response.extensions["network_stream"].get_extra_info("client_addr")[1])
            # and the 202 path still works on the same connection
            answer = await client.get("/health")
            assert answer.status_code == 200
    assert len(client_ports) == 1, f"{len(client_ports)} connections on a keep-alive client"


async def test_a_body_above_the_limit_is_not_read_and_the_connection_closes(db: Any) -> None:
    """Beyond MAX_BODY_BYTES nothing is drained: 413, ``Connection: close``, and the server closes."""
    async with running_app(db) as app:
        limit = app.deps.settings.max_body_bytes
        stream = await trio.open_tcp_stream("127.0.0.1", app.port)
        async with stream:
            await stream.send_all(
                b"POST /hooks/telegram HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {limit + 1}\r\n\r\n".encode()
                + b"{" * 1000  # a little of the body; the rest is never sent
            )
            answer = b""
            with trio.fail_after(5):  # the server closes: not waiting for the body it would not read
                try:
                    while chunk := await stream.receive_some(65536):
                        answer += chunk
                except trio.BrokenResourceError:
                    pass
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 413")
    assert b"\r\nconnection: close" in head
