"""``/admin/...``: the operator's HTTP API over ``autom.ops.Operations`` (README, Admin API).

Every route needs ``Authorization: Bearer $ADMIN_TOKEN``. The check runs before
anything else a route does (parameter checks, database look-ups), so a caller
without the token learns nothing, not even whether an id exists: every answer
is then 401 ``{"error": ...}`` with ``WWW-Authenticate: Bearer``. A 401 counts as
a failed delivery of its client: more than 20 within 10 s and that client gets
429 for 60 s (``autom.web.lockout``). Without an ADMIN_TOKEN setting the admin API
refuses everyone (an empty token must never match an empty header). Every answer
carries ``Cache-Control: no-store`` and ``X-Content-Type-Options: nosniff``.

Answers (JSON in and out, errors as ``{"error": "<one line>"}``):

* ``GET  /admin/jobs?status=&kind=&recipient=&event_id=&since=&until=&failed_since=&before=&limit=50``
  200 ``{"jobs": [...]}``, newest first, failed jobs newest failure first (``before``: the
  keyset cursor, the last id of the previous page; ``since``/``until`` bound created_at,
  ``failed_since`` finished_at, ISO 8601 or an age such as ``6h``).
* ``GET  /admin/jobs/{id}``                    200 the job with its ``attempt_log``; 404 unknown.
* ``POST /admin/jobs/{id}/retry``              200 the job, now pending; 409 running or done; 404.
* ``POST /admin/jobs/{id}/cancel``             200 the job, now cancelled (a running one's handler is
  stopped within about a second, no retry, no alert); 409 done, failed or cancelled; 404.
* ``POST /admin/jobs/{id}/reschedule`` body ``{"run_at": ISO 8601 or "now"}``  200 the job; 409 unless
  pending (its retry delay is replaced); 400 without a valid run_at; 404.
* ``POST /admin/retry-failed`` body ``{"kind","recipient","since"}`` (each optional, or as query
  parameters)  200 ``{"retried","skipped","more","ids"}``: every failed job matching, at most
  ``BULK_RETRY_CAP`` a call, in batches; 400 for a body that is not a JSON object, an unknown
  field or a malformed value.
* ``GET  /admin/events?source=&since=&until=&before=&limit=50``  200 ``{"events": [...]}``.
* ``GET  /admin/events/{id}``                  200 the event with its ``job_ids``; 404.
* ``POST /admin/events/{id}/replay``           202 ``{"jobs": [ids created]}`` (always new jobs);
  409 source unknown or body unparsable; 404.
* ``GET  /admin/kinds/paused``                 200 ``{"paused": [{"kind","paused_at"}]}``.
* ``POST /admin/kinds/{kind}/pause`` / ``resume``  200 ``{"kind","paused","changed"}``; 404 for a
  kind no handler serves (resume: unless it is paused), naming it.
* ``GET  /admin/recipients/{r}?before=&limit=50``  200 ``{"recipient","paused","paused_at","blocked",
  "blocked_at","timeline","next_before"}``: its events, jobs, attempts, finishes and operator actions,
  newest first, for its ``limit`` newest jobs before job id ``before`` (``next_before`` pages on).
  ``{r}`` is percent-encoded; it may hold ``/`` (``site%3A%2Fcontact``).
* ``POST /admin/recipients/{r}/pause`` / ``resume``  200 the recipient (its jobs stay pending in every
  replica while paused); ``/purge``  200 ``{"cancelled": n}`` (its pending jobs end cancelled).
* ``GET  /admin/stats``                        200 counts, queue lag, failures in the last hour, paused kinds.

Every query parameter is checked (``autom.web.params``): an unknown one, one
given twice or a malformed value is 400 naming it, never silently ignored; an
empty value counts as not given. So is every field of a JSON body (``json_fields``):
a POST that takes none accepts an empty body or ``{}``.

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
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from quart import Blueprint, Response, request

from autom.admission import retry_after
from autom.deps import Deps
from autom.errors import Conflict, DatabaseUnavailable, QueryError
from autom.errors import NotFound as RowNotFound
from autom.ops import BULK_RETRY_CAP, FailedFilter, JobFilter, Operations, query_error_message, visible
from autom.web import params as p
from autom.web.lockout import Lockout
from autom.web.params import MAX_ID, BadParameter
from autom.web.responses import error_response, json_response

log = logging.getLogger("autom.admin")

#: ``limit`` of the lists: default and bounds.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000

_CHALLENGE = {"WWW-Authenticate": "Bearer"}

#: the query parameters of each list (``autom.web.params``)
JOB_FILTERS: dict[str, p.Parser] = {
    "status": p.status, "kind": p.text, "recipient": p.text, "event_id": p.ident,
    "since": p.when, "until": p.when, "failed_since": p.when,
}
JOB_LIST = {**JOB_FILTERS, "before": p.ident, "limit": p.limit(MAX_LIMIT)}
EVENT_LIST = {"source": p.text, "since": p.when, "until": p.when, "before": p.ident, "limit": p.limit(MAX_LIMIT)}
AUDIT = {"limit": p.limit(MAX_LIMIT)}
RETRY_FAILED = {"kind": p.text, "recipient": p.text, "since": p.when}
#: a recipient's page
RECIPIENT_PAGE = {"before": p.ident, "limit": p.limit(MAX_LIMIT)}
#: the body of a reschedule
RESCHEDULE = {"run_at": p.run_at}
#: routes that take no query parameter at all
NONE: dict[str, p.Parser] = {}

__all__ = ["MAX_ID", "MAX_LIMIT", "admin_blueprint", "bearer_token", "parse_id"]


def admin_blueprint(deps: Deps) -> Blueprint:
    """The blueprint serving ``/admin/...`` for ``deps`` (module docstring: routes, answers)."""
    bp = Blueprint("admin", __name__, url_prefix="/admin")
    admin = Admin(deps)
    bp.before_request(admin.authenticate)
    # on the app, not the blueprint: also Quart's own 404/405 for /admin paths no route serves
    bp.after_app_request(_never_stored)
    bp.add_url_rule("/jobs", "list_jobs", admin.list_jobs, methods=["GET"])
    bp.add_url_rule("/retry-failed", "retry_failed", admin.retry_failed, methods=["POST"])
    bp.add_url_rule("/jobs/<job_id>", "get_job", admin.get_job, methods=["GET"])
    bp.add_url_rule("/jobs/<job_id>/retry", "retry_job", admin.retry_job, methods=["POST"])
    bp.add_url_rule("/jobs/<job_id>/cancel", "cancel_job", admin.cancel_job, methods=["POST"])
    bp.add_url_rule("/jobs/<job_id>/reschedule", "reschedule_job", admin.reschedule_job, methods=["POST"])
    bp.add_url_rule("/events", "list_events", admin.list_events, methods=["GET"])
    bp.add_url_rule("/events/<event_id>", "get_event", admin.get_event, methods=["GET"])
    bp.add_url_rule("/events/<event_id>/replay", "replay_event", admin.replay_event, methods=["POST"])
    bp.add_url_rule("/kinds/paused", "paused_kinds", admin.paused_kinds, methods=["GET"])
    bp.add_url_rule("/kinds/<kind>/pause", "pause_kind", admin.pause_kind, methods=["POST"])
    bp.add_url_rule("/kinds/<kind>/resume", "resume_kind", admin.resume_kind, methods=["POST"])
    bp.add_url_rule("/stats", "stats", admin.stats, methods=["GET"])
    bp.add_url_rule("/audit", "audit", admin.audit, methods=["GET"])
    bp.add_url_rule("/recipients/<name:recipient>/pause", "pause_recipient", admin.pause_recipient, methods=["POST"])
    bp.add_url_rule("/recipients/<name:recipient>/resume", "resume_recipient", admin.resume_recipient,
                    methods=["POST"])
    bp.add_url_rule("/recipients/<name:recipient>/purge", "purge_recipient", admin.purge_recipient, methods=["POST"])
    bp.add_url_rule("/recipients/<name:recipient>", "get_recipient", admin.get_recipient, methods=["GET"])
    return bp


def query(spec: Mapping[str, p.Parser]) -> dict[str, Any]:
    """This request's query parameters checked against ``spec`` (``BadParameter`` otherwise)."""
    return p.parse_query(request.args.items(multi=True), spec)


