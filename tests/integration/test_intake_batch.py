"""The intake's group commit (``StoreBatcher``, autom/events/batcher.py; migrations/0005).

Deliveries that arrive while a hop is in flight are stored together by the next
one, in one transaction. These tests hold a hop in flight for as long as they
need by locking the ``events`` table from another connection (no timing), then
check what the batch did: every delivery its own answer, a redelivery inside
the batch answered as a duplicate with no jobs, one delivery PostgreSQL refuses
failing alone, a cancelled request leaving the queue, a leader cancelled
mid-hop still storing and answering the others, and the database going away
mid-batch: 503 for all of it and nothing stored.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

from autom.db import open_database
from autom.errors import DatabaseUnavailable, QueryError
from autom.events import (
    CANCEL_SECONDS,
    FATE_SECONDS,
    GATHER_SECONDS,
    SenderGone,
    StoreBatcher,
    batch_items,
    store_params,
)
from autom.jobs.models import NewJob
from tests.support.http_app import TELEGRAM_SECRET, count_rows, running_app
from tests.support.restartable_pg import RestartablePg, restartable_pg

HEADERS = {"content-type": "application/json"}


def params(n: int, *, dedup: str | None = None, jobs: int = 1, recipient: str = "r1") -> dict[str, Any]:
    """``store_params`` of delivery ``n``: dedup key ``k<n>`` unless given, ``jobs`` jobs."""
    new_jobs = [NewJob(kind="test.kind", payload={"n": n, "i": i}, key=f"job-{n}-{i}", recipient=recipient)
                for i in range(jobs)]
    return store_params("site", HEADERS, json.dumps({"n": n}), dedup or f"k{n}", new_jobs)


async def store(batcher: StoreBatcher, *args: Any, **kwargs: Any) -> tuple[int | None, int]:
    """``batcher.deliver(...)``'s event id and job count (what these tests look at)."""
    stored = await batcher.deliver(*args, **kwargs)
    return stored.event_id, stored.jobs


@asynccontextmanager
async def events_locked(dsn: str) -> AsyncIterator[None]:
    """Hold ``events`` locked for the block: a hop that inserts an event waits until the block ends."""
    conn = await trio.to_thread.run_sync(lambda: psycopg.connect(dsn))
    try:
        await trio.to_thread.run_sync(conn.execute, "lock table events in exclusive mode")
        yield
    finally:
        await trio.to_thread.run_sync(conn.close)  # the lock goes with the transaction


def storer(batcher: StoreBatcher, results: dict[int, Any]) -> Callable[[int], Awaitable[None]]:
    """``one(n)``: store delivery ``n`` through ``batcher``; its outcome (or DatabaseUnavailable) in ``results[n]``."""
    async def one(n: int) -> None:
        try:
            results[n] = await store(batcher, params(n))
        except DatabaseUnavailable as exc:
            results[n] = exc

    return one


async def wait_queued(batcher: StoreBatcher, n: int) -> None:
    """Until ``n`` deliveries wait behind the hop in flight."""
    while batcher.queued < n:
        await trio.sleep(0.005)


async def store_all(
    batcher: StoreBatcher, dsn: str, first: dict[str, Any], rest: list[dict[str, Any]]
) -> tuple[Any, list[Any]]:
    """Store ``first`` alone (held in flight), then ``rest`` queued behind it in order: one batch.

    Returns each one's outcome, or the exception it raised.
    """
    results: list[Any] = [None] * len(rest)
    first_result: list[Any] = [None]

    async def one(p: dict[str, Any], slot: list[Any], i: int) -> None:
        try:
            slot[i] = await store(batcher, p)
        except Exception as exc:
            slot[i] = exc

    hops = batcher.hops_run  # the batcher may have run hops before
    async with trio.open_nursery() as nursery, events_locked(dsn):
        nursery.start_soon(one, first, first_result, 0)
        while batcher.hops_run == hops:  # its leader may gather first (GATHER_SECONDS)
            await trio.sleep(0.005)
        for i, p in enumerate(rest):  # one at a time: the queue's order is the list's
            nursery.start_soon(one, p, results, i)
            await wait_queued(batcher, i + 1)
    return first_result[0], results


