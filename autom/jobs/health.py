"""The queue's health, read in one place: jobs by kind and status, queue lag, recent failures.

Three rooms show or act on these numbers: ``autom.ops`` (``autom stats``-style
answers, ``GET /admin/stats``), the ``/metrics`` gauges and the watchdog's lag
alert. They all read them here, so the numbers mean the same everywhere (the SQL
is ``queries_health.sql``).
"""

from __future__ import annotations

from dataclasses import dataclass

from autom.db.bridge import Database
from autom.db.queries import Q


@dataclass(frozen=True, slots=True)
class JobCount:
    """How many jobs of ``kind`` are in ``status``."""

    kind: str
    status: str
    n: int


async def job_counts(db: Database) -> list[JobCount]:
    """Jobs by kind and status (only the pairs that have jobs)."""
    return [JobCount(row["kind"], row["status"], int(row["n"])) for row in await db.fetch_all(Q.health_job_counts)]


async def queue_lag(db: Database) -> float:
    """Seconds the oldest due pending job has waited; 0.0 when none is due."""
    return float(await db.fetch_val(Q.health_queue_lag) or 0.0)


async def failed_since(db: Database, seconds: float) -> int:
    """Jobs that failed for good in the last ``seconds`` seconds."""
    return int(await db.fetch_val(Q.health_failed_since, {"seconds": seconds}) or 0)
