"""The trio-native path of autom.db (autom.db.native) against a real PostgreSQL.

``Database.execute/fetch_*`` run on ``TrioConnection`` s of a ``TrioPool`` (no
thread); test_bridge.py covers the shared contract (errors, cancel, restarts).
These make the native path's own failures happen: a cancel during the first,
pipelined run of a prepared statement, a backend killed while idle or mid-query,
every slot busy, LISTEN-free notifies with ``aclosing``, host names.
"""

from __future__ import annotations

import contextlib
import json
import socket
from contextlib import aclosing
from functools import partial
from typing import Any

import psycopg
import pytest
import trio
from psycopg import errors

from autom.db import native, open_database
from autom.db.native import TrioConnection, TrioPool
from autom.errors import DatabaseUnavailable, QueryError
from tests.integration.test_bridge import admin_fetch, unique_name


async def backends(dsn: str, name: str) -> list[tuple[Any, ...]]:
    """pid, state, query of every connection named ``name``."""
    return await admin_fetch(
        dsn, "select pid, state, query from pg_stat_activity where application_name = %s", [name]
    )


async def terminate(dsn: str, name: str) -> None:
    """Terminate every backend named ``name`` and wait until they are gone."""
    await admin_fetch(
        dsn, "select pg_terminate_backend(pid) from pg_stat_activity where application_name = %s", [name]
    )
    while await backends(dsn, name):
        await trio.sleep(0.01)


async def test_many_tasks_share_few_connections(empty_dsn: str) -> None:
    name = unique_name("conc")
    async with open_database(empty_dsn, min_size=1, max_size=4, name=name) as db:
        results: list[int] = []

        async def worker(i: int) -> None:
            for j in range(20):
                results.append(await db.fetch_val("select %s::int * 100 + %s::int", [i, j], prepare=j % 2 == 0))

        async with trio.open_nursery() as nursery:
            for i in range(32):
                nursery.start_soon(worker, i)
        assert sorted(results) == sorted(i * 100 + j for i in range(32) for j in range(20))
        assert len(await backends(empty_dsn, name)) <= 4
        stats = db.stats
        assert stats["busy"] == 0 and stats["waiting"] == 0 and 1 <= stats["size"] <= 4 and stats["max"] == 4


async def test_cancel_during_the_first_prepared_run_leaves_a_clean_connection(empty_dsn: str) -> None:
    name = unique_name("cancel1st")
    query = "select %s::int as n from pg_sleep(%s) /* first-run-cancel */"
    async with open_database(empty_dsn, min_size=1, max_size=1, name=name) as db:
        pid = await db.fetch_val("select pg_backend_pid()")
        # cancelled in the pipeline that prepares and runs it at once
        with trio.move_on_after(0.2) as scope:
            await db.fetch_val(query, [1, 10], prepare=True)
        assert scope.cancelled_caught
        assert [row for row in await backends(empty_dsn, name) if row[1] == "active"] == []
        # the very same connection, clean: no transaction, no pipeline, and the statement works
        assert await db.fetch_val("select pg_backend_pid()") == pid
        # this database only: other suites share the server, and their sessions may be idle in a transaction
        assert await db.fetch_val("select count(*) from pg_stat_activity"
                                  " where state like 'idle in%' and datname = current_database()") == 0
        assert await db.fetch_val(query, [2, 0], prepare=True) == 2
        assert await db.fetch_val(query, [3, 0], prepare=True) == 3
        assert await db.fetch_val("select pg_backend_pid()") == pid


async def test_waiting_for_read_or_write_is_cancelled_plainly() -> None:
    # Wait.RW (libpq's send buffer full): two waits in a nursery; an outer cancel must
    # come out as trio.Cancelled (which the scope catches), not as an exception group
    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                a.send(b"x" * 65536)
        raised: list[str] = []
        with trio.move_on_after(0.05) as scope:
            try:
                await native._wait_either(a.fileno())
            except trio.Cancelled:
                raised.append("Cancelled")
                raise
            except BaseException as exc:  # a cancel scope would swallow a group of Cancelled too
                raised.append(type(exc).__name__)
                raise
        assert scope.cancelled_caught
        assert raised == ["Cancelled"]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("prepare", [True, False], ids=["first-prepared-run", "later-runs"])
