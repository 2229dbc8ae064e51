"""``/admin/...``: the operator's HTTP API over ``autom.ops.Operations`` (CONTRACT.md, HTTP).

Every route needs ``Authorization: Bearer $ADMIN_TOKEN``. The check runs before
anything else a route does (parameter checks, database look-ups), so a caller
without the token learns nothing, not even whether an id exists: every answer
is then 401 ``{"error": ...}`` with ``WWW-Authenticate: Bearer``. Without an
ADMIN_TOKEN setting the admin API refuses everyone (an empty token must never
match an empty header).

Answers (JSON in and out, errors as ``{"error": "<one line>"}``):

* ``GET  /admin/jobs?status=&kind=&limit=50``  200 ``{"jobs": [...]}``, newest first;
  400 for a status outside pending/running/done/failed or a limit outside 1..1000.
  Empty values mean "not given"; unknown parameters are ignored.
* ``GET  /admin/jobs/{id}``                    200 the job; 404 unknown.
* ``POST /admin/jobs/{id}/retry``              200 the job, now pending; 409 running or done; 404.
* ``GET  /admin/events/{id}``                  200 the event with its ``job_ids``; 404.
* ``POST /admin/events/{id}/replay``           202 ``{"jobs": [ids created]}``; 409 source
  unknown or body unparsable; 404.
* ``GET  /admin/stats``                        200 counts, queue lag, failures in the last hour.

A path id must be a positive integer that fits PostgreSQL's ``bigint`` (ASCII
digits only: ``int()`` would also take "١٢", " 7" or "1_0"); anything else is
400, never a database error. The database being down is 503, and so is a query
the database refused to finish (a lock or statement timeout, a conflict): one line
saying which, never SQL. A retry or replay
that queued work rings ``deps.doorbell`` so this process's workers claim it at
once (the queries' NOTIFY wakes the other replicas).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from quart import Blueprint, Response, request

from autom.deps import Deps
from autom.errors import BadRequest, Conflict, DatabaseUnavailable, QueryError
from autom.errors import NotFound as RowNotFound
from autom.ops import JOB_STATUSES, Operations, query_error_message
from autom.web.responses import error_response, json_response

log = logging.getLogger("autom.admin")

#: ``limit`` of ``GET /admin/jobs``: default and bounds.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
#: Largest id PostgreSQL's ``bigint`` holds; larger ones cannot exist (and would not bind).
MAX_ID = 2**63 - 1

_DIGITS = re.compile(r"[0-9]{1,19}")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def admin_blueprint(deps: Deps) -> Blueprint:
    """The blueprint serving ``/admin/...`` for ``deps`` (module docstring: routes, answers)."""
    bp = Blueprint("admin", __name__, url_prefix="/admin")
    admin = Admin(deps)
    bp.before_request(admin.authenticate)
    bp.add_url_rule("/jobs", "list_jobs", admin.list_jobs, methods=["GET"])
    bp.add_url_rule("/jobs/<job_id>", "get_job", admin.get_job, methods=["GET"])
    bp.add_url_rule("/jobs/<job_id>/retry", "retry_job", admin.retry_job, methods=["POST"])
    bp.add_url_rule("/events/<event_id>", "get_event", admin.get_event, methods=["GET"])
    bp.add_url_rule("/events/<event_id>/replay", "replay_event", admin.replay_event, methods=["POST"])
    bp.add_url_rule("/stats", "stats", admin.stats, methods=["GET"])
    return bp


class Admin:
    """The admin routes bound to one ``Deps``; each is a thin layer over ``Operations``."""

    def __init__(self, deps: Deps) -> None:
        """Bind the routes to ``deps`` (settings for the token, database, doorbell)."""
        self._deps = deps
        self._ops = Operations(deps.db)
        token = deps.settings.admin_token
        # Digests, so that compare_digest also runs in time independent of the token's length.
        self._token_digest = hashlib.sha256(token.encode("utf-8")).digest() if token else None

    async def authenticate(self) -> Response | None:
        """Before every admin route: ``None`` lets the request through, else the 401 answer."""
        if self._token_digest is None:
            return _unauthorized("the admin API is disabled: ADMIN_TOKEN is not set")
        # Raw header bytes from the ASGI scope: no decoding guesses, and a repeated
        # Authorization header (ambiguous: which one counts?) is refused outright.
        values = [v for k, v in request.scope["headers"] if k.lower() == b"authorization"]
        if not values:
            return _unauthorized("missing Authorization: Bearer token")
        if len(values) > 1:
            return _unauthorized("more than one Authorization header")
        token = bearer_token(values[0])
        if token is None:
            return _unauthorized("Authorization must be: Bearer <token>")
        if not hmac.compare_digest(hashlib.sha256(token).digest(), self._token_digest):
            return _unauthorized("invalid token")
        return None

    async def list_jobs(self) -> Response:
        """``GET /admin/jobs``: 200 ``{"jobs": [...]}``, newest first; 400 for bad filters."""
        try:
            status = _optional(request.args.get("status"))
            if status is not None and status not in JOB_STATUSES:
                raise BadRequest(f"status must be one of {', '.join(JOB_STATUSES)}")
            kind = _optional(request.args.get("kind"))
            if kind is not None and "\x00" in kind:
                # PostgreSQL text cannot hold NUL: the driver would refuse the parameter (a 500)
                raise BadRequest("kind must not contain a NUL character")
            limit = parse_limit(request.args.get("limit"))
        except BadRequest as exc:
            return error_response(400, str(exc))
        return await self._answer(200, lambda: self._ops.list_jobs(status=status, kind=kind, limit=limit), "jobs")

    async def get_job(self, job_id: str) -> Response:
        """``GET /admin/jobs/{id}``: 200 the job; 400 malformed id; 404 unknown."""
        return await self._with_id(job_id, "job", 200, self._ops.get_job)

    async def retry_job(self, job_id: str) -> Response:
        """``POST /admin/jobs/{id}/retry``: 200 the job, now pending; 409 running or done; 404 unknown."""

        async def retry(ident: int) -> dict[str, Any]:
            job = await self._ops.retry_job(ident)
            self._deps.doorbell.set()
            log.info("admin: job %d put back in the queue", ident, extra={"job_id": ident, "kind": job["kind"]})
            return job

        return await self._with_id(job_id, "job", 200, retry)

    async def get_event(self, event_id: str) -> Response:
        """``GET /admin/events/{id}``: 200 the event with its ``job_ids``; 400 malformed id; 404 unknown."""
        return await self._with_id(event_id, "event", 200, self._ops.get_event)

    async def replay_event(self, event_id: str) -> Response:
        """``POST /admin/events/{id}/replay``: 202 ``{"jobs": [ids]}``; 409 cannot parse/unknown source; 404."""

        async def replay(ident: int) -> dict[str, Any]:
            created = await self._ops.replay_event(ident)
            if created:
                self._deps.doorbell.set()
            log.info("admin: event %d replayed, %d job(s) created", ident, len(created),
                     extra={"event_id": ident, "count": len(created)})
            return {"jobs": created}

        return await self._with_id(event_id, "event", 202, replay)

    async def stats(self) -> Response:
        """``GET /admin/stats``: 200 jobs by status and kind, queue lag, failures in the last hour."""
        return await self._answer(200, self._ops.stats)

    async def _with_id(
        self, raw: str, what: str, status: int, op: Callable[[int], Awaitable[dict[str, Any]]]
    ) -> Response:
        """Parse the path id (400 if malformed), then answer ``op(id)``."""
        try:
            ident = parse_id(raw, what)
        except BadRequest as exc:
            return error_response(400, str(exc))
        return await self._answer(status, lambda: op(ident))

    async def _answer(self, status: int, op: Callable[[], Awaitable[Any]], wrap: str | None = None) -> Response:
        """``op()`` as a JSON answer; the errors ``Operations`` raises become 404, 409 and 503."""
        metrics = self._deps.metrics
        try:
            result = await op()
        except RowNotFound as exc:
            return error_response(404, str(exc))
        except Conflict as exc:
            return error_response(409, str(exc))
        except DatabaseUnavailable as exc:
            metrics.db_up.set(0)
            log.warning("admin request failed: database unavailable: %s", exc)
            return error_response(503, "database unavailable")
        except QueryError as exc:  # the database answered, with an error: lock/statement timeout, ...
            log.warning("admin request failed: SQLSTATE %s %s", exc.sqlstate, type(exc.__cause__).__name__)
            return error_response(503, query_error_message(exc), {"Retry-After": "1"})
        metrics.db_up.set(1)
        return json_response(status, result if wrap is None else {wrap: result})


def bearer_token(value: bytes) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value, or ``None`` if it is not one.

    The scheme is case-insensitive (RFC 9110 §11.1); one or more spaces separate it
    from the token, which must be non-empty and without spaces.
    """
    scheme, _, rest = value.strip().partition(b" ")
    token = rest.lstrip(b" ")
    if scheme.lower() != b"bearer" or not token or b" " in token:
        return None
    return token


def parse_id(raw: str, what: str) -> int:
    """A path id: ASCII digits, 1 ≤ id ≤ 2^63-1 (``bigint``); else ``BadRequest``."""
    if _DIGITS.fullmatch(raw) is None or not 1 <= (ident := int(raw)) <= MAX_ID:
        raise BadRequest(f"{what} id must be a positive integer (at most {MAX_ID})")
    return ident


def parse_limit(raw: str | None) -> int:
    """``limit`` of ``GET /admin/jobs``: absent or empty = 50, else ASCII digits in 1..1000."""
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 4) or not 1 <= int(raw) <= MAX_LIMIT:
        raise BadRequest(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return int(raw)


def _optional(value: str | None) -> str | None:
    """A query value, with an empty one (``?status=``) counting as not given."""
    return value or None


def _unauthorized(message: str) -> Response:
    return error_response(401, message, _CHALLENGE)
