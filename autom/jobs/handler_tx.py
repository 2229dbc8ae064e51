"""A handler's transaction: opened at its first use, committed with a fenced last write.

What a handler writes through ``ctx.transaction()`` and the jobs it enqueues with
``ctx.enqueue`` go into one such transaction, which commits with the fenced update
that marks its job done (``Run.complete_in``), or, inside a ``ctx.once`` block,
with the update that records the block's key. If the fence finds the claim gone,
or the handler raised, the transaction rolls back and none of it is written.

Opened lazily: a handler that never writes or enqueues costs nothing here (its job
is completed in the worker's batches). Each ``ctx.transaction()`` block is a
savepoint, so a block that raises undoes its own writes only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from autom.db.queries import Q
from autom.errors import DatabaseUnavailable
from autom.jobs.store import insert_jobs

if TYPE_CHECKING:
    from autom.db.bridge import Database, Tx
    from autom.jobs.models import NewJob


T = TypeVar("T")


class _Abandoned(Exception):
    """Thrown into the open transaction to roll it back (never seen outside)."""


class HandlerTransaction:
    """One transaction of a handler run: ``block()`` and ``enqueue`` for the handler, ``commit`` at its end."""

    __slots__ = ("_db", "_patience", "_stack", "_tx")

    def __init__(self, db: Database, *, patience: float = 0.0) -> None:
        # slots and plain assignments, like RunState's (context.py): alike in form only
        self._db = db
        #: how long the first statement is tried again while the database is unreachable
        #: (nothing is lost before it runs: a ``once`` block waits out an outage there)
        self._patience = patience
        self._stack: AsyncExitStack | None = None
        self._tx: Tx | None = None

    @property
    def opened(self) -> bool:
        """Whether the handler used the transaction (then it must be committed or abandoned)."""
        return self._tx is not None

    async def _open(self) -> Tx:
        if self._tx is None:
            stack = AsyncExitStack()
            tx = await stack.enter_async_context(self._db.transaction())
            self._stack, self._tx = stack, tx
        return self._tx

    async def _first(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """``fn(tx)``; when it is the transaction's first statement and the database is
        unreachable, the transaction is opened again and ``fn`` tried again for up to
        ``patience`` seconds (backing off from 50 ms to 1 s)."""
        if self._tx is not None or self._patience <= 0:
            return await fn(await self._open())
        give_up = trio.current_time() + self._patience
        pause = 0.05
        while True:
            try:
                return await fn(await self._open())
            except DatabaseUnavailable:
                await self.abandon()
                if trio.current_time() >= give_up:
                    raise
            await trio.sleep(pause)
            pause = min(1.0, pause * 2)

    @asynccontextmanager
    async def block(self) -> AsyncIterator[Tx]:
        """A savepoint in the transaction: its writes are undone if the block raises."""

        async def begin(tx: Tx) -> Tx:
            await tx.execute(Q.block_begin)
            return tx

        tx = await self._first(begin)
        try:
            yield tx
        except Exception:
            # undo this block only (a cancellation abandons the whole transaction instead)
            await tx.execute(Q.block_rollback)
            raise
        await tx.execute(Q.block_release)

    async def enqueue(self, job: NewJob) -> int | None:
        """Insert ``job`` in the transaction; its id, or None when a job of its kind has its key."""
        ids = await self._first(lambda tx: insert_jobs(tx, [job]))
        return ids[0] if ids else None

    async def fetch_val(self, query: str, params: dict[str, Any]) -> Any:
        """One of autom's statements in the transaction (its first column of its first row)."""
        return await self._first(lambda tx: tx.fetch_val(query, params))

    async def commit(self, complete: Callable[[Tx], Awaitable[None]]) -> None:
        """Run ``complete(tx)`` (the fenced last write: the job's "done", or a once key's record)
        and commit. An exception from ``complete`` (``LeaseLost``: the fence found the claim
        gone) propagates and nothing is committed (the caller abandons the transaction)."""
        tx = await self._open()
        await complete(tx)
        stack, self._stack, self._tx = self._stack, None, None
        assert stack is not None
        await stack.aclose()  # the end of db.transaction(): commit

    async def abandon(self) -> None:
        """Roll back whatever the handler wrote (it raised, was cancelled, or lost its lease)."""
        stack, self._stack, self._tx = self._stack, None, None
        if stack is not None:
            error = _Abandoned()
            await stack.__aexit__(type(error), error, None)
