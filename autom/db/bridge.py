"""autom's one road to PostgreSQL: ``Database``, a pool of trio-native connections (autom.db.native).

Owns the pool and its limits (``max_size`` slots, each caller waiting at most
``pool_timeout`` or its own deadline), single statements (``execute``/``fetch_*``/``ping``),
transactions (``transaction()`` → ``Tx``), LISTEN (``listen``), and the translation of
psycopg's errors into ``autom.errors`` (no room above imports psycopg).
Invariants: a connection goes back clean (idle, autocommit, no pipeline) or closed; a trio
cancel stops the statement on the server before it propagates. Public: ``Database``, ``Tx``,
``Row``, ``Params``, ``Query``, ``open_database``. The why and the figures: docs/design/db.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, NoReturn, cast

import psycopg
import trio
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from autom.db.listen import serve_notifications
from autom.db.native import CANCEL_GRACE_SECONDS, TrioConnection, TrioPool
from autom.errors import AutomError, DatabaseUnavailable, QueryError

__all__ = ["Database", "Params", "Query", "Row", "Tx", "open_database"]

log = logging.getLogger("autom.db")

Row = dict[str, Any]
"""A result row: column name to value (``dict_row``)."""

Params = Sequence[Any] | Mapping[str, Any]
"""Query parameters: positional (``%s``) or named (``%(name)s``)."""

Query = str | bytes | sql.SQL | sql.Composed
"""A statement: a string (``%s`` / ``%(name)s`` placeholders), bytes, or a composed ``psycopg.sql`` object."""

# SQLSTATEs that mean "this connection is gone" although psycopg maps them to
# OperationalError like plenty of ordinary errors: admin/crash shutdown, cannot connect now.
_CONNECTION_LOST_STATES: Final = frozenset({"57P01", "57P02", "57P03"})

# SQLSTATEs of a statement that may well work if simply run again (QueryError.transient):
# lock_not_available, query_canceled (statement timeout), serialization_failure, deadlock_detected.
TRANSIENT_STATES: Final = frozenset({"55P03", "57014", "40001", "40P01"})

_IDLE: Final = TransactionStatus.IDLE
_INERROR: Final = TransactionStatus.INERROR


def _translate(exc: psycopg.Error, conn: TrioConnection) -> AutomError:
    """autom's error for a psycopg error: ``DatabaseUnavailable`` for a lost connection, else ``QueryError``."""
    state = exc.sqlstate  # None for client-side errors: lost connection, ...
    if conn.closed or (isinstance(exc, psycopg.OperationalError)
                       and (state is None or state.startswith("08") or state in _CONNECTION_LOST_STATES)):
        # the statement was on its way or running: it may have been applied
        return DatabaseUnavailable(f"database connection lost: {exc}", maybe_applied=True)
    return QueryError(
        f"{type(exc).__name__} (SQLSTATE {state or 'none'}): {exc}", sqlstate=state, transient=state in TRANSIENT_STATES
    )


# What a statement returns (``_result``).
_ROWCOUNT: Final = 0
_ALL: Final = 1
_ONE: Final = 2
_VAL: Final = 3


async def _result(conn: TrioConnection, kind: int, query: Query, params: Params | None, prepare: bool | None) -> Any:
    """Run one statement on ``conn``; its row count, rows, first row or first value (``kind``)."""
    try:
        if prepare and isinstance(query, str) and query not in conn.prepared_here:
            # The first run on this connection: PREPARE and EXECUTE in one pipeline, one
            # round trip and one implicit transaction (psycopg alone waits for the PREPARE).
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
    except psycopg.Error as exc:
        raise _translate(exc, conn) from exc
    if kind == _ONE or row is None:
        return row
    return next(iter(row.values()), None)