async def test_deliveries_queued_behind_a_hop_are_stored_together(db: Any, dsn: str) -> None:
    batcher = StoreBatcher(db)
    first, rest = await store_all(batcher, dsn, params(0), [params(n, jobs=n % 3) for n in range(1, 21)])
    assert batcher.hops_run == 2  # the held one, then all twenty in one
    assert first[0] is not None and first[1] == 1
    ids = [event_id for event_id, _ in rest]
    assert None not in ids and len(set(ids) | {first[0]}) == 21
    assert [jobs for _, jobs in rest] == [n % 3 for n in range(1, 21)]
    # each answer is its own event's: the id holds the body that was sent with it
    rows = await db.fetch_all("select id, body from events")
    body_of = {row["id"]: row["body"] for row in rows}
    assert all(json.loads(body_of[event_id]) == {"n": n} for n, (event_id, _) in enumerate(rest, 1))
    assert await count_rows(db, "events") == 21
    assert await count_rows(db, "jobs") == 1 + sum(n % 3 for n in range(1, 21))


async def test_a_redelivery_inside_a_batch_is_a_duplicate_without_jobs(db: Any, dsn: str) -> None:
    batcher = StoreBatcher(db)
    again = params(5, dedup="same", jobs=2)
    rest = [params(1), again, params(2), again, params(3, dedup="same", jobs=2), params(4)]
    _, results = await store_all(batcher, dsn, params(0), rest)
    assert batcher.hops_run == 2
    assert results[1][0] is not None and results[1][1] == 2  # the first of the three wins, in order
    assert results[3] == (None, 0) and results[4] == (None, 0)
    assert all(r[0] is not None for i, r in enumerate(results) if i not in (3, 4))
    assert await db.fetch_val("select count(*) from events where dedup_key = 'same'") == 1
    # as separate transactions would: the duplicates' jobs (job-3-*) were never created
    assert await db.fetch_val("select count(*) from jobs where key like 'job-3-%'") == 0
    assert await count_rows(db, "jobs") == 1 + 1 + 2 + 1 + 1


async def test_a_redelivery_of_a_stored_event_inside_a_batch_is_a_duplicate(db: Any, dsn: str) -> None:
    batcher = StoreBatcher(db)
    stored = await store(batcher, params(7))
    _, results = await store_all(batcher, dsn, params(0), [params(1), params(7), params(2)])
    assert results[1] == (None, 0)
    assert stored[0] is not None and results[0][0] is not None and results[2][0] is not None


async def test_a_job_key_taken_earlier_in_the_batch_is_skipped_as_alone(db: Any, dsn: str) -> None:
    batcher = StoreBatcher(db)
    a = params(1, jobs=1)
    b = store_params("site", HEADERS, "{}", "other", [NewJob(kind="test.kind", payload={}, key="job-1-0")])
    _, results = await store_all(batcher, dsn, params(0), [a, b])
    assert results[0][1] == 1
    assert results[1][0] is not None and results[1][1] == 0  # the event is new; its job's key is not


async def test_one_delivery_postgres_refuses_fails_alone(db: Any, dsn: str) -> None:
    batcher = StoreBatcher(db)
    bad = params(2)
    bad["headers"] = '{"x": "\\u0000"}'  # jsonb refuses a NUL character
    del bad["item"]  # encoded by store_params before the change: the batch encodes it again
    _, results = await store_all(batcher, dsn, params(0), [params(1), bad, params(3)])
    assert isinstance(results[1], QueryError) and isinstance(results[1].__cause__, psycopg.Error)
    assert results[0][0] is not None and results[2][0] is not None
    assert await count_rows(db, "events") == 3


async def test_a_cancelled_request_leaves_the_queue_and_is_not_stored(db: Any, dsn: str) -> None:
    batcher = StoreBatcher(db)
    results: dict[int, Any] = {}

    async def one(n: int, scope_box: list[trio.CancelScope] | None = None) -> None:
        with trio.CancelScope() as scope:
            if scope_box is not None:
                scope_box.append(scope)
            results[n] = await store(batcher, params(n))

    box: list[trio.CancelScope] = []
    async with trio.open_nursery() as nursery, events_locked(dsn):
        nursery.start_soon(one, 0)
        while batcher.hops_run < 1:
            await trio.sleep(0.005)
        nursery.start_soon(one, 1, box)  # queued first: it would lead the next hop
        await wait_queued(batcher, 1)
        nursery.start_soon(one, 2)
        await wait_queued(batcher, 2)
        box[0].cancel()
        await wait_queued(batcher, 1)  # it left the queue at once
    assert set(results) == {0, 2}
    assert await db.fetch_val("select count(*) from events where dedup_key = 'k1'") == 0
    # and the batcher is idle again, not waiting for a leader that is gone
    assert (await store(batcher, params(3)))[0] is not None


