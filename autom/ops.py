"""Operations: what an operator reads and fixes, shared by the CLI and the admin API.

Jobs will fail: list the failed ones, retry one after a fix, replay an event
whose jobs were wrong or missing, and see the queue's state at a glance.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from autom import events
from autom.db.bridge import Database
from autom.db.queries import Q
from autom.errors import Conflict, NotFound, QueryError
from autom.jobs import health
from autom.jobs.store import JobStore
from autom.sources import replay_sources
from autom.sources.base import Source

JOB_STATUSES = ("pending", "running", "done", "failed")

#: What an operator is told about a query error, by SQLSTATE (code, then class prefix):
#: the kind of trouble only, never the SQL text or the data in the server's message.
_QUERY_ERRORS = {
    "55P03": "a row or table it needs is locked by another transaction (lock timeout)",
    "57014": "the query was cancelled (statement timeout)",
    "40001": "it conflicted with another transaction",
    "40P01": "it conflicted with another transaction (deadlock)",
    "53": "the database is out of resources",
    "57P": "the database is shutting down or restarting",
}
#: classes worth an operator's trying again in a moment (the rest need someone to look at the
#: database); wider than ``QueryError.transient`` (which code uses to retry at once): a server
#: out of resources or restarting may well be fine by the time a person tries again
_TRANSIENT_STATES = ("55P03", "57014", "40", "53", "57P")


def query_error_message(exc: QueryError) -> str:
    """One line for an operator about a failed query (the admin API's 503, the CLI's exit 1).

    Lock and statement timeouts, conflicts and a restarting server say "try again";
    anything else names its SQLSTATE. Never the SQL or the server's message, which
    can quote row data.
    """
    state = exc.sqlstate or ""
    reason = _QUERY_ERRORS.get(state) or _QUERY_ERRORS.get(state[:3]) or _QUERY_ERRORS.get(state[:2])
    if reason is None:
        return f"database error: the query failed (SQLSTATE {state or 'unknown'})"
    again = "; try again in a moment" if state.startswith(_TRANSIENT_STATES) else ""
    return f"database busy: {reason}{again}"


def job_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A job row as the admin API and ``--json`` show it (times in ISO 8601)."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


class Operations:
    """Reads and fixes over one database.

    Replays parse with every known source (``replay_sources``), enabled or not: a
    stored event was verified when it arrived, and parsing it needs no secret.
    """

    def __init__(self, db: Database, sources: Mapping[str, Source] | None = None) -> None:
        self.db = db
        self.sources = replay_sources() if sources is None else sources
        self.store = JobStore(db)

    async def list_jobs(self, *, status: str | None = None, kind: str | None = None, limit: int = 50) -> list[dict]:
        """The newest jobs, optionally of one status and/or kind."""
        rows = await self.db.fetch_all(Q.ops_list_jobs, {"status": status, "kind": kind, "limit": limit})
        return [job_json(r) for r in rows]

    async def failed_jobs(self, limit: int = 20) -> list[dict]:
        """The latest failed jobs, most recent failure first."""
        return [job_json(r) for r in await self.db.fetch_all(Q.ops_failed_jobs, {"limit": limit})]

    async def get_job(self, job_id: int) -> dict:
        """One job; ``NotFound`` if there is none with that id."""
        row = await self.db.fetch_one(Q.ops_get_job, {"id": job_id})
        if row is None:
            raise NotFound(f"no job with id {job_id}")
        return job_json(row)

    async def retry_job(self, job_id: int) -> dict:
        """Put a failed (or pending) job back in the queue now with its attempts reset.

        ``Conflict`` for a running or done job (replay its event instead), ``NotFound``
        for an unknown id.
        """
        row = await self.db.fetch_one(Q.ops_retry_job, {"id": job_id})
        if row is None:
            job = await self.get_job(job_id)
            raise Conflict(f"job {job_id} is {job['status']}: only a failed or pending job can be retried "
                           "(replay its event to run it again)")
        return job_json(row)

    async def get_event(self, event_id: int) -> dict:
        """One stored event with the ids of its jobs; ``NotFound`` if there is none."""
        return job_json(await events.fetch_event(self.db, event_id))

    async def replay_event(self, event_id: int) -> list[int]:
        """Parse a stored event again and create its jobs; returns the ids created (``events.replay_event``)."""
        return await events.replay_event(self.store, self.sources, event_id)

    async def stats(self) -> dict[str, Any]:
        """Counts by status and kind, queue lag, failures in the last hour."""
        by_status = dict.fromkeys(JOB_STATUSES, 0)
        by_kind: dict[str, dict[str, int]] = {}
        for count in await health.job_counts(self.db):
            by_status[count.status] = by_status.get(count.status, 0) + count.n
            by_kind.setdefault(count.kind, {})[count.status] = count.n
        lag = await health.queue_lag(self.db)
        failed = await health.failed_since(self.db, 3600)
        return {
            "jobs": by_status,
            "by_kind": by_kind,
            "queue_lag_seconds": round(lag, 3),
            "failed_last_hour": failed,
        }
