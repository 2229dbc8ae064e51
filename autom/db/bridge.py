"""The psycopg bridge for trio: native trio connections for single statements, threads for the rest.

Two paths behind one interface:

- ``execute``/``fetch_*``/``ping`` (single autocommit statements: the claim,
  completion, renewals, the intake's store, enqueue, counts) run on
  ``autom.db.native``: psycopg's ``AsyncConnection`` driven by trio on its
  socket, from a small trio pool. No thread hop: measured ~3x the calls per
  second and a third of the CPU per call of the threaded path (bench/RESULTS.md,
  "Speed round two: the trio-native driver").
- ``run(fn)`` and ``transaction()`` call sync code (``fn(conn)``) and stay on sync
  psycopg + ``psycopg_pool.ConnectionPool`` in worker threads: each is one
  ``trio.to_thread.run_sync`` hop that borrows a connection, runs the call and
  returns the connection (folding the three into one hop doubled throughput,
  measured when the bridge was chosen). That pool starts empty and grows on demand.

Both pools share one ``trio.CapacityLimiter`` of ``max_size`` slots: a native
call, a ``run`` and a ``transaction()`` each hold one, so at most ``max_size``
connections are busy at a time, a caller waits at most ``pool_timeout`` (or its
own trio deadline) for a slot, and ``stats`` counts both. Cancellation and errors
behave the same on both paths; the native path's details are in autom.db.native.
What follows describes the threaded path.

Cancellation. A thread cannot be interrupted, and a plain ``to_thread`` ignores
a trio cancel while the query runs on. Here the hop is started with
``abandon_on_cancel=True`` and the ``except trio.Cancelled`` path asks the
server to cancel the query (``conn.cancel_safe()``), waits (shielded, bounded)
until the worker thread has rolled back and returned the connection, and only
then lets ``Cancelled`` propagate. No watcher task per call: the cancel path
costs a second hop, but only when a cancel actually happens. A
``threading.Lock`` per call orders the cancel request before the connection's
return to the pool, so a late cancel can never hit the next borrower's query.

Errors. This is where psycopg's errors are translated into autom's, so no
room above imports psycopg: a connection-level failure (pool timeout, broken
connection, server shutting down) becomes :class:`autom.errors.DatabaseUnavailable`;
every other psycopg error (``UniqueViolation``, ``QueryCanceled``,
``SerializationFailure``...) becomes :class:`autom.errors.QueryError` with its
SQLSTATE and whether it is transient; the psycopg error is the ``__cause__``.
Errors of a ``run`` function's statements are translated too (inside ``fn``
they are still psycopg's: a savepoint can catch them there).

Restarts. After a server restart the idle pool connections are dead. Before a
borrowed connection is used, a zero-timeout ``poll()`` on its socket tells
whether the server said something while it sat idle (a dead backend leaves
EOF/FATAL there); only then is it checked with a round trip and, if dead,
replaced, and ``pool.check()`` sweeps its dead siblings. A failure during a
call triggers the same sweep. psycopg_pool reconnects in the background, with a
short ``reconnect_timeout`` so that a long outage does not leave it sleeping in
its backoff once the server is back (see ``open_database``). While the server
is down, calls fail with ``DatabaseUnavailable`` after ``pool_timeout``.

LISTEN runs on a native connection of its own, outside the pools (``autom.db.listen``).

Prepared statements. ``execute``/``fetch_*`` take psycopg's ``prepare``: with
``True`` the statement is prepared at its first run on each pool connection
(psycopg's per-connection cache; by default only at the 6th run on the same
connection, which a rotating pool rarely reaches), then runs without parsing,
and after PostgreSQL's five custom plans with its cached plan. Use it for single
autocommit statements run often (the queue's complete, renew, release and
enqueue; the intake's store): a ``run`` transaction's BEGIN and COMMIT cost what
preparing saves (bench/RESULTS.md, Worker). A connection replaced after a
restart starts with an empty cache and prepares again; a statement whose run
failed is dropped from the cache and prepared under a new name next time.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, NoReturn, TypeVar, cast

import psycopg
import trio
from psycopg import Connection, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from autom.db.listen import serve_notifications
from autom.db.native import TrioConnection, TrioPool, has_unread_input
from autom.errors import AutomError, DatabaseUnavailable, QueryError

__all__ = ["Conn", "Database", "Params", "Query", "Row", "Tx", "open_database"]

log = logging.getLogger("autom.db")

T = TypeVar("T")

Row = dict[str, Any]
"""A result row: column name to value (``dict_row``)."""

Params = Sequence[Any] | Mapping[str, Any]
"""Query parameters: positional (``%s``) or named (``%(name)s``)."""

Query = str | bytes | sql.SQL | sql.Composed
"""A statement: a string (``%s`` / ``%(name)s`` placeholders), bytes, or a composed ``psycopg.sql`` object."""

Conn = Connection[Row]
"""The connection a ``run`` function gets: psycopg's, with ``dict_row`` rows."""