async def test_deliveries_arriving_together_go_in_one_hop_with_the_first(db: Any) -> None:
    """The leader gathers: it starts its hop once the loop has nothing else to do, so the
    deliveries the loop is working on join it instead of queueing behind a hop of one."""
    for gather, hops in ((GATHER_SECONDS, 1), (0.0, 2)):  # without gathering: the first alone, then the rest
        batcher = StoreBatcher(db, gather=gather)
        results: dict[int, Any] = {}
        base = 100 * hops
        async with trio.open_nursery() as nursery:  # all runnable at once, as a wave of requests
            for n in range(base, base + 6):
                nursery.start_soon(storer(batcher, results), n)
        assert batcher.hops_run == hops
        assert len({r[0] for r in results.values()}) == 6 and all(r[1] == 1 for r in results.values())
    assert await count_rows(db, "events") == 12


async def test_a_leader_cancelled_while_it_gathers_is_not_stored_and_the_next_leads(db: Any) -> None:
    """A leader waits for the loop to go idle; a busy task keeps it from being idle, and the
    leader's request is cancelled meanwhile: it leaves, the delivery behind it leads instead."""
    batcher = StoreBatcher(db, gather=3600.0)  # only the loop going idle ends the wait
    results: dict[int, Any] = {}
    busy = True
    leader: list[trio.CancelScope] = []

    async def spin() -> None:
        while busy:
            await trio.lowlevel.checkpoint()  # always runnable: the loop is never idle

    async def first() -> None:
        with trio.CancelScope() as scope:
            leader.append(scope)
            results[1] = await store(batcher, params(1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spin)
        nursery.start_soon(first)
        await wait_queued(batcher, 1)
        nursery.start_soon(storer(batcher, results), 2)
        await wait_queued(batcher, 2)
        leader[0].cancel()
        await wait_queued(batcher, 1)  # it left the queue
        busy = False  # the loop can go idle: the new leader stores its hop
    assert set(results) == {2} and results[2][0] is not None
    assert batcher.hops_run == 1
    assert await db.fetch_val("select count(*) from events where dedup_key = 'k1'") == 0
    assert (await store(batcher, params(3)))[0] is not None  # idle again, no leader missing


async def waiting_on_events_lock(db: Any, n: int) -> None:
    """Until ``n`` sessions wait for a lock on ``events``."""
    query = "select count(*) from pg_locks where relation = 'events'::regclass and not granted"
    while await db.fetch_val(query) < n:
        await trio.sleep(0.005)


async def test_a_leader_cancelled_mid_hop_still_stores_and_answers_its_batch(db: Any, dsn: str) -> None:
    """The hop runs shielded: the sender that leads it gave up, the others in it did not."""
    batcher = StoreBatcher(db)
    results: dict[int, Any] = {}
    leader_scope: list[trio.CancelScope] = []

    async def one(n: int) -> None:
        with trio.CancelScope() as scope:
            if n == 1:
                leader_scope.append(scope)
            results[n] = await store(batcher, params(n))

    second_lock = await trio.to_thread.run_sync(lambda: psycopg.connect(dsn))

    async def take_second_lock() -> None:
        await trio.to_thread.run_sync(lambda: second_lock.execute("lock table events in exclusive mode"))

    try:
        async with trio.open_nursery() as nursery:
            async with events_locked(dsn):
                nursery.start_soon(one, 0)  # hop 1, held by the first lock
                await waiting_on_events_lock(db, 1)
                nursery.start_soon(one, 1)  # queued first: leads hop 2, for itself and 2
                await wait_queued(batcher, 1)
                nursery.start_soon(one, 2)
                await wait_queued(batcher, 2)
                # a second lock, queued behind hop 1's insert, holds hop 2 once hop 1 is done
                nursery.start_soon(take_second_lock)
                await waiting_on_events_lock(db, 2)
            while batcher.hops_run < 2:  # hop 1 committed; 1 leads hop 2
                await trio.sleep(0.005)
            await waiting_on_events_lock(db, 1)  # hop 2 waits for the second lock
            leader_scope[0].cancel()
            await trio.sleep(0.05)
            assert 1 not in results and 2 not in results  # hop 2 still in flight, not abandoned
            await trio.to_thread.run_sync(second_lock.rollback)
    finally:
        await trio.to_thread.run_sync(second_lock.close)
    assert set(results) == {0, 1, 2}
    assert all(event_id is not None for event_id, _ in results.values())
    assert await count_rows(db, "events") == 3


def test_batch_items_keep_bodies_exact() -> None:
    tricky = 'a "quoted" \\ back\nslash\r\n\t é ✓ \U0001F600 \u2028'
    text = batch_items([store_params("s", {"h": "v"}, tricky, None, [])])
    assert json.loads(text) == [["s", {"h": "v"}, tricky, None, []]]


async def test_concurrent_deliveries_over_http_each_get_their_own_answer(db: Any) -> None:
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}

    def update(n: int) -> bytes:
        return json.dumps({"update_id": n, "message": {"message_id": n, "chat": {"id": n % 3, "type": "private"},
                                                     "text": f"#{n}"}}).encode()

    answers: dict[int, Any] = {}
    async with running_app(db) as app:
        async def send(n: int) -> None:
            response = await app.client.post("/hooks/telegram", content=update(n), headers=headers)
            answers[n] = (response.status_code, response.json())

        async with trio.open_nursery() as nursery:
            for n in [*range(40), 3, 17, 17]:  # three redeliveries among them
                nursery.start_soon(send, n)
    assert all(status == 202 for status, _ in answers.values())
    rows = await db.fetch_all("select id, body from events")
    assert len(rows) == 40
    body_of = {row["id"]: json.loads(row["body"])["update_id"] for row in rows}
    assert await count_rows(db, "jobs") == 40
    # every 202 with an id names the event that holds its own update
    assert all(body_of[answer["id"]] == n for n, (_, answer) in answers.items() if "id" in answer)


