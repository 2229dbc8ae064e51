"""``GET /metrics``: this process's metrics in the Prometheus text format (0.0.4).

Counters and histograms move as the intake and the workers work; the gauges that
describe the database (jobs by status and kind, queue lag, alerts not delivered yet)
are refreshed here before rendering, with three cheap queries, at most once every
``REFRESH_SECONDS`` (``DatabaseGauges``), so scrapers never turn into database load.
Invariant: with the database down it still answers 200 quickly (a refresh gets
``QUERY_BUDGET_SECONDS``), with the last known gauges and ``autom_database_up 0``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio
from quart import Blueprint, Response

from autom.alerts import AlertHealth, read_alert_health
from autom.deps import Deps
from autom.errors import DatabaseUnavailable
from autom.jobs import health
from autom.ops import JOB_STATUSES

log = logging.getLogger("autom.metrics")

#: The classic Prometheus text format, which every scraper understands
#: (prometheus_client's CONTENT_TYPE_LATEST moved to 1.0.0 in 0.22).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The database gauges are refreshed at most this often (seconds).
REFRESH_SECONDS = 5.0
#: Longest a refresh may wait for the database before the route answers without it.
QUERY_BUDGET_SECONDS = 1.0


def metrics_blueprint(deps: Deps) -> Blueprint:
    """The blueprint serving ``GET /metrics`` for ``deps``."""
    bp = Blueprint("metrics", __name__)
    gauges = DatabaseGauges(deps)

    @bp.get("/metrics")
    async def metrics() -> Response:
        """200 Prometheus text; the database gauges refreshed if older than REFRESH_SECONDS."""
        await gauges.refresh()
        return Response(deps.metrics.render(), status=200, content_type=CONTENT_TYPE,
                        headers={"Cache-Control": "no-store"})

    return bp


class DatabaseGauges:
    """Keeps ``autom_jobs``, ``autom_queue_lag_seconds`` and ``autom_database_up`` fresh enough."""

    def __init__(
        self, deps: Deps, *, max_age: float | None = None, clock: Callable[[], float] = trio.current_time
    ) -> None:
        """``max_age``: seconds a refresh stays good (default REFRESH_SECONDS); ``clock`` for tests."""
        self._deps = deps
        # read at construction, not import: a test may shorten it for a whole service
        self._max_age = REFRESH_SECONDS if max_age is None else max_age
        self._clock = clock
        self._next = -math.inf
        # Concurrent scrapes wait for the one refresh in flight instead of starting their own.
        self._lock = trio.Lock()
        #: label pairs exported by the last refresh, so kinds that disappeared drop to 0
        self._exported: set[tuple[str, str]] = set()

    async def refresh(self) -> None:
        """Query the database unless the last attempt is younger than ``max_age``; never raises."""
        async with self._lock:
            if self._clock() < self._next:
                return
            # A failed attempt counts too: a database that is down is not asked again
            # by every scrape, each of which would wait for it.
            self._next = self._clock() + self._max_age
            db_up = self._deps.metrics.db_up
            fresh: tuple[list[health.JobCount], float, AlertHealth] | None = None
            with trio.move_on_after(QUERY_BUDGET_SECONDS):
                try:
                    counts = await health.job_counts(self._deps.db)
                    lag = await health.queue_lag(self._deps.db)
                    fresh = (counts, lag, await read_alert_health(self._deps.db))
                except DatabaseUnavailable as exc:
                    log.warning("metrics: database unavailable, database gauges not refreshed: %s", exc)
            if fresh is None:  # unavailable, or slower than the budget
                db_up.set(0)
                return
            self._apply(*fresh[:2])
            self._deps.metrics.alerts_unsent.set(fresh[2].unsent)
            db_up.set(1)

    def _apply(self, counts: list[health.JobCount], lag: float) -> None:
        """Set the gauges from the job counts and the lag, with no await in between."""
        jobs = self._deps.metrics.jobs
        values: dict[tuple[str, str], float] = {}
        # Every status of every kind present, zeros included: a query like
        # autom_jobs{status="failed"} > 0 then has a series to look at.
        for count in counts:
            for status in JOB_STATUSES:
                values.setdefault((status, count.kind), 0.0)
        for count in counts:
            values[(count.status, count.kind)] = float(count.n)
        for labels in self._exported - values.keys():
            jobs.labels(*labels).set(0)
        for labels, value in values.items():
            jobs.labels(*labels).set(value)
        self._exported |= values.keys()
        self._deps.metrics.queue_lag.set(lag)