async def no_fields() -> None:
    """A POST that takes no JSON field: an empty body or ``{}``; any field is unknown (``BadParameter``)."""
    json_fields(await request.get_data(True, False, False), NONE)


class Admin:
    """The admin routes bound to one ``Deps``; each is a thin layer over ``Operations``."""

    def __init__(self, deps: Deps) -> None:
        """Bind the routes to ``deps`` (settings for the token, database, doorbell)."""
        self._deps = deps
        self._ops = Operations.of(deps.db, deps.registry)
        token = deps.settings.admin_token
        # Digests, so that compare_digest also runs in time independent of the token's length.
        self._token_digest = hashlib.sha256(token.encode("utf-8")).digest() if token else None
        self._lockout = Lockout(deps, log)

    async def authenticate(self) -> Response | None:
        """Before every admin route: ``None`` lets the request through, else the 401 (or 429) answer.

        A client with more than 20 refusals within 10 s gets 429 for 60 s, whatever it
        sends (``autom.web.lockout``); every other client is untouched.
        """
        client = self._lockout.client()
        blocked = self._lockout.blocked_for(client)
        if blocked > 0:
            self._lockout.note(client, "admin: refused (429) a client that keeps sending wrong tokens")
            return error_response(429, "too many refused requests from this client, try again later",
                                  {"Retry-After": str(retry_after(blocked))})
        problem = self._token_problem()
        if problem is None:
            return None
        path = visible(request.path[:100], one_line=True)
        self._lockout.failed(client, f"admin: refused (401) {request.method} {path}: {problem}")
        return _unauthorized(problem)

    def _token_problem(self) -> str | None:
        """What is wrong with this request's Authorization header (None: it carries ADMIN_TOKEN)."""
        if self._token_digest is None:
            return "the admin API is disabled: ADMIN_TOKEN is not set"
        # Raw header bytes from the ASGI scope: no decoding guesses, and a repeated
        # Authorization header (ambiguous: which one counts?) is refused outright.
        values = [v for k, v in request.scope["headers"] if k.lower() == b"authorization"]
        if not values:
            return "missing Authorization: Bearer token"
        if len(values) > 1:
            return "more than one Authorization header"
        token = bearer_token(values[0])
        if token is None:
            return "Authorization must be: Bearer <token>"
        if not hmac.compare_digest(hashlib.sha256(token).digest(), self._token_digest):
            return "invalid token"
        return None

    async def list_jobs(self) -> Response:
        """``GET /admin/jobs``: 200 ``{"jobs": [...]}``, newest first; 400 for bad filters."""
        try:
            q = query(JOB_LIST)
        except BadParameter as exc:
            return error_response(400, str(exc))
        filt = JobFilter(**{k: q[k] for k in JOB_FILTERS})
        return await self._answer(
            200, lambda: self._ops.list_jobs(filt, limit=q["limit"] or DEFAULT_LIMIT, before=q["before"]), "jobs")

    async def get_job(self, job_id: str) -> Response:
        """``GET /admin/jobs/{id}``: 200 the job with its attempt log; 400 malformed id; 404 unknown."""
        return await self._with_id(job_id, "job", 200, self._ops.get_job)

    async def retry_job(self, job_id: str) -> Response:
        """``POST /admin/jobs/{id}/retry``: 200 the job, now pending; 409 running or done; 404 unknown."""

        async def retry(ident: int) -> dict[str, Any]:
            job = await self._ops.retry_job(ident, via="api")
            self._deps.doorbell.set()
            log.info("admin: job %d put back in the queue", ident, extra={"job_id": ident, "kind": job["kind"]})
            return job

        return await self._with_id(job_id, "job", 200, retry)

    async def cancel_job(self, job_id: str) -> Response:
        """``POST /admin/jobs/{id}/cancel``: 200 the job, now cancelled (also a running one); 409 done, failed
        or cancelled; 404 unknown."""

        async def cancel(ident: int) -> dict[str, Any]:
            job = await self._ops.cancel_job(ident, via="api")
            # its recipient's later jobs may be free to run now
            self._deps.doorbell.set()
            log.info("admin: job %d cancelled", ident, extra={"job_id": ident, "kind": job["kind"]})
            return job

        return await self._with_id(job_id, "job", 200, cancel)

    async def reschedule_job(self, job_id: str) -> Response:
        """``POST /admin/jobs/{id}/reschedule`` with ``{"run_at": ISO 8601 or "now"}``: 200 the job; 409 unless
        pending; 400 without a valid run_at; 404 unknown."""
        try:
            query(NONE)
            fields = json_fields(await request.get_data(True, False, False), RESCHEDULE)
            ident = parse_id(job_id, "job")
            if "run_at" not in fields:
                raise BadParameter('run_at is required: "now" or an ISO 8601 time')
        except BadParameter as exc:
            return error_response(400, str(exc))

        async def reschedule() -> dict[str, Any]:
            job = await self._ops.reschedule_job(ident, fields["run_at"], via="api")
            self._deps.doorbell.set()
            log.info("admin: job %d rescheduled to %s", ident, job["run_at"], extra={"job_id": ident})
            return job

        return await self._answer(200, reschedule)

    async def retry_failed(self) -> Response:
        """``POST /admin/retry-failed`` with ``{"kind","recipient","since"}`` (each optional; or as query
        parameters): 200 how many were retried and skipped; 400 for an unknown or malformed field."""
        try:
            q = query(RETRY_FAILED)
            fields = json_fields(await request.get_data(True, False, False), RETRY_FAILED)
            for name, value in fields.items():
                if q[name] is not None:
                    raise BadParameter(f"{name} given both in the query and in the body")
                q[name] = value
        except BadParameter as exc:
            return error_response(400, str(exc))

        async def retry() -> dict[str, Any]:
            result = await self._ops.retry_failed(FailedFilter(**q), cap=BULK_RETRY_CAP, via="api")
            if result.retried:
                self._deps.doorbell.set()
            log.info("admin: retried %d failed job(s), skipped %d", len(result.retried), result.skipped,
                     extra={"count": len(result.retried)})
            return result.as_json()

        return await self._answer(200, retry)

    async def list_events(self) -> Response:
        """``GET /admin/events``: 200 ``{"events": [...]}``, newest first; 400 for bad filters."""
        try:
            q = query(EVENT_LIST)
        except BadParameter as exc:
            return error_response(400, str(exc))
        return await self._answer(200, lambda: self._ops.list_events(
            source=q["source"], since=q["since"], until=q["until"], before=q["before"],
            limit=q["limit"] or DEFAULT_LIMIT), "events")

    async def get_event(self, event_id: str) -> Response:
        """``GET /admin/events/{id}``: 200 the event with its ``job_ids``; 400 malformed id; 404 unknown."""
        return await self._with_id(event_id, "event", 200, self._ops.get_event)

    async def replay_event(self, event_id: str) -> Response:
        """``POST /admin/events/{id}/replay``: 202 ``{"jobs": [ids]}``; 409 cannot parse/unknown source; 404."""

        async def replay(ident: int) -> dict[str, Any]:
            created = await self._ops.replay_event(ident, via="api")
            if created:
                self._deps.doorbell.set()
            log.info("admin: event %d replayed, %d job(s) created", ident, len(created),
                     extra={"event_id": ident, "count": len(created)})
            return {"jobs": created}

        return await self._with_id(event_id, "event", 202, replay)

    async def paused_kinds(self) -> Response:
        """``GET /admin/kinds/paused``: 200 ``{"paused": [...]}``."""
        return await self._plain(self._ops.paused_kinds, "paused")

    async def pause_kind(self, kind: str) -> Response:
        """``POST /admin/kinds/{kind}/pause``: 200; its jobs stay pending until resumed."""
        return await self._kind(kind, pause=True)

    async def resume_kind(self, kind: str) -> Response:
        """``POST /admin/kinds/{kind}/resume``: 200; its jobs run again."""
        return await self._kind(kind, pause=False)

    async def get_recipient(self, recipient: str) -> Response:
        """``GET /admin/recipients/{r}?before=&limit=``: 200 ``{"recipient","paused","blocked","timeline",...}``."""
        try:
            q = query(RECIPIENT_PAGE)
            name = p.text("recipient", recipient)
        except BadParameter as exc:
            return error_response(400, str(exc))
        return await self._answer(200, lambda: self._ops.recipient(name, before=q["before"],
                                                                   limit=q["limit"] or DEFAULT_LIMIT))

    async def pause_recipient(self, recipient: str) -> Response:
        """``POST /admin/recipients/{r}/pause``: 200 the recipient; its jobs stay pending (every replica)."""
        return await self._recipient_action(recipient, "pause")

    async def resume_recipient(self, recipient: str) -> Response:
        """``POST /admin/recipients/{r}/resume``: 200 the recipient; its jobs are claimed again."""
        return await self._recipient_action(recipient, "resume")

    async def purge_recipient(self, recipient: str) -> Response:
        """``POST /admin/recipients/{r}/purge``: 200 ``{"cancelled": n}``: its pending jobs ended cancelled."""
        return await self._recipient_action(recipient, "purge")

    async def _recipient_action(self, raw: str, action: str) -> Response:
        try:
            query(NONE)
            await no_fields()
            name = p.text("recipient", raw)
        except BadParameter as exc:
            return error_response(400, str(exc))

        async def act() -> dict[str, Any]:
            shown = visible(name, one_line=True)
            if action == "purge":
                n = await self._ops.purge_recipient(name, via="api")
                log.info("admin: recipient %s purged, %d pending job(s) cancelled", shown, n)
                return {"cancelled": n}
            if action == "pause":
                await self._ops.pause_recipient(name, via="api")
            elif await self._ops.resume_recipient(name, via="api"):
                self._deps.doorbell.set()
            log.info("admin: recipient %s %sd", shown, action)
            return await self._ops.recipient(name, limit=DEFAULT_LIMIT)

        return await self._answer(200, act)

    async def stats(self) -> Response:
        """``GET /admin/stats``: 200 jobs by status and kind, queue lag, failures in the last hour."""
        return await self._plain(self._ops.stats)

    async def audit(self) -> Response:
        """``GET /admin/audit?limit=``: 200 ``{"actions": [...]}``, the operator actions, newest first."""
        try:
            q = query(AUDIT)
        except BadParameter as exc:
            return error_response(400, str(exc))
        return await self._answer(200, lambda: self._ops.audit(q["limit"] or DEFAULT_LIMIT), "actions")

    async def _kind(self, raw: str, *, pause: bool) -> Response:
        try:
            query(NONE)
            await no_fields()
            kind = p.text("kind", raw)
        except BadParameter as exc:
            return error_response(400, str(exc))

        async def change() -> dict[str, Any]:
            changed = await (self._ops.pause_kind(kind, via="api") if pause else self._ops.resume_kind(kind, via="api"))
            if changed and not pause:
                self._deps.doorbell.set()
            log.info("admin: kind %s %s", kind, "paused" if pause else "resumed", extra={"kind": kind})
            return {"kind": kind, "paused": pause, "changed": changed}

        return await self._answer(200, change)

    async def _plain(self, op: Callable[[], Awaitable[Any]], wrap: str | None = None) -> Response:
        """A route without parameters: any query parameter is 400."""
        try:
            query(NONE)
        except BadParameter as exc:
            return error_response(400, str(exc))
        return await self._answer(200, op, wrap)

    async def _with_id(
        self, raw: str, what: str, status: int, op: Callable[[int], Awaitable[dict[str, Any]]]
    ) -> Response:
        """Parse the path id (400 if malformed), then answer ``op(id)``."""
        try:
            query(NONE)
            if request.method == "POST":
                await no_fields()
            ident = parse_id(raw, what)
        except BadParameter as exc:
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