class _Statements:
    """``execute`` and ``fetch_*``, shared by ``Database`` (each its own transaction) and ``Tx``."""

    __slots__ = ()

    async def _run(self, kind: int, query: Query, params: Params | None, prepare: bool | None) -> Any:
        raise NotImplementedError

    async def execute(self, query: Query, params: Params | None = None, *, prepare: bool | None = None) -> int:
        """Run one statement; return its row count.

        ``prepare=True`` prepares the statement at its first run on each connection (one
        pipeline with its first run), for statements run often; ``None`` leaves it to
        psycopg (prepared at the 6th run on a connection). Raises ``DatabaseUnavailable``
        when no connection is had within ``pool_timeout`` or it is lost (the statement may
        have been applied), ``QueryError`` for any other database error (SQLSTATE,
        ``transient``); a trio cancel stops the statement on the server first.
        """
        return int(await self._run(_ROWCOUNT, query, params, prepare))

    async def fetch_all(self, query: Query, params: Params | None = None, *, prepare: bool | None = None) -> list[Row]:
        """Every row of one statement, as dicts (``prepare`` and errors as for ``execute``)."""
        return cast(list[Row], await self._run(_ALL, query, params, prepare))

    async def fetch_one(self, query: Query, params: Params | None = None, *, prepare: bool | None = None) -> Row | None:
        """The first row of one statement, or ``None`` (``prepare`` and errors as for ``execute``)."""
        return cast(Row | None, await self._run(_ONE, query, params, prepare))

    async def fetch_val(self, query: Query, params: Params | None = None, *, prepare: bool | None = None) -> Any:
        """The first column of the first row, or ``None`` when there is no row (as for ``execute``)."""
        return await self._run(_VAL, query, params, prepare)


