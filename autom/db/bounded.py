"""Reads with their own short statement timeout (the console's pages, the overview).

A page for a person must answer quickly or say that it cannot: a filter that
matches little in a big table can make PostgreSQL walk millions of rows. Each
read here runs in its own transaction with ``statement_timeout`` set for that
transaction only (``set_config(..., true)``), so the pool's connections keep the
service's default. A read that times out raises ``QueryError`` with SQLSTATE
57014 (transient), never a psycopg error: callers above ``autom.db`` show "narrow
the filter" or a dash instead of a number.
"""

from __future__ import annotations

from typing import Any

from autom.db.bridge import Database, Params, Row
from autom.db.queries import Q

#: SQLSTATE of a statement cancelled by statement_timeout.
QUERY_CANCELED = "57014"


def _bounded_fetch_all(conn: Any, ms: int, query: str, params: Params | None) -> list[Row]:
    conn.execute(Q.ops_statement_timeout, {"ms": str(ms)})
    return list(conn.execute(query, params).fetchall())


async def fetch_all_bounded(db: Database, query: str, params: Params | None = None, *, seconds: float) -> list[Row]:
    """Every row of ``query``, or ``QueryError`` (sqlstate 57014, from the bridge) if it ran past ``seconds``."""
    return await db.run(_bounded_fetch_all, max(1, round(seconds * 1000)), query, params)