def json_fields(body: bytes, spec: Mapping[str, p.Parser]) -> dict[str, Any]:
    """The fields of a JSON object body, each a string (or null: not given) checked by its parser in ``spec``.

    An empty body is no fields. Anything but a JSON object, a field ``spec`` does not
    name, or a value that is not a string is ``BadParameter`` (400) naming it.
    """
    if not body.strip():
        return {}
    try:
        document = json.loads(body)
    except ValueError:  # also UnicodeDecodeError: not UTF-8
        raise BadParameter("the body must be a JSON object") from None
    if not isinstance(document, dict):
        raise BadParameter("the body must be a JSON object")
    fields: dict[str, Any] = {}
    for name, value in document.items():
        if name not in spec:
            shown = name if len(name) <= 40 and name.isprintable() else repr(name[:40])
            raise BadParameter(f"unknown field {shown!r} (known: {', '.join(sorted(spec))})")
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise BadParameter(f"{name} must be a string")
        fields[name] = spec[name](name, value)
    return fields


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
    """A path id: ASCII digits, 1 ≤ id ≤ 2^63-1 (``bigint``); else ``BadParameter`` (a ``BadRequest``)."""
    return p.ident(f"{what} id", raw)


#: on every /admin answer: operator data is never cached (by a browser or a proxy), nor sniffed as HTML
ADMIN_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


async def _never_stored(response: Response) -> Response:
    """``ADMIN_HEADERS`` on an answer to an ``/admin`` path (every answer, errors included)."""
    if request.path == "/admin" or request.path.startswith("/admin/"):
        response.headers.update(ADMIN_HEADERS)
    return response


def _unauthorized(message: str) -> Response:
    return error_response(401, message, _CHALLENGE)
