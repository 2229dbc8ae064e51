"""``/admin/...``: the operator's HTTP API over ``autom.ops.Operations`` (routes and answers: README, Admin API).

Invariants: every route needs ``Authorization: Bearer $ADMIN_TOKEN``, checked before
anything else it does, so a caller without it learns nothing (401 with
``WWW-Authenticate``; a client refused more than 20 times in 10 s gets 429 for 60 s,
``autom.web.lockout``). Every query parameter and JSON field is checked
(``autom.web.params``, ``json_fields``): unknown, repeated or malformed is 400. Errors
are answered by ``autom.web.errors`` as ``{"error": "<one line>"}``. Every answer carries
``Cache-Control: no-store`` and ``nosniff``. A recipient in a path may hold ``/`` (percent-encoded,
``<name:recipient>``). An action that queued work rings the doorbell.
Public: ``admin_blueprint``, ``bearer_token``, ``parse_id``, ``json_fields``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from quart import Blueprint, Response, request

from autom.admission import retry_after
from autom.deps import Deps
from autom.ops import BULK_RETRY_CAP, FailedFilter, Operations, visible
from autom.web import errors
from autom.web import params as p
from autom.web.lockout import Lockout
from autom.web.params import MAX_ID, BadParameter
from autom.web.responses import error_response, json_response
from autom.web.token import AdminToken

log = logging.getLogger("autom.admin")

#: ``limit`` of the lists: default and bounds.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000

_CHALLENGE = {"WWW-Authenticate": "Bearer"}

#: the query parameters of each list (``autom.web.params``)
JOB_LIST = {**p.JOB_FILTERS, "before": p.ident, "limit": p.limit(MAX_LIMIT)}
EVENT_LIST = {**p.EVENT_FILTERS, "before": p.ident, "limit": p.limit(MAX_LIMIT)}
AUDIT = {"limit": p.limit(MAX_LIMIT)}
RETRY_FAILED = {"kind": p.text, "recipient": p.text, "since": p.when}
#: a recipient's page
RECIPIENT_PAGE = {"before": p.ident, "limit": p.limit(MAX_LIMIT)}
#: the body of a reschedule
RESCHEDULE = {"run_at": p.run_at}
#: routes that take no query parameter at all
NONE: dict[str, p.Parser] = {}

__all__ = ["MAX_ID", "MAX_LIMIT", "admin_blueprint", "bearer_token", "json_fields", "parse_id"]


def admin_blueprint(deps: Deps) -> Blueprint:
    """The blueprint serving ``/admin/...`` for ``deps`` (README, Admin API: routes, answers)."""
    bp = Blueprint("admin", __name__, url_prefix="/admin")
    admin = Admin(deps)
    bp.before_request(admin.authenticate)
    bp.after_request(admin.database_answered)
    # on the app, not the blueprint: also Quart's own 404/405 for /admin paths no route serves
    bp.after_app_request(_never_stored)
    errors.register(bp, errors.json_page, deps.metrics, log)
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


async def fields_of(spec: Mapping[str, p.Parser]) -> dict[str, Any]:
    """This request's JSON body checked against ``spec`` (``json_fields``)."""
    return json_fields(await request.get_data(True, False, False), spec)


