"""psycopg's async API on trio without a thread: ``TrioConnection`` and its pool ``TrioPool``.

Owns how a psycopg connection waits (``wait``: trio's socket waits; ``lock``: a trio lock),
connects (host names resolved in a thread: libpq's lookup has no async form), cancels, closes.
Invariants: a trio cancel while a statement runs on the server sends a server-side cancel and
reads its answer (shielded, within ``cancel_grace`` and ``stop_by``) or closes the connection,
so it is clean or closed when ``Cancelled`` propagates. The pool lends a connection to one task
at a time, most recently used first; it closes those idle past ``max_idle`` (above ``min_size``),
past ``max_lifetime``, or found dead. Private psycopg names: tests/unit/test_native_psycopg_names.py.
Public: ``TrioConnection``, ``TrioPool``, ``stop_by``, ``CANCEL_GRACE_SECONDS``. Why: docs/design/db.md.
"""

from __future__ import annotations

import json
import logging
import math
import random
import select
from collections import deque
from collections.abc import Generator
from contextvars import ContextVar
from typing import Any, Final, TypeVar, cast

import psycopg
import trio
from psycopg import errors as e
from psycopg.abc import Buffer
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo, timeout_from_conninfo
from psycopg.pq import ConnStatus, PipelineStatus, TransactionStatus
from psycopg.rows import AsyncRowFactory, dict_row
from psycopg.types.json import JsonbLoader, JsonLoader
from psycopg.waiting import Ready, Wait

__all__ = ["CANCEL_GRACE_SECONDS", "TrioConnection", "TrioPool", "stop_by"]

log = logging.getLogger("autom.db")

RV = TypeVar("RV")

# How long a cancelled statement may take to stop on the server (cancel request + its answer).
CANCEL_GRACE_SECONDS: Final = 5.0
#: Longest a pooled connection is used (TrioPool): psycopg_pool's default max_lifetime.
MAX_LIFETIME_SECONDS: Final = 3600.0

_WAIT_R: Final = Wait.R
_WAIT_W: Final = Wait.W
_READY_R: Final = Ready.R
_READY_W: Final = Ready.W
_READY_NONE: Final = Ready.NONE
_ACTIVE: Final = TransactionStatus.ACTIVE
_IDLE: Final = TransactionStatus.IDLE

#: When (trio time) a cancelled statement's stop must be over, however long its grace: set by
#: a caller that owes an answer by then, for the statements it runs (the intake's hop,
#: autom.events). Past it the connection is closed, its statement's fate left to others.
stop_by: ContextVar[float] = ContextVar("autom_stop_by", default=math.inf)

_wait_readable = trio.lowlevel.wait_readable
_wait_writable = trio.lowlevel.wait_writable


_decode_json = json.JSONDecoder().decode


class _JsonbLoader(JsonbLoader):
    """jsonb (text) as ``json.loads`` reads it, without its encoding guess (UTF-16/32 BOMs):
    PostgreSQL sends UTF-8: about half the cost for the ``{}`` payload every claimed job
    carries (docs/design/db.md)."""

    def load(self, data: Buffer) -> Any:
        return _decode_json(str(data, "utf-8", "surrogatepass"))


class _JsonLoader(JsonLoader):
    """json (text), as ``_JsonbLoader``."""

    load = _JsonbLoader.load


def _ready_now(fileno: int, state: int) -> int:
    """The ``Ready`` flags of ``fileno`` right now (a zero-timeout poll)."""
    poller = select.poll()
    poller.register(fileno, (select.POLLIN if state & _WAIT_R else 0) | (select.POLLOUT if state & _WAIT_W else 0))
    ready = 0
    for _, events in poller.poll(0):
        if events & (select.POLLIN | select.POLLERR | select.POLLHUP):
            ready |= _READY_R
        if events & select.POLLOUT:
            ready |= _READY_W
    return ready


