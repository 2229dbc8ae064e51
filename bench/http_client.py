"""ctx.http's CPU a request, by road: httpx's own transport, ``OriginTransport``, bare ``OriginClient``.

    .venv/bin/python bench/http_client.py [--n 3000] [--rounds 3]
    .venv/bin/python bench/http_client.py serve PORT     (internal) the answering server

One process POSTs JSON in turn (one request at a time, kept alive) to an h11 server in
another process on 127.0.0.1, which answers 200 ``{"ok":true}``. Each round runs every
road once, in turn (200 requests unmeasured first), and reads this process's CPU time
(``time.process_time``) over ``--n`` requests: ms of CPU a request, the client's side
only. Prints one line a road a round and a JSON line at the end. A ratio of roads in
the same run is what compares across machines.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAYLOAD = {"lead": {"name": "Anna", "phone": "+10000000000", "source": "site"}, "n": 1}


def serve(port: int) -> None:
    import h11
    import trio

    body = b'{"ok":true}'

    async def connection(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(bytes(await stream.receive_some(65536)))
                    continue
                if isinstance(event, h11.ConnectionClosed):
                    return
                if isinstance(event, h11.EndOfMessage):
                    out = conn.send(h11.Response(status_code=200, headers=[
                        ("Content-Type", "application/json"), ("Content-Length", str(len(body)))])) or b""
                    out += (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
                    await stream.send_all(out)
                    conn.start_next_cycle()
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            return

    trio.run(trio.serve_tcp, connection, port)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("command", nargs="?", default="drive", choices=["drive", "serve"])
    parser.add_argument("port", nargs="?", type=int)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.port)
        return 0
    import httpx
    import trio

    from autom.context import BoundedHTTP
    from autom.origin import OriginClient

    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "serve", str(port)])
    url = f"http://127.0.0.1:{port}"
    results: dict[str, list[float]] = {}
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)

        async def run() -> None:
            async with BoundedHTTP(deadline=10, transport=httpx.AsyncHTTPTransport()) as httpx_road, \
                    BoundedHTTP(deadline=10) as lean_road:
                bare = OriginClient(url, timeout=10)
                roads: dict[str, Callable[[], Awaitable[Any]]] = {
                    "httpx transport": lambda: httpx_road.post(url + "/leads", json=PAYLOAD),
                    "OriginTransport": lambda: lean_road.post(url + "/leads", json=PAYLOAD),
                    "bare OriginClient": lambda: bare.post_json("/leads", PAYLOAD),
                }
                for r in range(args.rounds):
                    for name, call in roads.items():
                        for _ in range(200):
                            await call()
                        c0 = time.process_time()
                        for _ in range(args.n):
                            response = await call()
                            assert response.status_code == 200
                        ms = 1000 * (time.process_time() - c0) / args.n
                        results.setdefault(name, []).append(ms)
                        print(f"round {r + 1}: {name}: {ms:.3f} ms of CPU a request", flush=True)
                await bare.aclose()

        trio.run(run)
    finally:
        server.kill()
        server.wait()
    print(json.dumps({"test": "http_client", "n": args.n, "cpu_ms_a_request": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