async def test_a_cancel_while_a_big_statement_is_sent_is_a_plain_cancel(empty_dsn: str, prepare: bool) -> None:
    # A parameter of many MB fills libpq's send buffer, so the driver waits for the
    # socket to be readable or writable (Wait.RW, two waits in a nursery). A cancel
    # there, or at the pipeline's exit after it (the first prepared run), must reach
    # the caller as the trio.Cancelled its scope catches: not an exception group, not
    # "cannot exit pipeline mode while busy". Whether a given delay lands before, in or
    # after the send varies: every outcome but another exception is right.
    name = unique_name("bigsend")
    big = "x" * (16 * 1024 * 1024)
    async with open_database(empty_dsn, min_size=1, max_size=2, name=name) as db:
        if not prepare:
            # later runs: the first (pipelined, prepared) run of nothing of this is behind us
            assert await db.fetch_val("select length(%s)", ["abc"]) == 3
        outcomes: set[str] = set()
        for i in range(40):
            delay = 0.001 * (i + 1)
            with trio.move_on_after(delay) as scope:
                # a new text each time: with prepare=True every run is a first run
                n = await db.fetch_val(f"select length(%s) /* {i} */", [big], prepare=prepare)
                assert n == len(big)
            outcomes.add("cancelled" if scope.cancelled_caught else "done")
        assert outcomes <= {"cancelled", "done"}
        # nothing left running on the server, and the database answers as before
        assert [row for row in await backends(empty_dsn, name) if row[1] == "active"] == []
        assert await db.fetch_val("select 1") == 1
        assert db.stats["busy"] == 0


async def test_a_cancel_before_the_call_sends_nothing(empty_dsn: str) -> None:
    name = unique_name("precancel")
    async with open_database(empty_dsn, min_size=1, max_size=1, name=name) as db:
        await db.execute("create table hits (n int)")
        with trio.CancelScope() as scope:
            scope.cancel()
            await db.execute("insert into hits values (1)")
        assert scope.cancelled_caught
        assert await db.fetch_val("select count(*) from hits") == 0


async def test_idle_connections_killed_are_replaced_without_an_error(empty_dsn: str) -> None:
    name = unique_name("idlekill")
    async with open_database(empty_dsn, min_size=3, max_size=3, name=name) as db:
        query = "select %s::int + 1 from pg_sleep(%s) /* after-kill */"
        async with trio.open_nursery() as nursery:  # prepared on all three
            for i in range(3):
                nursery.start_soon(partial(db.fetch_val, query, [i, 0.05], prepare=True))
        before = {row[0] for row in await backends(empty_dsn, name)}
        await terminate(empty_dsn, name)
        # the dead ones are noticed on borrow (EOF waiting on the socket): no call fails
        for i in range(10):
            assert await db.fetch_val(query, [i, 0], prepare=True) == i + 1
        after = {row[0] for row in await backends(empty_dsn, name)}
        assert after and not after & before
        prepared = "select count(*) from pg_prepared_statements where statement like '%%after-kill%%'"
        assert await db.fetch_val(prepared) == 1


async def test_a_backend_killed_mid_statement_is_unavailable_then_recovers(empty_dsn: str) -> None:
    name = unique_name("midkill")
    async with open_database(empty_dsn, min_size=1, max_size=2, name=name) as db:

        async def kill_soon() -> None:
            while not [r for r in await backends(empty_dsn, name) if r[1] == "active" and "pg_sleep" in r[2]]:
                await trio.sleep(0.01)
            await terminate(empty_dsn, name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_soon)
            with pytest.raises(DatabaseUnavailable) as info:
                await db.execute("select pg_sleep(10)")
        assert info.value.maybe_applied
        assert isinstance(info.value.__cause__, psycopg.OperationalError)
        assert await db.fetch_val("select 7") == 7