async def _wait_either(fileno: int) -> int:
    """Wait until ``fileno`` is readable or writable (``Wait.RW``: libpq's send buffer was full);
    a cancel comes out as a plain ``trio.Cancelled``, not the nursery's exception group."""
    ready = 0
    try:
        async with trio.open_nursery() as nursery:

            async def readable() -> None:
                nonlocal ready
                await _wait_readable(fileno)
                ready |= _READY_R
                nursery.cancel_scope.cancel()

            async def writable() -> None:
                nonlocal ready
                await _wait_writable(fileno)
                ready |= _READY_W
                nursery.cancel_scope.cancel()

            nursery.start_soon(readable)
            nursery.start_soon(writable)
    except BaseExceptionGroup as group:
        _, rest = group.split(trio.Cancelled)
        if rest is None:
            # only Cancelled: the enclosing scope is cancelled, so this raises it plainly
            await trio.lowlevel.checkpoint()
        raise
    return ready


async def _wait_for(fileno: int, state: int) -> int:
    """Block until ``fileno`` is ready for ``state``; the ``Ready`` flags to send to the generator."""
    if state == _WAIT_R:
        await _wait_readable(fileno)
        return _READY_R
    if state == _WAIT_W:
        await _wait_writable(fileno)
        return _READY_W
    if not state & (_WAIT_R | _WAIT_W):
        raise e.InternalError(f"bad poll status: {state}")
    # Wait.RW: a socket asked for writing is nearly always writable already
    return _ready_now(fileno, state) or await _wait_either(fileno)


async def wait_conn(gen: Generator[tuple[int, Wait], int, RV]) -> RV:
    """Drive a connect/cancel generator (it yields ``(fileno, Wait)``: the socket may change)."""
    try:
        fileno, state = next(gen)
        while True:
            fileno, state = gen.send(await _wait_for(fileno, state))
    except StopIteration as ex:
        return cast(RV, ex.value)
    except OSError as ex:
        raise e.OperationalError("connection socket closed") from ex