@pytest.fixture
def pg() -> Iterator[RestartablePg]:
    """A migrated PostgreSQL of this test's own, which it may stop and start."""
    with restartable_pg() as server:
        yield server


async def test_the_database_going_away_mid_batch_answers_503_for_all_and_stores_nothing(pg: RestartablePg) -> None:
    async with open_database(pg.dsn, min_size=2, max_size=4, pool_timeout=1.0, connect_timeout=2.0) as db:
        batcher = StoreBatcher(db)
        results: dict[int, Any] = {}
        one = storer(batcher, results)

        async with trio.open_nursery() as nursery, events_locked(pg.dsn):
            nursery.start_soon(one, 0)
            while batcher.hops_run < 1:
                await trio.sleep(0.005)
            for n in range(1, 11):
                nursery.start_soon(one, n)
            await wait_queued(batcher, 10)
            await trio.to_thread.run_sync(pg.stop)  # the held hop's connection dies with it
        assert len(results) == 11
        assert all(isinstance(r, DatabaseUnavailable) for r in results.values()), results

        await trio.to_thread.run_sync(pg.start)
        with trio.fail_after(10):
            while not await db.ping():
                await trio.sleep(0.1)
        assert await count_rows(db, "events") == 0
        assert await count_rows(db, "jobs") == 0


async def test_a_statement_timeout_answers_503_also_in_the_one_by_one_fallback(dsn: str) -> None:
    """A database error that is not a lost connection (here the statement timeout, while
    another transaction holds the events table) is a 503, in the single hop, the batch
    and the fallback that stores a failed batch's deliveries one by one; never a 500."""
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}

    def update(n: int) -> bytes:
        return json.dumps({"update_id": n, "message": {"message_id": n, "chat": {"id": n, "type": "private"},
                                                     "text": f"#{n}"}}).encode()

    answers: dict[int, tuple[int, Any]] = {}
    async with open_database(dsn, min_size=2, max_size=6, statement_timeout=0.3) as db, running_app(db) as app:
        async def send(n: int) -> None:
            response = await app.client.post("/hooks/telegram", content=update(n), headers=headers)
            answers[n] = (response.status_code, response.json())

        async with events_locked(dsn), trio.open_nursery() as nursery:
            for n in range(6):
                nursery.start_soon(send, n)
        assert answers == {n: (503, {"error": "database unavailable"}) for n in range(6)}, answers
        assert await count_rows(db, "events") == 0