class Database(_Statements):
    """An open pool of trio-native connections; each ``execute``/``fetch_*`` is its own
    transaction. Make it with :func:`open_database`."""

    def __init__(self, pool: TrioPool, *, conninfo: str, connect_kwargs: dict[str, Any], pool_timeout: float,
                 name: str) -> None:
        self._pool = pool
        self._conninfo = conninfo
        self._connect_kwargs = connect_kwargs
        self._pool_timeout = pool_timeout
        self._name = name
        # one slot per connection a caller may hold: a statement or a transaction
        self._limiter = trio.CapacityLimiter(pool.max_size)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        """``async with db.transaction() as tx``: one connection and one transaction for the block.

        Commits when the block ends normally; rolls back (shielded, within
        ``CANCEL_GRACE_SECONDS``, else the connection is closed) on an exception or a
        cancellation. If a statement failed inside the block and its error was caught,
        the end raises ``QueryError`` (SQLSTATE 25P02) instead of pretending to commit.
        Waiting for the connection and errors as for ``execute``; a cancel during the
        commit leaves it unknown whether it committed. The block holds one of the
        ``max_size`` slots: do not wait inside it for another when the pool is small.
        """
        borrower = object()
        conn = await self._borrow(borrower)
        conn.cancel_grace = CANCEL_GRACE_SECONDS
        tx = Tx(conn)
        try:
            await tx.execute("begin", prepare=False)
            yield tx
            if conn.pgconn.transaction_status == _INERROR:
                failed = psycopg.errors.InFailedSqlTransaction("a statement of this transaction failed: rolled back")
                raise _translate(failed, conn) from failed
            await tx.execute("commit", prepare=False)
        finally:
            tx._conn = None
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + CANCEL_GRACE_SECONDS
                if not conn.closed and conn.pgconn.transaction_status != _IDLE:
                    try:
                        # not conn.rollback(): psycopg's deallocates every prepared statement
                        await conn.execute("rollback", prepare=False)
                    except Exception as exc:
                        log.info("closing a transaction's connection that could not roll back: %s", exc)
                        conn.close_now()
            if scope.cancelled_caught:
                conn.close_now()
            self._give_back(conn, borrower)

    async def ping(self, timeout: float = 1.0) -> bool:  # noqa: ASYNC109 (the interface others use)
        """Whether ``select 1`` answers within ``timeout`` (waiting for a connection included).

        Never raises (but lets an outer cancellation through) and never hangs.
        """
        with trio.move_on_after(timeout):
            try:
                value = await self._run(_VAL, "select 1", None, None, grace=timeout)
            except Exception as exc:
                log.debug("ping failed: %s", exc)
                return False
            return bool(value == 1)
        return False

    async def listen(self, channel: str, on_notify: Callable[[str], None], *,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> NoReturn:
        """LISTEN on ``channel`` forever on a connection of its own (``<name>-listen``), calling
        ``on_notify(payload)`` for each NOTIFY, and ``on_notify("")`` after each reconnect (some may
        have been missed); ``task_status.started()`` once listening (autom.db.listen)."""
        kwargs = {**self._connect_kwargs, "autocommit": True, "application_name": f"{self._name}-listen"}
        await serve_notifications(self._conninfo, kwargs, channel, on_notify, task_status=task_status)

    @property
    def stats(self) -> dict[str, int]:
        """Pool numbers for metrics: ``size`` (connections open), ``available`` (idle),
        ``busy`` (statements and transactions holding a slot), ``waiting`` (tasks queued
        for a slot), ``max`` (``max_size``)."""
        limiter = self._limiter.statistics()
        return {"size": self._pool.size, "available": self._pool.available, "busy": limiter.borrowed_tokens,
                "waiting": limiter.tasks_waiting, "max": int(limiter.total_tokens)}

    async def _borrow(self, borrower: object) -> TrioConnection:
        """A slot (held by ``borrower``: a task may hold several) and a connection, within
        ``pool_timeout`` or the caller's deadline if nearer; else ``DatabaseUnavailable``."""
        timeout = max(0.0, min(self._pool_timeout, trio.current_effective_deadline() - trio.current_time()))
        deadline = trio.current_time() + timeout
        limiter = self._limiter
        try:
            limiter.acquire_on_behalf_of_nowait(borrower)
        except trio.WouldBlock:
            with trio.move_on_at(deadline) as scope:
                await limiter.acquire_on_behalf_of(borrower)
            if scope.cancelled_caught:
                raise DatabaseUnavailable(
                    f"no database connection: all {limiter.total_tokens:g} in use for {timeout:.2f} s"
                ) from None
        try:
            return await self._pool.borrow(deadline)
        except BaseException as exc:
            limiter.release_on_behalf_of(borrower)
            if isinstance(exc, psycopg.Error):
                raise DatabaseUnavailable(f"no database connection: {exc}") from exc
            raise

    def _give_back(self, conn: TrioConnection, borrower: object) -> None:
        self._pool.give_back(conn)
        self._limiter.release_on_behalf_of(borrower)

    async def _run(self, kind: int, query: Query, params: Params | None, prepare: bool | None, *,
                   grace: float = CANCEL_GRACE_SECONDS) -> Any:
        borrower = object()
        conn = await self._borrow(borrower)
        try:
            conn.cancel_grace = grace
            return await _result(conn, kind, query, params, prepare)
        finally:
            self._give_back(conn, borrower)


class Tx(_Statements):
    """The statements of one ``Database.transaction()`` block, on its connection (one task at a time).

    Errors and cancellation as for ``Database.execute``; after the block, ``RuntimeError``.
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: TrioConnection) -> None:
        self._conn: TrioConnection | None = conn

    async def _run(self, kind: int, query: Query, params: Params | None, prepare: bool | None) -> Any:
        if self._conn is None:
            raise RuntimeError("this transaction is over")
        return await _result(self._conn, kind, query, params, prepare)


@asynccontextmanager
async def open_database(dsn: str, *, min_size: int = 2, max_size: int = 10, statement_timeout: float = 30.0,
                        name: str = "autom", connect_timeout: float = 5.0,
                        pool_timeout: float = 5.0) -> AsyncIterator[Database]:
    """Open ``min_size`` connections (at most ``max_size`` later), yield a :class:`Database`; close on exit.

    Raises :class:`DatabaseUnavailable` (saying why) if they are not open within
    ``connect_timeout`` seconds. ``statement_timeout`` (seconds) is set on every
    connection as a server-side backstop to trio deadlines; ``pool_timeout`` bounds how
    long a call waits for a connection (for example while the server is down). ``name``
    is the ``application_name``.
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
    pool = TrioPool(dsn, {**connect_kwargs, "autocommit": True, "row_factory": dict_row},
                    min_size=min(min_size, max_size), max_size=max(1, max_size))  # max_size=1 just works
    try:
        with trio.fail_after(connect_timeout):
            await pool.open()
    except (psycopg.Error, trio.TooSlowError) as exc:
        pool.close()
        reason = str(exc).strip() or "no connection in time"
        raise DatabaseUnavailable(f"database not reachable within {connect_timeout:g} s: {reason}") from exc
    try:
        yield Database(pool, conninfo=dsn, connect_kwargs=connect_kwargs, pool_timeout=pool_timeout, name=name)
    finally:
        pool.close()
