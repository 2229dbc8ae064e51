"""LISTEN for trio: one dedicated native connection (autom.db.native), reconnected when lost.

``Database.listen`` (autom.db.bridge) is the way in; ``serve_notifications`` the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import Any, Final, NoReturn

import psycopg
import trio
from psycopg import sql

from autom.db.native import TrioConnection

log = logging.getLogger("autom.db")

# The reconnect backoff bounds.
LISTEN_BACKOFF_MIN: Final = 0.5
LISTEN_BACKOFF_MAX: Final = 5.0


async def serve_notifications(
    conninfo: str,
    connect_kwargs: dict[str, Any],
    channel: str,
    on_notify: Callable[[str], None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """LISTEN on ``channel`` forever on a connection made with ``connect_kwargs`` (see ``Database.listen``).

    ``task_status.started()`` once the first LISTEN works. Each payload is handed to
    ``on_notify`` at once, in trio: the connection waits on its socket in trio itself
    (``notifies()`` of a ``TrioConnection``, always inside ``aclosing()``: the generator
    holds the connection's lock, and one left to trio's finalizer would release it from
    another task), so a cancel stops it at once. A lost connection is reconnected at once
    when it had lived a while, with a growing pause (``LISTEN_BACKOFF_MIN`` to
    ``LISTEN_BACKOFF_MAX``) when connections keep dying young or cannot be made; after
    each reconnect ``on_notify("")`` tells the caller that notifications may have been
    missed. psycopg errors are logged and the connection made again; it never returns.
    """
    listen = sql.SQL("listen {}").format(sql.Identifier(channel))
    listening = False
    delay = 0.0  # pause before the next connection attempt
    while True:
        await trio.sleep(delay)
        conn: TrioConnection | None = None
        try:
            conn = await TrioConnection.connect_trio(conninfo, **connect_kwargs)
            await conn.execute(listen)
        except psycopg.Error as exc:
            if conn is not None:
                conn.close_now()
            delay = min(max(delay * 2, LISTEN_BACKOFF_MIN), LISTEN_BACKOFF_MAX)
            log.warning("LISTEN connection failed (%s); retrying in %.1f s", exc, delay)
            continue
        except BaseException:
            # cancelled while connecting or sending LISTEN: do not leave the socket to the GC
            if conn is not None:
                conn.close_now()
            raise
        connected_at = trio.current_time()
        try:
            if listening:
                on_notify("")
            else:
                listening = True
                task_status.started()
            async with aclosing(conn.notifies()) as notes:
                async for note in notes:
                    on_notify(note.payload)
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost (%s); reconnecting", exc)
        finally:
            conn.close_now()
        # Reconnect at once after a connection that lived a while; back off when
        # connections keep dying young.
        lived = trio.current_time() - connected_at
        delay = 0.0 if lived > LISTEN_BACKOFF_MAX else max(delay, LISTEN_BACKOFF_MIN)