# How long a cancelled call waits for its worker thread to roll back and
# return the connection before giving up on it (it then finishes on its own).
CANCEL_GRACE_SECONDS: Final = 5.0

# SQLSTATEs that mean "this connection is gone" although psycopg maps them to
# OperationalError like plenty of ordinary errors (serialization failure,
# lock not available, query canceled): admin/crash shutdown, cannot connect now.
_CONNECTION_LOST_STATES: Final = frozenset({"57P01", "57P02", "57P03"})

# SQLSTATEs of a statement that may well work if simply run again (QueryError.transient):
# lock_not_available, query_canceled (statement timeout), serialization_failure, deadlock_detected.
TRANSIENT_STATES: Final = frozenset({"55P03", "57014", "40001", "40P01"})

# States of one call, shared by the trio task and its worker thread.
_PENDING: Final = 0  # the thread has not started, or is still waiting for a connection
_RUNNING: Final = 1  # the call runs on call.conn; a cancel goes to the server
_DONE: Final = 2  # the thread is done with the query (it may still be returning the connection)
_ABANDONED: Final = 3  # cancelled while pending: the thread must not start the call


class _Abandoned(Exception):
    """Raised by a worker thread whose trio task gave up on it; trio discards the outcome."""


class _Call:
    """What a trio task and its worker thread share about one database call."""

    __slots__ = ("conn", "finished", "lock", "state")

    def __init__(self, conn: Conn | None = None) -> None:
        self.lock = threading.Lock()
        # set when no thread will touch `conn` for this call any more
        self.finished = threading.Event()
        self.conn = conn
        self.state = _PENDING

    def abandon_if_pending(self) -> bool:
        """Mark a call that never reached the server as abandoned; never blocks the trio thread."""
        if not self.lock.acquire(blocking=False):
            return False  # a cancel or the worker holds it: take the slow path
        try:
            if self.state != _PENDING:
                return False
            self.state = _ABANDONED
            self.finished.set()
            return True
        finally:
            self.lock.release()


def _cancel_call(call: _Call, grace: float) -> None:
    """Stop a call whose trio task was cancelled (runs in a helper thread)."""
    deadline = time.monotonic() + grace
    with call.lock:
        if call.state == _PENDING:
            # Still waiting for a pool connection: nothing runs on the server.
            call.state = _ABANDONED
            call.finished.set()
            return
        if call.state == _RUNNING and call.conn is not None:
            # Holding the lock while the request is sent is the point: the worker
            # cannot return the connection before the cancel has been delivered.
            try:
                call.conn.cancel_safe(timeout=grace)
            except Exception as exc:
                log.warning("could not cancel a query on the server: %s", exc)
    if not call.finished.wait(max(0.0, deadline - time.monotonic())):
        log.warning("a cancelled database call still runs after %.1f s; it will finish on its own", grace)


def _is_unavailable(exc: BaseException, conn: Conn | TrioConnection | None) -> bool:
    """Whether ``exc`` means the database cannot be reached (as opposed to an error of the query)."""
    if not isinstance(exc, psycopg.Error):
        return False
    if conn is not None and conn.closed:
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate  # None for client-side errors: pool timeout, lost connection, ...
    return state is None or state.startswith("08") or state in _CONNECTION_LOST_STATES


def _translate(exc: psycopg.Error, conn: Conn | TrioConnection | None) -> AutomError:
    """autom's error for a psycopg error: ``DatabaseUnavailable`` for a lost connection, else ``QueryError``."""
    if _is_unavailable(exc, conn):
        # the statement was on its way or running: it may have been applied
        return DatabaseUnavailable(f"database connection lost: {exc}", maybe_applied=True)
    state = exc.sqlstate
    return QueryError(
        f"{type(exc).__name__} (SQLSTATE {state or 'none'}): {exc}", sqlstate=state, transient=state in TRANSIENT_STATES
    )