async def test_server_errors_are_query_errors_with_their_sqlstate(empty_dsn: str) -> None:
    async with open_database(empty_dsn, min_size=1, max_size=1) as db:
        for prepare in (False, True, True):
            with pytest.raises(QueryError) as info:
                await db.fetch_val("select 1 / %s::int", [0], prepare=prepare)
            assert info.value.sqlstate == errors.DivisionByZero.sqlstate and not info.value.transient
            assert isinstance(info.value.__cause__, errors.DivisionByZero)
        with pytest.raises(QueryError) as info:
            await db.execute("select %s::int", ["not a number"], prepare=True)
        assert info.value.sqlstate == errors.InvalidTextRepresentation.sqlstate
        assert await db.fetch_val("select 5") == 5


async def test_every_slot_busy_is_unavailable_after_pool_timeout(empty_dsn: str) -> None:
    async with open_database(empty_dsn, min_size=1, max_size=2, pool_timeout=0.3) as db:
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(db.execute, "select pg_sleep(1.5)")
            while db.stats["busy"] < 2:
                await trio.sleep(0.01)
            with pytest.raises(DatabaseUnavailable) as info:
                await db.fetch_val("select 1")
            assert not info.value.maybe_applied
            assert db.stats["waiting"] == 0
            # a caller's own deadline wins over pool_timeout: a plain cancel, nothing raised
            with trio.move_on_after(0.05) as scope:
                await db.fetch_val("select 1")
            assert scope.cancelled_caught
        assert await db.fetch_val("select 1") == 1


async def test_unreachable_server_fails_the_call_within_pool_timeout(empty_dsn: str) -> None:
    name = unique_name("unreach")
    async with open_database(empty_dsn, min_size=1, max_size=1, pool_timeout=0.5, name=name) as db:
        # the pool's only connection dies; new ones are refused by a bad port from now on
        db._pool._conninfo = "postgresql://postgres@127.0.0.1:1/postgres"
        await terminate(empty_dsn, name)
        with pytest.raises(DatabaseUnavailable) as info:
            await db.fetch_val("select 1")
        assert "Connection refused" in str(info.value) or "connection" in str(info.value)
        assert await db.ping(timeout=0.3) is False
        db._pool._conninfo = empty_dsn  # back: the next call connects again
        assert await db.fetch_val("select 1") == 1


async def test_trio_connection_directly(empty_dsn: str) -> None:
    conn = await TrioConnection.connect_trio(empty_dsn)
    try:
        assert conn.autocommit
        # transaction(), rolled back on error, and the dict rows
        await conn.execute("create temporary table t (n int)")
        with pytest.raises(errors.DivisionByZero):
            async with conn.transaction():
                await conn.execute("insert into t values (1)")
                await conn.execute("select 1 / 0")
        cursor = await conn.execute("select count(*) as n from t")
        assert await cursor.fetchone() == {"n": 0}
        # a pipeline of several statements
        async with conn.pipeline():
            first = await conn.execute("select 1 as a")
            second = await conn.execute("select 2 as b")
        assert await first.fetchone() == {"a": 1} and await second.fetchone() == {"b": 2}
        # notifies(): a timeout ends it, aclosing() gives the lock back
        await conn.execute("listen native_test")
        async with aclosing(conn.notifies(timeout=0.05)) as gen:
            assert [n async for n in gen] == []
        await conn.execute("notify native_test, 'hi'")
        async with aclosing(conn.notifies()) as gen:
            async for note in gen:
                assert note.payload == "hi"
                break
        assert not conn.lock.locked()  # type: ignore[attr-defined]
        assert conn.clean
    finally:
        await conn.close()
    assert conn.closed


async def test_json_and_jsonb_read_as_json_loads_reads_them(empty_dsn: str) -> None:
    """The native connection's own JSON loaders (autom.db.native._loads) give what psycopg's give."""
    values = ['{}', '{"a": [1, 2.5, null, true], "é": "ü\\u00e9 ☃ 😀", "n": {"x": "\\\\"}}', '[]', '"s"', '3']
    conn = await TrioConnection.connect_trio(empty_dsn)
    try:
        for text in values:
            cursor = await conn.execute("select %s::jsonb as b, %s::json as j", [text, text])
            row = await cursor.fetchone()
            assert row is not None
            assert row["b"] == json.loads(text) and row["j"] == json.loads(text), text
        cursor = await conn.execute("select null::jsonb as b")
        assert await cursor.fetchone() == {"b": None}
    finally:
        await conn.close()


