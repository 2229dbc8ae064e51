"""The intake's CPU per delivery in-process: no hypercorn, no sockets, no wrk.

    python bench/intake_cpu.py [--n 5000] [--warm 1000] [--senders 16] [--profile FILE]

16 sender tasks (``--senders``) each call the ASGI stack that ``serve_http`` serves
(``DrainRequestBody(ShieldFinalSend(app))``, so the door, the intake and the group
commit) with a signed Telegram update of a unique id, one after the other, against a
fresh database on ``--admin-dsn`` (the local PostgreSQL). A request's ``receive`` is a
trio memory channel holding its body, as hypercorn's is. Prints one JSON line: process
CPU µs per delivery over ``--n`` deliveries after ``--warm``, wall µs, hops and
deliveries per hop. ``--profile FILE`` writes cProfile's stats of the measured part:
its call count per delivery does not depend on the machine's load (bench/RESULTS.md,
"Speed round four").

With ``PYTHONPATH=<checkout>`` it measures that checkout's code; alternate checkouts
in rounds and compare within each round. The server under wrk (bench/intake.py) adds
hypercorn's ~0.3–0.5 ms per request and its noise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import uuid
from typing import Any

import psycopg
import trio
from psycopg.conninfo import make_conninfo


def main() -> None:
    """Create the database, run the senders, print the figures, drop it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--admin-dsn", default=os.environ.get("AUTOM_BENCH_ADMIN_DSN",
                                                              "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--n", type=int, default=5000, help="deliveries measured")
    parser.add_argument("--warm", type=int, default=1000, help="deliveries before measuring")
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--profile", default=None, help="cProfile stats of the measured part to this file")
    parser.add_argument("--variant", default=None, help="a name printed with the figures")
    args = parser.parse_args()

    from intake import SECRET, bench_app  # bench/ is this script's folder, first on sys.path

    import autom
    from autom.db.migrate import apply_migrations_sync
    from autom.logs import JsonFormatter
    from autom.web.serve import DrainRequestBody, ShieldFinalSend

    handler = logging.FileHandler(os.devnull)  # a log line per delivery is formatted, as in service
    handler.setFormatter(JsonFormatter())
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    dbname = f"autom_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{dbname}"')
    dsn = make_conninfo(args.admin_dsn, dbname=dbname)
    result: dict[str, Any] = {}

    async def run() -> None:
        async with bench_app(dsn, 16) as (deps, app):
            stack = DrainRequestBody(ShieldFinalSend(app), deps.settings.max_body_bytes)
            batcher = getattr(getattr(app.asgi_app, "intake", None), "_batcher", None)
            counter = 0
            statuses: dict[int, int] = {}
            nonce = int(time.time() * 1000) % 10**6 * 10**9

            async def one() -> None:
                nonlocal counter
                counter += 1
                uid = nonce + counter
                chat = 100000 + uid % 1000
                body = (b'{"update_id":%d,"message":{"message_id":%d,"date":1700000000,'
                        b'"chat":{"id":%d,"type":"private"},"from":{"id":%d,"is_bot":false,'
                        b'"first_name":"Bench"},"text":"/ping"}}' % (uid, counter, chat, chat))
                headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                           (b"x-telegram-bot-api-secret-token", SECRET.encode()),
                           (b"content-length", b"%d" % len(body))]
                scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                         "scheme": "http", "path": "/hooks/telegram", "raw_path": b"/hooks/telegram",
                         "query_string": b"", "root_path": "", "headers": headers,
                         "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "extensions": {}}
                send_channel, receive_channel = trio.open_memory_channel[dict[str, Any]](10)
                send_channel.send_nowait({"type": "http.request", "body": body, "more_body": False})

                async def send(message: dict[str, Any]) -> None:
                    if message["type"] == "http.response.start":
                        statuses[message["status"]] = statuses.get(message["status"], 0) + 1

                await stack(scope, receive_channel.receive, send)  # type: ignore[arg-type]

            async def deliveries(total: int) -> int:
                per_sender = total // args.senders

                async def sender() -> None:
                    for _ in range(per_sender):
                        await one()

                async with trio.open_nursery() as nursery:
                    for _ in range(args.senders):
                        nursery.start_soon(sender)
                return per_sender * args.senders

            await deliveries(args.warm)
            hops = getattr(batcher, "hops_run", 0)
            profile = None
            if args.profile:
                import cProfile

                profile = cProfile.Profile()
                profile.enable()
            cpu, wall = time.process_time(), time.perf_counter()
            done = await deliveries(args.n)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if profile is not None:
                profile.disable()
                profile.dump_stats(args.profile)
                import pstats

                result["calls_per_delivery"] = round(pstats.Stats(args.profile).total_calls / done, 1)
            hops = getattr(batcher, "hops_run", 0) - hops
            result.update(variant=args.variant, autom=os.path.dirname(autom.__file__), deliveries=done,
                          cpu_us=round(1e6 * cpu / done, 1), wall_us=round(1e6 * wall / done, 1), hops=hops,
                          per_hop=round(done / hops, 1) if hops else None, statuses=statuses,
                          load_1min=os.getloadavg()[0])

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            apply_migrations_sync(conn)
        trio.run(run)
        print(json.dumps(result), flush=True)
    finally:
        with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{dbname}" with (force)')


if __name__ == "__main__":
    main()