def _run_statement(conn: Conn, query: Query, params: Params | None, prepare: bool | None) -> psycopg.Cursor[Row]:
    if prepare and isinstance(query, str):
        seen: set[str] = vars(conn).setdefault("_autom_prepared", set())
        if query not in seen:
            # The first run on this connection. psycopg alone would send the PREPARE
            # and wait for it, then the EXECUTE: two round trips, two implicit
            # transactions. In a pipeline both go with one Sync, as an unprepared
            # statement would (only the first run: the pipeline costs ~40 us a call).
            with conn.pipeline():
                cursor = conn.execute(query, params, prepare=True)
            seen.add(query)
            return cursor
    return conn.execute(query, params, prepare=prepare)


def _execute(conn: Conn, query: Query, params: Params | None, prepare: bool | None = None) -> int:
    return _run_statement(conn, query, params, prepare).rowcount


def _fetch_all(conn: Conn, query: Query, params: Params | None, prepare: bool | None = None) -> list[Row]:
    return _run_statement(conn, query, params, prepare).fetchall()


def _fetch_one(conn: Conn, query: Query, params: Params | None, prepare: bool | None = None) -> Row | None:
    return _run_statement(conn, query, params, prepare).fetchone()


def _fetch_val(conn: Conn, query: Query, params: Params | None, prepare: bool | None = None) -> Any:
    row = _run_statement(conn, query, params, prepare).fetchone()
    return None if row is None else next(iter(row.values()), None)


# What a native call returns (``Database._native``).
_ROWCOUNT: Final = 0
_ALL: Final = 1
_ONE: Final = 2
_VAL: Final = 3


async def _native_result(
    conn: TrioConnection, kind: int, query: Query, params: Params | None, prepare: bool | None
) -> Any:
    if prepare and isinstance(query, str) and query not in conn.prepared_here:
        # The first run on this connection: PREPARE and EXECUTE in one pipeline, one
        # round trip and one implicit transaction (see _run_statement).
        async with conn.pipeline():
            cursor = await conn.execute(query, params, prepare=True)
        conn.prepared_here.add(query)
    else:
        cursor = await conn.execute(query, params, prepare=prepare)
    if kind == _ROWCOUNT:
        return cursor.rowcount
    if kind == _ALL:
        return await cursor.fetchall()
    row = await cursor.fetchone()
    if kind == _ONE or row is None:
        return row
    return next(iter(row.values()), None)


def _fail_if_aborted(conn: Conn) -> None:
    # psycopg's commit() (and the end of conn.transaction()) quietly rolls back
    # a failed transaction: code that caught a statement's error without a
    # savepoint must not believe its other statements were committed.
    if conn.info.transaction_status == TransactionStatus.INERROR:
        raise psycopg.errors.InFailedSqlTransaction("a statement of this transaction failed: it was rolled back")


def _commit(conn: Conn) -> None:
    _fail_if_aborted(conn)
    conn.commit()