async def test_host_names_are_resolved_off_the_trio_thread(empty_dsn: str) -> None:
    params = psycopg.conninfo.conninfo_to_dict(empty_dsn)
    if params.get("host") not in ("127.0.0.1", "localhost"):
        pytest.skip("needs a server on localhost")
    conn = await TrioConnection.connect_trio(empty_dsn, host="localhost", connect_timeout=2)
    try:
        cursor = await conn.execute("select 1 as one")
        assert await cursor.fetchone() == {"one": 1}
    finally:
        await conn.close()


async def test_pool_retires_connections_idle_too_long(empty_dsn: str) -> None:
    pool = TrioPool(empty_dsn, {"application_name": unique_name("idle")}, min_size=1, max_size=3, max_idle=0.05)
    await pool.open()
    try:
        conns = [await pool.borrow(trio.current_time() + 5) for _ in range(3)]
        assert pool.size == 3
        for conn in conns:
            pool.give_back(conn)
        await trio.sleep(0.1)
        pool.give_back(await pool.borrow(trio.current_time() + 5))
        assert pool.size == 1 and pool.available == 1
    finally:
        pool.close()
    assert pool.size == 0


async def test_pool_closes_connections_older_than_max_lifetime(empty_dsn: str) -> None:
    """A connection is used for at most max_lifetime (psycopg_pool recycled its connections
    after an hour; the native pool kept its first ones for ever): past it, one given back
    is closed, and one found idle is closed instead of lent, also at min_size."""
    name = unique_name("life")
    pool = TrioPool(empty_dsn, {"application_name": name}, min_size=1, max_size=2, max_lifetime=1.5)
    assert TrioPool(empty_dsn, {}, min_size=0, max_size=1).max_lifetime == 3600  # the default: psycopg_pool's

    async def pid(conn: TrioConnection) -> int:
        cursor = await conn.execute("select pg_backend_pid() as pid")
        row = await cursor.fetchone()
        assert row is not None
        return int(row["pid"])

    await pool.open()
    try:
        first = await pool.borrow(trio.current_time() + 5)
        first_pid = await pid(first)
        pool.give_back(first)
        again = await pool.borrow(trio.current_time() + 5)
        assert await pid(again) == first_pid  # young: lent again
        await trio.sleep(1.6)
        pool.give_back(again)  # past its lifetime while borrowed: closed on its way back
        assert (pool.size, pool.available, pool.discarded) == (0, 0, 1)
        fresh = await pool.borrow(trio.current_time() + 5)
        fresh_pid = await pid(fresh)
        assert fresh_pid != first_pid
        pool.give_back(fresh)
        await trio.sleep(1.6)  # past its lifetime while idle: closed when found, a new one lent
        newest = await pool.borrow(trio.current_time() + 5)
        assert await pid(newest) not in (first_pid, fresh_pid)
        assert pool.discarded == 2 and pool.connects == 3
        pool.give_back(newest)
        with trio.fail_after(5):  # the server saw the old ones go
            while {row[0] for row in await backends(empty_dsn, name)} & {first_pid, fresh_pid}:
                await trio.sleep(0.02)
    finally:
        pool.close()


async def test_listen_retries_a_refusing_server_until_cancelled(caplog: pytest.LogCaptureFixture) -> None:
    from autom.db.listen import serve_notifications

    started = False

    class Status:
        def started(self, value: None = None) -> None:
            nonlocal started
            started = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(
            serve_notifications, "postgresql://postgres@127.0.0.1:1/postgres", {"connect_timeout": 1}, "nowhere",
            lambda _payload: None, task_status=Status(),  # type: ignore[arg-type]
        ))
        while sum("LISTEN connection failed" in r.getMessage() for r in caplog.records) < 2:
            await trio.sleep(0.05)
        nursery.cancel_scope.cancel()  # in its backoff: it just stops
    assert not started
    delays = [r.getMessage() for r in caplog.records if "LISTEN connection failed" in r.getMessage()]
    assert "retrying in 0.5 s" in delays[0] and "retrying in 1.0 s" in delays[1]