class _TaskLock:
    """``AsyncConnection.lock`` for trio: a ``trio.Lock`` taken without a checkpoint when free, so
    that psycopg's cleanup in ``finally`` blocks runs in a cancelled task (docs/design/db.md)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = trio.Lock()

    async def __aenter__(self) -> None:
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()


class TrioConnection(psycopg.AsyncConnection[Any]):
    """A ``psycopg.AsyncConnection`` that waits with trio: make it with :meth:`connect_trio`, close
    it with :meth:`close` (or :meth:`close_now` outside async code)."""

    cancel_grace: float = CANCEL_GRACE_SECONDS

    def __init__(self, pgconn: Any, row_factory: AsyncRowFactory[Any] = dict_row) -> None:
        super().__init__(pgconn, row_factory)
        self.lock = _TaskLock()  # type: ignore[assignment]
        self.adapters.register_loader("jsonb", _JsonbLoader)
        self.adapters.register_loader("json", _JsonLoader)
        self.last_used = 0.0  # trio time it was last given back to a pool
        self.expires_at = math.inf  # trio time after which a pool closes it (TrioPool: max_lifetime)
        self.prepared_here: set[str] = set()  # statements run with prepare=True on it (autom.db.bridge)

    @classmethod
    async def connect_trio(
        cls, conninfo: str = "", *, autocommit: bool = True, row_factory: AsyncRowFactory[Any] = dict_row, **kwargs: Any
    ) -> TrioConnection:
        """Connect (every host of ``conninfo`` in turn, each within its ``connect_timeout``)."""
        params = conninfo_to_dict(conninfo, **kwargs)
        timeout = timeout_from_conninfo(params)
        # to_thread: libpq's host name lookup blocks and has no async form (one hop per new connection)
        attempts = await trio.to_thread.run_sync(conninfo_attempts, params)
        failures: list[psycopg.Error] = []
        conn: TrioConnection | None = None
        for attempt in attempts:
            with trio.move_on_after(timeout or math.inf) as scope:
                try:
                    conn = await wait_conn(cls._connect_gen(make_conninfo("", **attempt)))
                except psycopg.Error as ex:
                    failures.append(ex)
            if scope.cancelled_caught:
                failures.append(e.ConnectionTimeout("connection timeout expired"))
            if conn is not None:
                break
        if conn is None:
            raise failures[-1].with_traceback(None)
        conn.row_factory = row_factory
        if autocommit:
            try:
                await conn.set_autocommit(True)  # no round trip: the connection is idle
            except BaseException:
                conn.close_now()  # cancelled here: the caller never gets it to close
                raise
        return conn

    async def wait(self, gen: Generator[Wait, int, RV], interval: float = 0.1,
                   timeout: float | None = None) -> RV:  # noqa: ASYNC109 (psycopg's signature)
        """Consume a generator operating on the connection, waiting with trio.

        ``timeout`` (used by ``notifies(timeout=)``): raise psycopg's
        ``_WaitTimeout`` when it expires.
        """
        if timeout is not None:
            with trio.move_on_after(timeout):
                return await self.wait(gen)
            raise e._WaitTimeout("wait timeout expired")
        fileno = self.pgconn.socket
        if self.pgconn.transaction_status != _ACTIVE:
            # a cancelled caller sends nothing; mid-statement (a pipeline's exit after a big send)
            # the cancel is taken at the socket wait below, which stops it on the server first
            await trio.lowlevel.checkpoint_if_cancelled()
        state: int = _WAIT_R
        try:
            state = next(gen)
            while True:
                state = gen.send(await _wait_for(fileno, state))
        except StopIteration as ex:
            return cast(RV, ex.value)
        except trio.Cancelled:
            if self.pgconn.transaction_status == _ACTIVE:
                await self._stop_on_server(gen, fileno, state)
            raise
        except OSError as ex:
            raise e.OperationalError("connection socket closed") from ex

    async def _stop_on_server(self, gen: Generator[Wait, int, Any], fileno: int, state: int) -> None:
        """After a trio cancel mid-statement: cancel it on the server and read its answer (shielded, bounded)."""
        started = trio.current_time()
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = min(started + self.cancel_grace, stop_by.get())
            try:
                await self.cancel_trio()
                while True:
                    state = gen.send(await _wait_for(fileno, state))
            except StopIteration:
                return  # the server answered (the result, if it was quicker than the cancel)
            except psycopg.Error as ex:
                pgconn = self.pgconn
                if pgconn.status == ConnStatus.OK and pgconn.transaction_status != _ACTIVE:
                    return  # the server answered: QueryCanceled, as expected
                log.warning("could not stop a cancelled statement (%s): closing its connection", ex)
            except Exception as ex:
                log.warning("could not stop a cancelled statement (%s): closing its connection", ex)
        if scope.cancelled_caught:
            log.warning("a cancelled statement did not stop within %.1f s: closing its connection",
                        min(self.cancel_grace, max(0.0, scope.deadline - started)))
        self.close_now()

    async def cancel_trio(self) -> None:
        """Ask the server to cancel the running statement (libpq's non-blocking cancel, driven by trio)."""
        if not self._should_cancel():
            return
        await wait_conn(self._cancel_gen())

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:  # noqa: ASYNC109 (psycopg's signature)
        """psycopg's ``cancel_safe`` on trio (``CancellationTimeout`` after ``timeout`` seconds)."""
        with trio.move_on_after(timeout or math.inf):
            return await self.cancel_trio()
        raise e.CancellationTimeout("cancellation timeout expired")

    def close_now(self) -> None:
        """Close at once (no await): wake trio's waiters on the socket, then close it."""
        if self.closed:
            return
        try:
            fileno = self.pgconn.socket
        except psycopg.Error:
            fileno = -1
        if fileno >= 0:
            trio.lowlevel.notify_closing(fileno)
        self.pgconn.finish()

    async def close(self) -> None:
        """Close the connection (see :meth:`close_now`)."""
        self.close_now()
        await trio.lowlevel.checkpoint()

    @property
    def clean(self) -> bool:
        """Whether the connection may serve another task: open, idle, no transaction, no pipeline."""
        pgconn = self.pgconn
        return (
            pgconn.status == ConnStatus.OK
            and pgconn.transaction_status == _IDLE
            and pgconn.pipeline_status == PipelineStatus.OFF
            and self._pipeline is None  # psycopg's side of it: detached after a cancelled pipeline
        )


def _has_unread_input(conn: psycopg.BaseConnection[Any]) -> bool:
    """Whether an idle connection's socket has something to read (EOF or a FATAL when the server left)."""
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except Exception:
        return True  # closed or unusable


class TrioPool:
    """Connections for one task at a time; the caller bounds concurrency (see the module docstring)."""

    def __init__(self, conninfo: str, connect_kwargs: dict[str, Any], *, min_size: int, max_size: int,
                 max_idle: float = 600.0, max_lifetime: float = MAX_LIFETIME_SECONDS,
                 reconnect_pause: float = 0.05) -> None:
        self._conninfo = conninfo
        self._kwargs = connect_kwargs
        self.min_size = min_size
        self.max_size = max_size
        self.max_idle = max_idle
        self.max_lifetime = max_lifetime
        self._reconnect_pause = reconnect_pause
        self._idle: deque[TrioConnection] = deque()  # the right end is the most recently used
        self._size = 0  # open + being opened
        self._closed = False
        self.connects = 0
        self.connect_failures = 0
        self.discarded = 0

    async def open(self) -> None:
        """Open ``min_size`` connections (raises psycopg's error if one fails)."""
        conns: list[TrioConnection] = []
        failures: list[psycopg.Error] = []
        try:
            async with trio.open_nursery() as nursery:

                async def one() -> None:
                    try:
                        conns.append(await self._connect())
                    except psycopg.Error as ex:
                        failures.append(ex)

                for _ in range(self.min_size):
                    nursery.start_soon(one)
            if failures:
                raise failures[0]
        except BaseException:
            for conn in conns:
                self._drop(conn)
            raise
        now = trio.current_time()
        for conn in conns:
            conn.last_used = now
            self._idle.append(conn)

    def close(self) -> None:
        """Close the idle connections; borrowed ones are closed when given back."""
        self._closed = True
        while self._idle:
            self._drop(self._idle.pop())

    async def borrow(self, deadline: float) -> TrioConnection:
        """A connection for the calling task: an idle one, else a new one (retried until ``deadline``).

        Raises psycopg's error of the last connection attempt when ``deadline`` passes.
        """
        if self._closed:
            raise e.OperationalError("the connection pool is closed")
        while self._idle:
            conn = self._idle.pop()
            if conn.expires_at <= trio.current_time():
                self._drop(conn)  # past max_lifetime
                continue
            if conn.pgconn.status == ConnStatus.OK and not _has_unread_input(conn):
                return conn
            # Dead (server restarted, backend terminated): nothing was sent on it yet.
            log.info("discarding a dead database connection")
            self._drop(conn)
            self.sweep()
        pause = self._reconnect_pause
        while True:
            try:
                with trio.fail_at(deadline):
                    return await self._connect()
            except trio.TooSlowError:
                raise e.ConnectionTimeout("no database connection before the deadline") from None
            except psycopg.OperationalError as ex:
                if trio.current_time() + pause >= deadline:
                    raise
                log.debug("database connection failed (%s); retrying in %.2f s", ex, pause)
            await trio.sleep(pause)
            pause = min(pause * 2, 0.5)

    def give_back(self, conn: TrioConnection) -> None:
        """Return a borrowed connection: kept when clean, else closed."""
        now = trio.current_time()
        if self._closed or not conn.clean or conn.expires_at <= now:
            if conn.pgconn.status != ConnStatus.OK:
                self.sweep()  # a lost connection: its idle siblings may be dead too
            self._drop(conn)
            return
        conn.last_used = now
        idle = self._idle
        idle.append(conn)
        # retire the least recently used while above min_size
        while len(idle) > 1 and self._size > self.min_size and now - idle[0].last_used > self.max_idle:
            self._drop(idle.popleft())

    def sweep(self) -> None:
        """Close the idle connections whose socket says the server left."""
        for conn in [c for c in self._idle if c.pgconn.status != ConnStatus.OK or _has_unread_input(c)]:
            self._idle.remove(conn)
            self._drop(conn)

    @property
    def size(self) -> int:
        """Connections open or being opened."""
        return self._size

    @property
    def available(self) -> int:
        """Idle connections."""
        return len(self._idle)

    async def _connect(self) -> TrioConnection:
        self._size += 1
        try:
            conn = await TrioConnection.connect_trio(self._conninfo, **self._kwargs)
        except BaseException:
            self._size -= 1
            self.connect_failures += 1
            raise
        self.connects += 1
        # up to 5 % early, as psycopg_pool does: connections opened together do not all expire together
        conn.expires_at = trio.current_time() + self.max_lifetime * (1.0 - 0.05 * random.random())
        return conn

    def _drop(self, conn: TrioConnection) -> None:
        self._size -= 1
        self.discarded += 1
        try:
            conn.close_now()
        except Exception as ex:  # pragma: no cover (finish() does not fail)
            log.debug("closing a database connection failed: %s", ex)