class Database:
    """An open connection pool; every method is one thread hop (see the module docstring).

    Make it with :func:`open_database`.
    """

    def __init__(
        self,
        pool: ConnectionPool[Conn],
        native: TrioPool,
        *,
        conninfo: str,
        connect_kwargs: dict[str, Any],
        max_size: int,
        pool_timeout: float,
        name: str,
    ) -> None:
        self._pool = pool
        self._native_pool = native
        self._conninfo = conninfo
        self._connect_kwargs = connect_kwargs
        self._pool_timeout = pool_timeout
        self._name = name
        # The slots: a native call, a run() thread and a transaction() each hold one,
        # so both pools together serve at most max_size callers at a time.
        self._limiter = trio.CapacityLimiter(max_size)
        # Cancel/cleanup hops must never queue behind the calls they clean up.
        self._cleanup_limiter = trio.CapacityLimiter(max_size)
        self._sweeping = threading.Lock()

    # -- public API -------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn(conn, *args)`` in a worker thread inside one transaction; return its result.

        ``conn`` is a ``psycopg.Connection`` with ``dict_row`` rows. The
        transaction commits if ``fn`` returns and rolls back if it raises (or if
        a statement failed and ``fn`` swallowed the error without a savepoint:
        then a ``QueryError`` with SQLSTATE 25P02, in_failed_sql_transaction, is
        raised). On trio cancellation the query is cancelled on the server, the
        thread rolls back and returns the connection, then ``trio.Cancelled``
        propagates. Raises :class:`DatabaseUnavailable` when the database cannot
        be reached, :class:`QueryError` for any other database error.
        """
        return await self._pooled(fn, args, in_transaction=True)

    async def execute(self, query: Query, params: Params | None = None, *, prepare: bool | None = None) -> int:
        """Run one statement in its own transaction; return its row count.

        ``prepare``: psycopg's (see the module docstring, Prepared statements):
        True prepares the statement at its first run on each connection.
        """
        return int(await self._native(_ROWCOUNT, query, params, prepare))

    async def fetch_all(self, query: Query, params: Params | None = None, *, prepare: bool | None = None) -> list[Row]:
        """Every row of one statement, as dicts (``prepare`` as for ``execute``)."""
        return cast(list[Row], await self._native(_ALL, query, params, prepare))

    async def fetch_one(self, query: Query, params: Params | None = None, *, prepare: bool | None = None) -> Row | None:
        """The first row of one statement, or ``None`` (``prepare`` as for ``execute``)."""
        return cast(Row | None, await self._native(_ONE, query, params, prepare))

    async def fetch_val(self, query: Query, params: Params | None = None, *, prepare: bool | None = None) -> Any:
        """The first column of the first row, or ``None`` when there is no row (``prepare`` as for ``execute``)."""
        return await self._native(_VAL, query, params, prepare)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        """Hold one connection for several hops: ``async with db.transaction() as tx: await tx.run(fn)``.

        Commits when the block ends normally; rolls back (shielded) on an
        exception or a cancellation. If a statement failed inside the block and
        its error was caught, the end of the block raises a ``QueryError``
        (SQLSTATE 25P02) instead of pretending to commit.
        Use the ``Tx`` from one task at a time. The block holds one of the pool's
        ``max_size`` slots, so do not nest ``db`` calls that wait for another
        slot inside it when the pool is small.
        """
        borrower = object()
        await self._limiter.acquire_on_behalf_of(borrower)
        tx = Tx(self)
        try:
            await tx._begin(self._borrow_timeout())
            yield tx
            await tx._commit()
        finally:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + CANCEL_GRACE_SECONDS
                await trio.to_thread.run_sync(tx._close_sync, limiter=self._cleanup_limiter, abandon_on_cancel=True)
            if scope.cancelled_caught:
                log.warning("a transaction's connection is still busy; it goes back to the pool later")
            self._limiter.release_on_behalf_of(borrower)

    async def ping(self, timeout: float = 1.0) -> bool:  # noqa: ASYNC109 (the interface others use)
        """Whether ``select 1`` answers within ``timeout`` (waiting for a connection included).

        Never raises (but lets an outer cancellation through) and never hangs.
        """
        with trio.move_on_after(timeout):
            try:
                value = await self._native(_VAL, "select 1", None, None, grace=timeout)
            except Exception as exc:
                log.debug("ping failed: %s", exc)
                return False
            return bool(value == 1)
        return False

    async def listen(
        self,
        channel: str,
        on_notify: Callable[[str], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """LISTEN on ``channel`` forever, calling ``on_notify(payload)`` in trio for each NOTIFY.

        Uses a dedicated autocommit native connection (not from the pools; see
        autom.db.listen), named ``<name>-listen``. ``task_status.started()`` is
        called once listening (it keeps retrying until the first LISTEN works). If
        the connection breaks it reconnects with backoff (0.5 s to 5 s) forever and
        calls ``on_notify("")`` after each reconnect, since notifications may have
        been missed meanwhile. Stops at once when cancelled.
        """
        kwargs = {**self._connect_kwargs, "autocommit": True, "application_name": f"{self._name}-listen"}
        await serve_notifications(self._conninfo, kwargs, channel, on_notify, task_status=task_status)

    @property
    def stats(self) -> dict[str, int]:
        """Pool numbers for metrics.

        ``size``: connections open; ``available``: idle ones; ``busy``: calls
        and transactions holding a slot; ``waiting``: tasks queued for a slot;
        ``max``: the pool's ``max_size``.
        """
        pool = self._pool.get_stats()
        native = self._native_pool
        # Not psycopg_pool's requests_waiting: it keeps counting clients whose
        # getconn timed out until a connection comes back (*measured*).
        limiter = self._limiter.statistics()
        return {
            "size": pool.get("pool_size", 0) + native.size,
            "available": pool.get("pool_available", 0) + native.available,
            "busy": limiter.borrowed_tokens,
            "waiting": limiter.tasks_waiting,
            "max": int(limiter.total_tokens),
        }

    # -- trio side of a hop ------------------------------------------------

    def _borrow_timeout(self) -> float:
        """How long a thread may wait for a pool connection: pool_timeout, or less if a deadline is nearer."""
        remaining = trio.current_effective_deadline() - trio.current_time()
        return max(0.0, min(self._pool_timeout, remaining))

    async def _native(
        self,
        kind: int,
        query: Query,
        params: Params | None,
        prepare: bool | None,
        *,
        grace: float = CANCEL_GRACE_SECONDS,
    ) -> Any:
        """One statement on a native trio connection (autom.db.native): no thread hop."""
        timeout = self._borrow_timeout()
        deadline = trio.current_time() + timeout
        limiter = self._limiter
        borrower = object()
        try:
            limiter.acquire_on_behalf_of_nowait(borrower)
        except trio.WouldBlock:
            acquired = False
            with trio.move_on_at(deadline):
                await limiter.acquire_on_behalf_of(borrower)
                acquired = True
            if not acquired:
                raise DatabaseUnavailable(
                    f"no database connection: all {limiter.total_tokens:g} in use for {timeout:.2f} s"
                ) from None
        pool = self._native_pool
        conn: TrioConnection | None = None
        try:
            try:
                conn = await pool.borrow(deadline)
            except psycopg.Error as exc:
                raise DatabaseUnavailable(f"no database connection: {exc}") from exc
            conn.cancel_grace = grace
            try:
                return await _native_result(conn, kind, query, params, prepare)
            except psycopg.Error as exc:
                raise _translate(exc, conn) from exc
        finally:
            if conn is not None:
                pool.give_back(conn)
            limiter.release_on_behalf_of(borrower)

    async def _pooled(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        *,
        in_transaction: bool = False,
        grace: float = CANCEL_GRACE_SECONDS,
    ) -> T:
        call = _Call()
        return await self._in_thread(
            self._run_pooled,
            call,
            self._borrow_timeout(),
            fn,
            args,
            in_transaction,
            limiter=self._limiter,
            grace=grace,
        )

    async def _in_thread(
        self,
        work: Callable[..., T],
        call: _Call,
        *args: Any,
        limiter: trio.CapacityLimiter,
        grace: float = CANCEL_GRACE_SECONDS,
    ) -> T:
        """Run ``work(call, *args)`` in a thread; on cancellation stop it on the server first."""
        try:
            return await trio.to_thread.run_sync(work, call, *args, limiter=limiter, abandon_on_cancel=True)
        except trio.Cancelled:
            if not call.abandon_if_pending():
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(_cancel_call, call, grace, limiter=self._cleanup_limiter)
            raise

    # -- thread side -------------------------------------------------------

    def _borrow(self, timeout: float) -> Conn:
        """A working connection from the pool within ``timeout`` seconds, or DatabaseUnavailable."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                # a small floor: psycopg_pool refuses outright a timeout <= 0
                conn = self._pool.getconn(timeout=max(0.01, deadline - time.monotonic()))
            except psycopg.OperationalError as exc:  # PoolTimeout, PoolClosed, TooManyRequests
                raise DatabaseUnavailable(f"no database connection: {exc}") from exc
            if not has_unread_input(conn):
                return conn
            try:
                ConnectionPool.check_connection(conn)
            except Exception as exc:
                # Dead (server restarted, backend terminated). Nothing was sent
                # for this call yet, so taking another connection is safe.
                log.info("discarding a dead pool connection: %s", exc)
                conn.close()  # so that the pool replaces it, whatever the check tripped on
                self._pool.putconn(conn)
                self._sweep_dead_connections()
                continue
            return conn

    def _sweep_dead_connections(self) -> None:
        """Make the pool test its idle connections and replace the dead ones (one sweep at a time)."""
        if not self._sweeping.acquire(blocking=False):
            return
        try:
            self._pool.check()
        except Exception as exc:
            log.warning("checking the pool's connections failed: %s", exc)
        finally:
            self._sweeping.release()

    def _run_pooled(
        self, call: _Call, timeout: float, fn: Callable[..., T], args: tuple[Any, ...], in_transaction: bool
    ) -> T:
        conn = self._borrow(timeout)
        with call.lock:
            abandoned = call.state == _ABANDONED
            if not abandoned:
                call.conn = conn
                call.state = _RUNNING
        if abandoned:
            self._pool.putconn(conn)
            raise _Abandoned
        try:
            try:
                if in_transaction:
                    with conn.transaction():
                        result = fn(conn, *args)
                        _fail_if_aborted(conn)
                        return result
                return fn(conn, *args)
            except psycopg.Error as exc:
                raise _translate(exc, conn) from exc
        finally:
            with call.lock:  # waits until a cancel request in flight has been delivered
                call.state = _DONE
            broken = conn.closed
            self._pool.putconn(conn)  # the pool replaces it when broken
            call.finished.set()
            if broken:
                self._sweep_dead_connections()

    def _run_held(self, call: _Call, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """Run ``fn`` on a transaction's connection (no commit)."""
        with call.lock:
            if call.state == _ABANDONED:
                raise _Abandoned
            call.state = _RUNNING
        conn = call.conn
        assert conn is not None
        try:
            try:
                return fn(conn, *args)
            except psycopg.Error as exc:
                raise _translate(exc, conn) from exc
        finally:
            with call.lock:
                call.state = _DONE
            call.finished.set()

    def _borrow_held(self, call: _Call, timeout: float) -> Conn:
        """Borrow the connection a transaction will hold; hand it over through ``call.conn``."""
        try:
            conn = self._borrow(timeout)
            with call.lock:
                abandoned = call.state == _ABANDONED
                if not abandoned:
                    conn.autocommit = False  # psycopg opens the transaction at the first statement
                    call.conn = conn
                    call.state = _DONE
            if abandoned:
                self._pool.putconn(conn)
                raise _Abandoned
            return conn
        finally:
            call.finished.set()

    def _return_held(self, conn: Conn) -> None:
        """Roll back what is left of a transaction and give its connection back to the pool."""
        try:
            conn.rollback()  # a no-op after a commit
            conn.autocommit = True
        except Exception as exc:
            # Never hand out a connection that might still be inside a transaction.
            log.info("closing a transaction's connection that could not be reset: %s", exc)
            conn.close()
        broken = conn.closed
        self._pool.putconn(conn)
        if broken:
            self._sweep_dead_connections()


class Tx:
    """One connection held across several hops; made by :meth:`Database.transaction`."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._limiter = trio.CapacityLimiter(1)  # one hop at a time on this connection
        self._borrowed = _Call()
        self._current: _Call | None = None
        self._conn: Conn | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn(conn, *args)`` on the held connection, inside the open transaction (no commit)."""
        if self._conn is None:
            raise RuntimeError("this transaction is over")
        call = _Call(self._conn)
        self._current = call
        return await self._db._in_thread(self._db._run_held, call, fn, tuple(args), limiter=self._limiter)

    async def execute(self, query: Query, params: Params | None = None) -> int:
        """Run one statement in the transaction; return its row count."""
        return await self.run(_execute, query, params)

    async def fetch_all(self, query: Query, params: Params | None = None) -> list[Row]:
        """Every row of one statement, as dicts."""
        return await self.run(_fetch_all, query, params)

    async def fetch_one(self, query: Query, params: Params | None = None) -> Row | None:
        """The first row of one statement, or ``None``."""
        return await self.run(_fetch_one, query, params)

    async def fetch_val(self, query: Query, params: Params | None = None) -> Any:
        """The first column of the first row, or ``None`` when there is no row."""
        return await self.run(_fetch_val, query, params)

    async def _begin(self, borrow_timeout: float) -> None:
        self._current = self._borrowed
        self._conn = await self._db._in_thread(
            self._db._borrow_held, self._borrowed, borrow_timeout, limiter=self._limiter
        )

    async def _commit(self) -> None:
        await self.run(_commit)

    def _close_sync(self) -> None:
        """Thread side of the end of the block: wait for the last hop, roll back, return the connection."""
        self._conn = None
        if self._current is not None:
            # A cancelled hop was sent a server-side cancel; wait until its
            # thread lets go of the connection, however long that takes (the
            # trio side stops waiting after CANCEL_GRACE_SECONDS).
            self._current.finished.wait()
        conn = self._borrowed.conn
        if conn is not None:
            self._db._return_held(conn)


@asynccontextmanager
async def open_database(
    dsn: str,
    *,
    min_size: int = 2,
    max_size: int = 10,
    statement_timeout: float = 30.0,
    name: str = "autom",
    connect_timeout: float = 5.0,
    pool_timeout: float = 5.0,
) -> AsyncIterator[Database]:
    """Open the pool, wait until ``min_size`` connections are up, yield a :class:`Database`; close on exit.

    Raises :class:`DatabaseUnavailable` if the pool is not ready within
    ``connect_timeout`` seconds. ``statement_timeout`` (seconds) is set on
    every connection as a server-side backstop to trio deadlines;
    ``pool_timeout`` bounds how long a call waits for a connection (for
    example while the server is down). ``name`` is the ``application_name``.
    """
    # ours first, the user's own options (DATABASE_URL's options=...) after: PostgreSQL
    # applies them in order, so a statement_timeout the user set wins over this default
    options = conninfo_to_dict(dsn).get("options") or ""
    options = f"-c statement_timeout={max(1, round(statement_timeout * 1000))} {options}".strip()
    connect_kwargs: dict[str, Any] = {
        "options": options,
        "application_name": name,
        "connect_timeout": max(1, math.ceil(connect_timeout)),
        # notice a silently dead TCP peer within about a minute (ignored on unix sockets)
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
    }
    # The threaded pool serves run() and transaction() only (sync callbacks, not the
    # hot path): it starts empty and grows on demand up to max_size (handlers'
    # ctx.transaction() blocks can be as many as the workers). The native pool serves
    # every single statement. Both share the max_size slots (Database._limiter), so at
    # most max_size connections are busy at a time; idle ones above min_size (0 for the
    # threaded pool) close after 10 minutes in either pool.
    pool: ConnectionPool[Conn] = ConnectionPool(
        dsn,
        kwargs={**connect_kwargs, "autocommit": True, "row_factory": dict_row},
        min_size=0,
        max_size=max(1, max_size),
        open=False,
        timeout=pool_timeout,
        # psycopg_pool retries a lost connection with an uncapped doubling
        # backoff until reconnect_timeout (default 5 min): after a 40 s outage
        # the pool stayed empty 18 s more (*measured*). Giving up early hands
        # reconnection to on-demand growth, which tries at once when a call
        # needs a connection (recovered in 0.01 s).
        reconnect_timeout=max(pool_timeout, connect_timeout),
        name=name,
    )
    native = TrioPool(
        dsn,
        {**connect_kwargs, "autocommit": True, "row_factory": dict_row},
        min_size=min(min_size, max_size),  # open_database(dsn, max_size=1) just works
        max_size=max_size,
    )
    try:
        await trio.to_thread.run_sync(lambda: pool.open(wait=True, timeout=connect_timeout))
        with trio.fail_after(connect_timeout):
            await native.open()
    except (psycopg.OperationalError, trio.TooSlowError) as exc:  # PoolTimeout: the pool closed itself
        native.close()
        await trio.to_thread.run_sync(pool.close)
        reason = await trio.to_thread.run_sync(_why_no_connection, dsn, connect_kwargs)
        raise DatabaseUnavailable(f"database not reachable within {connect_timeout:g} s: {reason}") from exc
    try:
        yield Database(
            pool,
            native,
            conninfo=dsn,
            connect_kwargs=connect_kwargs,
            max_size=max_size,
            pool_timeout=pool_timeout,
            name=name,
        )
    finally:
        native.close()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(pool.close)


def _why_no_connection(dsn: str, kwargs: dict[str, Any]) -> str:
    """One direct connection attempt, for an error message that says what is wrong."""
    try:
        psycopg.connect(dsn, **kwargs).close()
    except Exception as exc:
        return str(exc).strip() or type(exc).__name__
    return "the pool did not fill up in time"
