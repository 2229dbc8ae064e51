"""LISTEN for trio: one dedicated connection in a thread, reconnected when lost.

``Database.listen`` (autom.db.bridge) is the way in; this module is its thread
side. psycopg's ``notifies()`` blocks, so a thread waits on it in short polls
(``LISTEN_POLL_SECONDS``: how fast a stop is noticed) and hands each payload to
trio with ``trio.from_thread.run_sync``. A lost connection is reconnected at once
when it had lived a while, with a growing pause (``LISTEN_BACKOFF_MIN`` to
``LISTEN_BACKOFF_MAX``) when connections keep dying young; after each reconnect
``on_notify("")`` tells the caller that notifications may have been missed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final, NoReturn

import psycopg
import trio
from psycopg import Connection, sql

log = logging.getLogger("autom.db")

# Poll interval of the listener thread (how fast it notices a stop), and the reconnect backoff bounds.
LISTEN_POLL_SECONDS: Final = 0.05
LISTEN_BACKOFF_MIN: Final = 0.5
LISTEN_BACKOFF_MAX: Final = 5.0


async def serve_notifications(
    conninfo: str,
    connect_kwargs: dict[str, Any],
    channel: str,
    on_notify: Callable[[str], None],
    *,
    cleanup_limiter: trio.CapacityLimiter,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """LISTEN on ``channel`` forever on a connection made with ``connect_kwargs`` (see ``Database.listen``).

    ``task_status.started()`` once the first LISTEN works; ``on_notify("")`` after
    each reconnect. ``cleanup_limiter``: the threads that stop the listener when
    cancelled (never queued behind the listener's own).
    """
    listener = _Listener(conninfo, connect_kwargs, channel)
    limiter = trio.CapacityLimiter(1)
    listening = False
    try:
        while True:
            await trio.to_thread.run_sync(listener.connect, limiter=limiter, abandon_on_cancel=True)
            if listening:
                on_notify("")
            else:
                listening = True
                task_status.started()
            await trio.to_thread.run_sync(listener.serve, on_notify, limiter=limiter, abandon_on_cancel=True)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(listener.shutdown, limiter=cleanup_limiter)


class _Listener:
    """The thread side of ``serve_notifications``: one dedicated connection, reconnected when lost."""

    def __init__(self, conninfo: str, kwargs: dict[str, Any], channel: str) -> None:
        self._conninfo = conninfo
        self._kwargs = kwargs
        self._listen = sql.SQL("listen {}").format(sql.Identifier(channel))
        self._stop = threading.Event()
        self._idle = threading.Event()  # no thread is in connect() or serve()
        self._idle.set()
        self._lock = threading.Lock()
        self._conn: Connection[Any] | None = None
        self._delay = 0.0  # pause before the next connection attempt
        self._connected_at = 0.0

    def connect(self) -> None:
        """Connect and LISTEN, retrying with backoff until it works or shutdown() is called."""
        self._idle.clear()
        try:
            while not self._stop.wait(self._delay):
                conn: Connection[Any] | None = None
                try:
                    conn = psycopg.connect(self._conninfo, **self._kwargs)
                    conn.execute(self._listen)
                except psycopg.Error as exc:
                    if conn is not None:
                        conn.close()
                    self._delay = min(max(self._delay * 2, LISTEN_BACKOFF_MIN), LISTEN_BACKOFF_MAX)
                    log.warning("LISTEN connection failed (%s); retrying in %.1f s", exc, self._delay)
                    continue
                with self._lock:
                    if self._stop.is_set():
                        conn.close()
                        return
                    self._conn = conn
                self._connected_at = time.monotonic()
                return
        finally:
            self._idle.set()

    def serve(self, on_notify: Callable[[str], None]) -> None:
        """Deliver notifications until the connection breaks (then return) or shutdown() is called."""
        self._idle.clear()
        try:
            conn = self._conn
            if conn is None:
                return
            try:
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=LISTEN_POLL_SECONDS):
                        if self._stop.is_set():
                            break
                        trio.from_thread.run_sync(on_notify, note.payload)
            except psycopg.Error as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
                self._close()
                # Reconnect at once after a connection that lived a while; back
                # off when connections keep dying young.
                lived = time.monotonic() - self._connected_at
                self._delay = 0.0 if lived > LISTEN_BACKOFF_MAX else max(self._delay, LISTEN_BACKOFF_MIN)
            except trio.RunFinishedError:
                self._stop.set()
            if self._stop.is_set():
                self._close()
        finally:
            self._idle.set()

    def shutdown(self, grace: float = 1.0) -> None:
        """Stop the listener thread (it notices within LISTEN_POLL_SECONDS) and close the connection."""
        self._stop.set()
        if not self._idle.wait(grace):
            log.warning("the LISTEN thread did not stop within %.1f s; it will close its connection", grace)
        self._close()

    def _close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