async def test_a_batch_is_bounded_by_bytes_not_only_by_count(db: Any, dsn: str) -> None:
    """Ten queued deliveries of ~300 kB with a 1 MiB bound go in hops of three, not in one
    parameter of 3 MB (64 bodies of 1 MiB made one of 105 MB)."""
    batcher = StoreBatcher(db, max_bytes=1024 * 1024)
    big = "x" * 300_000

    def large(n: int) -> dict[str, Any]:
        return store_params("site", HEADERS, json.dumps({"n": n, "pad": big}), f"k{n}", [])

    first, rest = await store_all(batcher, dsn, large(0), [large(n) for n in range(1, 11)])
    assert first[0] is not None and all(r[0] is not None for r in rest), (first, rest)
    assert batcher.hops_run == 1 + 4  # the held one, then 3 + 3 + 3 + 1
    assert await count_rows(db, "events") == 11


@pytest.mark.parametrize("deliveries", [1, 6])
async def test_a_hop_whose_connection_drops_after_commit_answers_202_for_what_it_stored(
    dsn: str, deliveries: int,
) -> None:
    """The connection drops after the hop's statement committed (a proxy cuts it at the
    server's ReadyForQuery): the deliveries were stored, so they must get their 202 with
    their event ids, not a 503 that makes a sender without an event id send again."""
    from tests.support.pg_proxy import pg_proxy

    async with pg_proxy(dsn) as proxy, open_database(proxy.dsn, min_size=2, max_size=4, pool_timeout=1.0) as db:
        batcher = StoreBatcher(db)
        results: dict[int, Any] = {}
        one = storer(batcher, results)

        # a single hop carries intake_store's text, a batch intake_store_many's
        proxy.cut_after_commit(b"autom_intake_store" if deliveries > 1 else b"insert into events")
        if deliveries == 1:
            await one(0)
        else:
            async with trio.open_nursery() as nursery, events_locked(dsn):
                nursery.start_soon(one, 100)  # held in flight: the others queue behind it
                while batcher.hops_run < 1:
                    await trio.sleep(0.005)
                for n in range(deliveries - 1):
                    nursery.start_soon(one, n)
                await wait_queued(batcher, deliveries - 1)
        assert proxy.cuts == 1
        assert all(not isinstance(r, Exception) for r in results.values()), results
        stored = {row["id"]: json.loads(row["body"])["n"] for row in await db.fetch_all(
            "select id, body from events")}
        assert {n: r[0] for n, r in results.items()} == {n: i for i, n in stored.items()}
        assert all(r[1] == 1 for r in results.values())
        assert await count_rows(db, "jobs") == len(results)


# --- a sender that leaves, a database that does not answer: the intake's deadline ---------


def telegram_request(n: int) -> bytes:
    """A whole HTTP/1.1 request delivering Telegram update ``n`` (for a raw socket)."""
    body = json.dumps({"update_id": n, "message": {"message_id": n, "chat": {"id": n, "type": "private"},
                                                 "text": f"#{n}"}}).encode()
    return (f"POST /hooks/telegram HTTP/1.1\r\nHost: t\r\nX-Telegram-Bot-Api-Secret-Token: {TELEGRAM_SECRET}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def stored_updates(db: Any) -> set[str]:
    return {row["dedup_key"] for row in await db.fetch_all("select dedup_key from events")}


async def test_a_sender_that_disconnects_before_its_delivery_reaches_the_database_is_not_stored(
    db: Any, dsn: str,
) -> None:
    """Two senders leave while the database is held (a lock on events): the one whose delivery
    is in the hop in flight is stored all the same (it was sent), the one still queued behind
    it is withdrawn when its turn comes (serve_http's receive tells without waiting that its
    sender has gone: ``departure_check``); nobody gets an answer, and the intake serves on."""
    async with running_app(db) as app:
        batcher = app.app.asgi_app.intake._batcher
        async with events_locked(dsn):
            first = await trio.open_tcp_stream("127.0.0.1", app.port)
            await first.send_all(telegram_request(1))
            await waiting_on_events_lock(db, 1)  # its hop is in flight, held by the lock
            second = await trio.open_tcp_stream("127.0.0.1", app.port)
            await second.send_all(telegram_request(2))
            with trio.fail_after(5):
                await wait_queued(batcher, 1)
            queued = batcher._queue[0]
            assert queued.left is not None and not queued.left()  # checked without waiting, not waited on
            await first.aclose()
            await second.aclose()
            with trio.fail_after(5):
                while not queued.left():  # the server has seen the second connection close
                    await trio.sleep(0.005)
        with trio.fail_after(5):
            while batcher.queued or batcher.hops_run < 1 or await count_rows(db, "events") < 1:
                await trio.sleep(0.01)
        response = await app.client.post("/hooks/telegram", content=telegram_request(3).split(b"\r\n\r\n")[1],
                                          headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})
        assert response.status_code == 202
        assert batcher.hops_run == 2  # the held one, then the third: the second never went
    assert await stored_updates(db) == {"1", "3"}


