"""``GET /health``: is this process able to take webhooks, i.e. does the database answer.

Load balancers and orchestrators poll it, so it answers within about a second
whatever the database does: ``Database.ping`` is bounded by its own timeout, and
a slightly longer trio deadline guards against a ping that would not honour it.
"""

from __future__ import annotations

import time

import trio
from quart import Blueprint, Response

from autom.deps import Deps
from autom.web.responses import json_response

#: How long the database gets to answer ``select 1``.
PING_TIMEOUT = 1.0
# Headroom over PING_TIMEOUT for the thread hop; the route never waits longer than this.
_HARD_TIMEOUT = PING_TIMEOUT + 0.25

_NO_STORE = {"Cache-Control": "no-store"}


def health_blueprint(deps: Deps) -> Blueprint:
    """The blueprint serving ``GET /health`` for ``deps``."""
    bp = Blueprint("health", __name__)

    @bp.get("/health")
    async def health() -> Response:
        """200 ``{"status":"ok","database":"ok",...}`` when the database answers, else 503."""
        ok = False
        with trio.move_on_after(_HARD_TIMEOUT):
            ok = await deps.db.ping(timeout=PING_TIMEOUT)
        deps.metrics.db_up.set(1 if ok else 0)
        if not ok:
            return json_response(503, {"status": "unavailable", "database": "down"}, _NO_STORE)
        return json_response(
            200,
            {"status": "ok", "database": "ok", "uptime_seconds": round(time.time() - deps.started_at, 1)},
            _NO_STORE,
        )

    return bp
