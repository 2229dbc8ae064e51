"""The transaction of one handler run: opened at its first use, committed with the job's "done".

What a handler writes through ``ctx.transaction()`` and the jobs it enqueues with
``ctx.enqueue`` commit in one transaction with the fenced update that marks its
job done (the worker's ``Run.complete_in``: id and lease generation). If this
claim no longer holds the job (its lease was lost and another claim took it),
or the handler raised, the transaction rolls back and none of it is written.

The transaction is opened lazily: a handler that never calls ``ctx.transaction()``
and enqueues nothing costs nothing here (its job is completed in the worker's
batches). One that only enqueues gets a transaction at the end, for the two
statements. Each ``ctx.transaction()`` block is a savepoint, so a block that
raises undoes its own writes only, and the handler may catch that and go on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

from autom.db.queries import Q
from autom.jobs.store import insert_jobs_sync

if TYPE_CHECKING:
    from autom.db.bridge import Database, Tx
    from autom.jobs.models import NewJob


class _Abandoned(Exception):
    """Thrown into the open transaction to roll it back (never seen outside)."""


class HandlerTransaction:
    """One handler run's database transaction; ``block()`` for the handler, ``commit_done`` for the worker."""

    __slots__ = ("_db", "_stack", "_tx")

    def __init__(self, db: Database) -> None:
        self._db = db
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

    @asynccontextmanager
    async def block(self) -> AsyncIterator[Tx]:
        """A savepoint in the run's transaction: its writes are undone if the block raises."""
        tx = await self._open()
        await tx.execute(Q.block_begin)
        try:
            yield tx
        except Exception:
            # undo this block only (a cancellation abandons the whole transaction instead)
            await tx.execute(Q.block_rollback)
            raise
        await tx.execute(Q.block_release)

    async def commit(self, complete: Callable[[Tx], Awaitable[None]], jobs: Sequence[NewJob]) -> None:
        """Insert ``jobs``, mark the job done with ``complete(tx)`` (the claim's fenced write,
        last, as the worker asks), and commit; ``LeaseLost`` from ``complete`` propagates and
        nothing is committed (the caller abandons the transaction)."""
        tx = await self._open()
        if jobs:
            await tx.run(insert_jobs_sync, list(jobs))
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