async def outcome(results: dict[int, Any], n: int, call: Awaitable[Any]) -> None:
    """``results[n]``: what ``call`` (a ``store``) returned, or the SenderGone / DatabaseUnavailable it raised."""
    try:
        results[n] = await call
    except (SenderGone, DatabaseUnavailable) as exc:
        results[n] = exc


async def start_held(nursery: trio.Nursery, batcher: StoreBatcher, one: Callable[..., Awaitable[None]],
                     *args: Any) -> None:
    """Start ``one(*args)`` and return once its hop is in flight (held there by ``events_locked``)."""
    hops = batcher.hops_run
    nursery.start_soon(one, *args)
    while batcher.hops_run == hops:
        await trio.sleep(0.005)


async def test_a_sender_that_leaves_while_its_delivery_waits_is_withdrawn_at_its_turn(db: Any, dsn: str) -> None:
    """``deliver``'s ``left``: asked when a hop would take a delivery. Of three queued behind a
    held hop, the first (the next hop's leader) and the third have lost their senders: the
    leader runs the hop for the second all the same, and neither departed one is stored."""
    batcher = StoreBatcher(db)
    gone: set[int] = set()
    results: dict[int, Any] = {}

    async def one(n: int) -> None:
        await outcome(results, n, store(batcher, params(n), left=lambda: n in gone))

    async with trio.open_nursery() as nursery, events_locked(dsn):
        await start_held(nursery, batcher, one, 0)
        for n in (1, 2, 3):
            nursery.start_soon(one, n)
            await wait_queued(batcher, n)
        gone.update({1, 3})
    assert set(results) == {0, 1, 2, 3}
    assert all(isinstance(results[n], SenderGone) and not results[n].sent for n in (1, 3)), results
    assert results[0][0] is not None and results[2][0] is not None
    assert batcher.hops_run == 2 and batcher.queued == 0
    assert {r["dedup_key"] for r in await db.fetch_all("select dedup_key from events")} == {"k0", "k2"}
    # nothing left to store after the departures: no hop, and the batcher is idle again
    async with trio.open_nursery() as nursery, events_locked(dsn):
        await start_held(nursery, batcher, one, 4)
        nursery.start_soon(one, 5)
        await wait_queued(batcher, 1)
        gone.add(5)
    assert isinstance(results[5], SenderGone) and batcher.hops_run == 3
    assert (await store(batcher, params(6)))[0] is not None


async def test_a_sender_waited_on_leaves_the_queue_at_once(db: Any, dsn: str) -> None:
    """``store``'s ``gone`` (a receive that cannot be checked without waiting): the queued
    delivery waits on it, and leaves the queue the moment it returns, the hop still held."""
    batcher = StoreBatcher(db)
    left = trio.Event()
    results: dict[int, Any] = {}

    async def one(n: int, gone: Any = None) -> None:
        await outcome(results, n, store(batcher, params(n), gone=gone))

    async with trio.open_nursery() as nursery, events_locked(dsn):
        await start_held(nursery, batcher, one, 0)
        nursery.start_soon(one, 1, left.wait)
        await wait_queued(batcher, 1)
        left.set()
        with trio.fail_after(5):
            while batcher.queued:  # gone while the hop is still held
                await trio.sleep(0.005)
        assert isinstance(results[1], SenderGone) and not results[1].sent
    assert results[0][0] is not None
    assert await db.fetch_val("select count(*) from events where dedup_key = 'k1'") == 0


