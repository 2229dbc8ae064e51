"""``GET /health``: is this process able to take webhooks, i.e. does the database answer.

Load balancers and orchestrators poll it, so it answers within about a second
whatever the database does (``PING_TIMEOUT``, with a trio deadline as backstop).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio
from quart import Blueprint, Response

from autom.alerts import AlertHealth, read_alert_health
from autom.deps import Deps
from autom.web.responses import json_response

#: How long the database gets to answer ``select 1``.
PING_TIMEOUT = 1.0
# Headroom over PING_TIMEOUT for a cancelled ping's stop; the route never waits longer than this.
_HARD_TIMEOUT = PING_TIMEOUT + 0.25

_NO_STORE = {"Cache-Control": "no-store"}

log = logging.getLogger("autom.web.health")


def health_blueprint(deps: Deps) -> Blueprint:
    """The blueprint serving ``GET /health`` for ``deps``."""
    bp = Blueprint("health", __name__)

    @bp.get("/health")
    async def health() -> Response:
        """200 ``{"status": "ok", ...}`` when the database answers; 200 ``{"status": "degraded",
        "alerts": {"problems": [...]}}`` when it answers but alerts do not get out (the last
        delivery failed, or alerts wait longer than a few minutes): the process works, so a
        balancer keeps it, but a person should look; 503 when the database does not answer.

        ``Database.ping`` is bounded by its own timeout, and a slightly longer trio deadline
        guards against a ping that would not honour it.
        """
        ok = False
        alerts: AlertHealth | None = None
        with trio.move_on_after(_HARD_TIMEOUT):
            ok = await deps.db.ping(timeout=PING_TIMEOUT)
            if ok:  # with what is left of the same deadline
                try:
                    alerts = await read_alert_health(deps.db)
                except Exception as exc:  # the database answered the ping: not worth a 503
                    log.debug("health: alert state not read: %s", exc)
        deps.metrics.db_up.set(1 if ok else 0)
        if not ok:
            return json_response(503, {"status": "unavailable", "database": "down"}, _NO_STORE)
        body: dict[str, Any] = {"status": "ok", "database": "ok"}
        if alerts is not None:
            deps.metrics.alerts_unsent.set(alerts.unsent)
            body["alerts"] = {"unsent": alerts.unsent}
            if alerts.problems:  # still 200: the process works, but nobody would hear of a failure
                body["status"] = "degraded"
                body["alerts"]["problems"] = alerts.problems
        body["uptime_seconds"] = round(time.time() - deps.started_at, 1)
        return json_response(200, body, _NO_STORE)

    return bp
