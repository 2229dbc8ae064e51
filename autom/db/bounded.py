"""Reads with their own short statement timeout (the console's pages, the overview).

A page for a person must answer quickly or say that it cannot: a filter that
matches little in a big table can make PostgreSQL walk millions of rows. Each
read here runs in its own transaction with ``statement_timeout`` set for that
transaction only (``set_config(..., true)``), so the pool's connections keep the
service's default. A read that times out raises ``QueryError`` with SQLSTATE
``QUERY_CANCELED`` (transient), never a psycopg error: callers above ``autom.db`` show
"narrow the filter" (``autom.ops``) or a dash instead of a number.
"""

from __future__ import annotations

from autom.db.bridge import Database, Params, Row
from autom.db.queries import Q

#: SQLSTATE of a statement cancelled by statement_timeout.
QUERY_CANCELED = "57014"


async def fetch_all_bounded(db: Database, query: str, params: Params | None = None, *, seconds: float) -> list[Row]:
    """Every row of ``query``, or ``QueryError`` (``QUERY_CANCELED``, from the bridge) if it ran past ``seconds``."""
    async with db.transaction() as tx:
        await tx.execute(Q.ops_statement_timeout, {"ms": str(max(1, round(seconds * 1000)))})
        return await tx.fetch_all(query, params)