async def test_a_departed_sender_at_its_deadline_is_withdrawn_without_a_503(db: Any, dsn: str) -> None:
    """Still queued at its deadline, a delivery whose sender has gone is withdrawn (SenderGone),
    not answered 503; one whose sender is there gets the 503 (DatabaseUnavailable)."""
    batcher = StoreBatcher(db)
    results: dict[int, Any] = {}

    async def one(n: int, deadline: float, departed: bool) -> None:
        await outcome(results, n, store(batcher, params(n), deadline, left=lambda: departed))

    async with trio.open_nursery() as nursery, events_locked(dsn):
        await start_held(nursery, batcher, one, 0, math.inf, False)
        soon = trio.current_time() + 0.3
        nursery.start_soon(one, 1, soon, True)
        nursery.start_soon(one, 2, soon, False)
        with trio.fail_after(5):
            while len(results) < 2:
                await trio.sleep(0.005)
    assert isinstance(results[1], SenderGone) and not results[1].sent
    assert isinstance(results[2], DatabaseUnavailable)
    assert results[0][0] is not None
    assert {r["dedup_key"] for r in await db.fetch_all("select dedup_key from events")} == {"k0"}


async def test_a_delivery_the_database_does_not_store_within_its_deadline_gets_503_and_is_not_stored(
    db: Any, dsn: str,
) -> None:
    """The database holds every delivery (a lock on events) past the intake's deadline: the one
    in the hop in flight is cancelled there, the one queued behind it leaves the queue; both
    get 503 (nothing was stored: the hop's commit record says so) well before the lock goes."""
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    answers: dict[int, tuple[int, Any, float]] = {}
    async with running_app(db) as app:
        intake = app.app.asgi_app.intake
        intake.deadline_seconds = 3.0  # 10 s in production; the hop is cut off FATE_SECONDS (2 s) before

        async def send(n: int) -> None:
            started = trio.current_time()
            body = telegram_request(n).split(b"\r\n\r\n")[1]
            response = await app.client.post("/hooks/telegram", content=body, headers=headers)
            answers[n] = (response.status_code, response.json(), trio.current_time() - started)

        async with events_locked(dsn):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, 1)
                await waiting_on_events_lock(db, 1)
                nursery.start_soon(send, 2)
                with trio.fail_after(5):
                    await wait_queued(intake._batcher, 1)
            # both answered while the lock is still held: bounded by the deadline, not by the database
            assert {n: a[:2] for n, a in answers.items()} == {
                n: (503, {"error": "database unavailable"}) for n in (1, 2)}, answers
            assert all(a[2] < 8 for a in answers.values()), answers
        assert await count_rows(db, "events") == 0
        await send(3)  # the lock is gone: the intake stores again
        assert answers[3][0] == 202
    assert await stored_updates(db) == {"3"}


@pytest.mark.parametrize("held", [1.5, 2.5])
async def test_a_hop_cancelled_at_its_deadline_that_had_committed_answers_with_what_it_stored(
    dsn: str, held: float,
) -> None:
    """The hop's statement commits but its answer comes late (a proxy holds it back past the
    cut-off): the sender gets its event id, not a 503 that would make it deliver again, by
    its deadline. Held 1.5 s, the answer comes while the cancel waits for it (cut off at
    1 s, FATE_SECONDS before the deadline; the connection closed CANCEL_SECONDS later);
    held 2.5 s, the connection is closed first and the commit record tells."""
    from tests.support.pg_proxy import pg_proxy

    async with pg_proxy(dsn) as proxy, open_database(proxy.dsn, min_size=2, max_size=4, pool_timeout=1.0) as db:
        batcher = StoreBatcher(db)
        proxy.hold_after_commit(b"insert into events", held)
        outcome = await store(batcher, params(1), trio.current_time() + FATE_SECONDS + 1.0)
        if held < 1.0 + CANCEL_SECONDS:
            assert proxy.holds == 1  # forwarded: the connection closes at 2 s at the earliest
        rows = await db.fetch_all("select id, body from events")
        assert [(row["id"], json.loads(row["body"])) for row in rows] == [(outcome[0], {"n": 1})]
        assert outcome[1] == 1
