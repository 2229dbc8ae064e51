"""A hop's commit record: what a hop cut off, or whose connection dropped, stored.

A hop's statement also writes its commit record (its token and what it stored, table
``intake_commits``); ``committed`` reads it back, or makes sure the hop can never
commit. Why: docs/design/intake.md, "The event store".
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from autom.db.bridge import Database
from autom.db.queries import Q
from autom.errors import DatabaseUnavailable

log = logging.getLogger("autom.intake")


async def committed(db: Database, token: str, by: float) -> list[list[Any]] | None:
    """After a hop was cut off or its connection dropped: what it stored if it committed, else None.

    The statement may have committed before the connection went (then a 503 would
    make senders without an event id deliver again: a duplicate). Inserting the
    hop's token decides it (the intake_commits table): that insert waits
    for the hop's transaction if the server still runs it, wins if the hop did not
    commit (which it then never can), and finds the hop's record if it did. None
    also when the database cannot be asked by ``by`` (trio time): then nobody
    knows until it answers again, and a 503 is the lesser harm (``StoreBatcher``).
    """
    with trio.move_on_at(by):
        while True:
            try:
                if await db.fetch_one(Q.intake_commit_burn, {"token": token}) is not None:
                    return None
                row = await db.fetch_one(Q.intake_commit_results, {"token": token})
            except DatabaseUnavailable:
                await trio.sleep(0.2)
                continue
            results = row["results"] if row is not None else None
            if results is None:
                return None
            log.info("a hop cut off (its connection, its deadline) had committed; answered from its commit record")
            return list(results)
    return None