class Admin:
    """The admin routes bound to one ``Deps``; each is a thin layer over ``Operations``.

    A route parses its parameters first (``BadParameter``: 400), then acts; every error
    it raises is answered by ``autom.web.errors`` (404, 409, 503).
    """

    def __init__(self, deps: Deps) -> None:
        """Bind the routes to ``deps`` (settings for the token, database, doorbell)."""
        self._deps = deps
        self._ops = Operations.of(deps.db, deps.registry)
        self._token = AdminToken(deps.settings.admin_token)
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

    async def database_answered(self, response: Response) -> Response:
        """After a route: a success was the database answering (``db_up`` 1; ``autom.web.errors`` sets 0)."""
        if response.status_code < 400:
            self._deps.metrics.db_up.set(1)
        return response

    def _token_problem(self) -> str | None:
        """What is wrong with this request's Authorization header (None: it carries ADMIN_TOKEN)."""
        if not self._token.enabled:
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
        if not self._token.matches(token):
            return "invalid token"
        return None

    async def list_jobs(self) -> Response:
        """``GET /admin/jobs``: 200 ``{"jobs": [...]}``, newest first; 400 for bad filters."""
        q = query(JOB_LIST)
        jobs = await self._ops.list_jobs(p.job_filter(q), limit=q["limit"] or DEFAULT_LIMIT, before=q["before"])
        return json_response(200, {"jobs": jobs})

    async def get_job(self, job_id: str) -> Response:
        """``GET /admin/jobs/{id}``: 200 the job with its attempt log; 400 malformed id; 404 unknown."""
        return json_response(200, await self._ops.get_job(await _path_id(job_id, "job")))

    async def retry_job(self, job_id: str) -> Response:
        """``POST /admin/jobs/{id}/retry``: 200 the job, now pending; 409 running or done; 404 unknown."""
        return await self._job_action(job_id, self._ops.retry_job, "put back in the queue")

    async def cancel_job(self, job_id: str) -> Response:
        """``POST /admin/jobs/{id}/cancel``: 200 the job, now cancelled (also a running one); 409 done, failed
        or cancelled; 404 unknown."""
        return await self._job_action(job_id, self._ops.cancel_job, "cancelled")

    async def _job_action(self, raw: str, op: Callable[..., Awaitable[dict[str, Any]]], done: str) -> Response:
        """``op(id, via="api")`` on the path's job; 200 the job as it is now."""
        ident = await _path_id(raw, "job")
        job = await op(ident, via="api")
        # a retried job may run now; a cancelled one may free its recipient's later jobs
        self._deps.doorbell.set()
        log.info("admin: job %d %s", ident, done, extra={"job_id": ident, "kind": job["kind"]})
        return json_response(200, job)

    async def reschedule_job(self, job_id: str) -> Response:
        """``POST /admin/jobs/{id}/reschedule`` with ``{"run_at": ISO 8601 or "now"}``: 200 the job; 409 unless
        pending; 400 without a valid run_at; 404 unknown."""
        query(NONE)
        fields = await fields_of(RESCHEDULE)
        ident = parse_id(job_id, "job")
        if "run_at" not in fields:
            raise BadParameter('run_at is required: "now" or an ISO 8601 time')
        job = await self._ops.reschedule_job(ident, fields["run_at"], via="api")
        self._deps.doorbell.set()
        log.info("admin: job %d rescheduled to %s", ident, job["run_at"], extra={"job_id": ident})
        return json_response(200, job)

    async def retry_failed(self) -> Response:
        """``POST /admin/retry-failed`` with ``{"kind","recipient","since"}`` (each optional; or as query
        parameters): 200 how many were retried and skipped; 400 for an unknown or malformed field."""
        q = query(RETRY_FAILED)
        for name, value in (await fields_of(RETRY_FAILED)).items():
            if q[name] is not None:
                raise BadParameter(f"{name} given both in the query and in the body")
            q[name] = value
        result = await self._ops.retry_failed(FailedFilter(**q), cap=BULK_RETRY_CAP, via="api")
        if result.retried:
            self._deps.doorbell.set()
        log.info("admin: retried %d failed job(s), skipped %d", len(result.retried), result.skipped,
                 extra={"count": len(result.retried)})
        return json_response(200, result.as_json())

    async def list_events(self) -> Response:
        """``GET /admin/events``: 200 ``{"events": [...]}``, newest first; 400 for bad filters."""
        q = query(EVENT_LIST)
        events = await self._ops.list_events(source=q["source"], since=q["since"], until=q["until"],
                                             before=q["before"], limit=q["limit"] or DEFAULT_LIMIT)
        return json_response(200, {"events": events})

    async def get_event(self, event_id: str) -> Response:
        """``GET /admin/events/{id}``: 200 the event with its ``job_ids``; 400 malformed id; 404 unknown."""
        return json_response(200, await self._ops.get_event(await _path_id(event_id, "event")))

    async def replay_event(self, event_id: str) -> Response:
        """``POST /admin/events/{id}/replay``: 202 ``{"jobs": [ids]}``; 409 cannot parse/unknown source; 404."""
        ident = await _path_id(event_id, "event")
        created = await self._ops.replay_event(ident, via="api")
        if created:
            self._deps.doorbell.set()
        log.info("admin: event %d replayed, %d job(s) created", ident, len(created),
                 extra={"event_id": ident, "count": len(created)})
        return json_response(202, {"jobs": created})

    async def paused_kinds(self) -> Response:
        """``GET /admin/kinds/paused``: 200 ``{"paused": [...]}``."""
        query(NONE)
        return json_response(200, {"paused": await self._ops.paused_kinds()})

    async def pause_kind(self, kind: str) -> Response:
        """``POST /admin/kinds/{kind}/pause``: 200; its jobs stay pending until resumed."""
        return await self._kind(kind, pause=True)

    async def resume_kind(self, kind: str) -> Response:
        """``POST /admin/kinds/{kind}/resume``: 200; its jobs run again."""
        return await self._kind(kind, pause=False)

    async def get_recipient(self, recipient: str) -> Response:
        """``GET /admin/recipients/{r}?before=&limit=``: 200 ``{"recipient","paused","blocked","timeline",...}``."""
        q = query(RECIPIENT_PAGE)
        name = p.text("recipient", recipient)
        return json_response(200, await self._ops.recipient(name, before=q["before"],
                                                            limit=q["limit"] or DEFAULT_LIMIT))

    async def pause_recipient(self, recipient: str) -> Response:
        """``POST /admin/recipients/{r}/pause``: 200 the recipient; its jobs stay pending (every replica)."""
        name = await _path_name(recipient, "recipient")
        await self._ops.pause_recipient(name, via="api")
        log.info("admin: recipient %s paused", visible(name, one_line=True))
        return json_response(200, await self._ops.recipient(name, limit=DEFAULT_LIMIT))

    async def resume_recipient(self, recipient: str) -> Response:
        """``POST /admin/recipients/{r}/resume``: 200 the recipient; its jobs are claimed again."""
        name = await _path_name(recipient, "recipient")
        if await self._ops.resume_recipient(name, via="api"):
            self._deps.doorbell.set()
        log.info("admin: recipient %s resumed", visible(name, one_line=True))
        return json_response(200, await self._ops.recipient(name, limit=DEFAULT_LIMIT))

    async def purge_recipient(self, recipient: str) -> Response:
        """``POST /admin/recipients/{r}/purge``: 200 ``{"cancelled": n}``: its pending jobs ended cancelled."""
        name = await _path_name(recipient, "recipient")
        n = await self._ops.purge_recipient(name, via="api")
        log.info("admin: recipient %s purged, %d pending job(s) cancelled", visible(name, one_line=True), n)
        return json_response(200, {"cancelled": n})

    async def stats(self) -> Response:
        """``GET /admin/stats``: 200 jobs by status and kind, queue lag, failures in the last hour."""
        query(NONE)
        return json_response(200, await self._ops.stats())

    async def audit(self) -> Response:
        """``GET /admin/audit?limit=``: 200 ``{"actions": [...]}``, the operator actions, newest first."""
        q = query(AUDIT)
        return json_response(200, {"actions": await self._ops.audit(q["limit"] or DEFAULT_LIMIT)})

    async def _kind(self, raw: str, *, pause: bool) -> Response:
        kind = await _path_name(raw, "kind")
        changed = await (self._ops.pause_kind(kind, via="api") if pause else self._ops.resume_kind(kind, via="api"))
        if changed and not pause:
            self._deps.doorbell.set()
        log.info("admin: kind %s %s", kind, "paused" if pause else "resumed", extra={"kind": kind})
        return json_response(200, {"kind": kind, "paused": pause, "changed": changed})


async def _path_id(raw: str, what: str) -> int:
    """The path id of a route that takes no query parameter (and, as a POST, no field): 400 otherwise."""
    query(NONE)
    if request.method == "POST":
        await no_fields()
    return parse_id(raw, what)


async def _path_name(raw: str, what: str) -> str:
    """The path's kind or recipient of a POST that takes no query parameter or field: 400 otherwise."""
    query(NONE)
    await no_fields()
    return p.text(what, raw)


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
