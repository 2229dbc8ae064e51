"""``GET /openapi.json``: an OpenAPI 3.1 description of autom's HTTP interface (no auth).

It describes what the routes really answer, status codes and bodies included, and
tests/integration/test_admin_fuzz.py holds the live app to it. Python data rather than
a shipped file, so shared pieces (the error body, the id parameters) are defined once
and the limits are the code's own constants. Not described: 404 for a path no route
serves, 405 (with ``Allow``), the automatic ``HEAD``/``OPTIONS``: JSON errors too.
"""

from __future__ import annotations

import copy
from typing import Any

from quart import Blueprint, Response

from autom import __version__
from autom.ops import BULK_RETRY_CAP, JOB_STATUSES, MAX_NAME
from autom.web.admin import DEFAULT_LIMIT, MAX_ID, MAX_LIMIT
from autom.web.responses import json_response

_ERROR_REF = {"$ref": "#/components/schemas/Error"}


def _error(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """A response whose body is ``{"error": "<one line>"}``."""
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": _ERROR_REF}}}
    if headers:
        response["headers"] = headers
    return response


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


_UNAUTHORIZED = _error(
    "No, a malformed, or a wrong `Authorization: Bearer` token (checked before anything else).",
    {"WWW-Authenticate": {"required": True, "schema": {"type": "string", "const": "Bearer"}}},
)
_UNAVAILABLE = _error("The database is unavailable.")
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again.",
                                "schema": {"type": "integer", "minimum": 1}}}
_LOCKED_OUT = _error("This client was refused (401) more than 20 times within 10 s: it is refused for 60 s, "
                     "whatever token it sends (every other client is not).", _RETRY_AFTER)
_BAD_ID = _error("The id is not a positive integer that fits a bigint, a query parameter was given, or a POST's "
                 "body is neither empty nor `{}`.")
_SECURITY: list[dict[str, list[str]]] = [{"adminToken": []}]
_NO_QUERY = _error("This route takes no query parameter.")
_BAD_KIND = _error("A kind that is not printable text of at most 200 characters, a query parameter, or a body "
                   "neither empty nor `{}`.")
_NAME = {"type": "string", "maxLength": MAX_NAME}
_ID = {"type": "integer", "format": "int64", "minimum": 1, "maximum": MAX_ID}
_SINCE = {"type": "string", "description": "ISO 8601 (2026-12-01T09:30:00Z) or an age: 90s, 30m, 6h, 7d."}
_KIND_PARAMETER = {"name": "kind", "in": "path", "required": True, "description": "The job kind.",
                   "schema": {"type": "string", "maxLength": MAX_NAME}}


def _query(name: str, schema: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    parameter: dict[str, Any] = {"name": name, "in": "query", "required": False, "schema": schema}
    if description:
        parameter["description"] = description
    return parameter


def _id_parameter(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name, "in": "path", "required": True, "description": f"The {what}'s id.",
        "schema": {"type": "integer", "format": "int64", "minimum": 1, "maximum": MAX_ID},
    }


def _admin_list(
    operation_id: str, summary: str, listed: str, what: str, filters: list[dict[str, Any]], *,
    bad_request: str = "An unknown, repeated or malformed query parameter.", description: str | None = None,
) -> dict[str, Any]:
    """A keyset-paged /admin list of ``what`` (newest first): its own ``filters``, then the
    time window (``since``/``until`` on its time column ``listed``), ``before`` and ``limit``."""
    return _admin_operation(
        operation_id, summary,
        {"200": _json(f"The {what}, newest first.", _ref(f"{what[:-1].capitalize()}List")),
         "400": _error(bad_request)},
        description=description,
        parameters=[
            *filters,
            _query("since", _SINCE, f"{listed} at or after: ISO 8601 (no zone = UTC) or an age (`6h`)."),
            _query("until", _SINCE, f"{listed} before: ISO 8601 or an age."),
            _query("before", _ID, f"Keyset cursor: only {what} with a smaller id."),
            _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}),
        ],
    )


def _admin_operation(
    operation_id: str, summary: str, responses: dict[str, Any], *,
    description: str | None = None, parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An /admin operation: bearer token, and the 401, 429 and 503 every admin route can answer."""
    operation: dict[str, Any] = {"operationId": operation_id, "tags": ["admin"], "summary": summary}
    if description:
        operation["description"] = description
    operation["security"] = _SECURITY
    if parameters:
        operation["parameters"] = parameters
    every = {"401": _UNAUTHORIZED, "429": _LOCKED_OUT, "503": _UNAVAILABLE}
    operation["responses"] = dict(sorted({**responses, **every}.items()))
    return operation


def _admin_by_id(operation_id: str, summary: str, what: str, responses: dict[str, Any]) -> dict[str, Any]:
    """An /admin operation on one job or event named by its id in the path."""
    by_id = {"400": _BAD_ID, "404": _error(f"No {what} has this id.")}  # 400 also for any query parameter
    return _admin_operation(operation_id, summary, {**responses, **by_id},
                            parameters=[_id_parameter(f"{what}_id", what)])


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


_TIME = {"type": "string", "format": "date-time"}

_RECIPIENT_PARAMETER = {"name": "recipient", "in": "path", "required": True, "schema": _NAME,
                        "description": "A job's recipient (a chat id, ...), percent-encoded: it may hold / "
                                       "(site%3A%2Fcontact)."}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {"error": {"type": "string", "description": "What went wrong, on one line."}},
    },
    "Job": {
        "type": "object",
        "required": [
            "id", "kind", "status", "attempts", "max_attempts", "run_at", "locked_until", "last_error",
            "key", "event_id", "recipient", "payload", "created_at", "updated_at", "finished_at",
        ],
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "kind": {"type": "string", "description": "Which handler runs it (`telegram.message`, ...)."},
            "status": {"type": "string", "enum": list(JOB_STATUSES)},
            "attempts": {"type": "integer", "minimum": 0, "description": "Claims so far (1 while the first run goes)."},
            "max_attempts": {"type": "integer", "minimum": 1},
            "run_at": {**_TIME, "description": "When it is (or was) due."},
            "locked_until": _nullable({**_TIME, "description": "Lease end of the current claim."}),
            "last_error": _nullable({"type": "string"}),
            "key": _nullable({"type": "string", "description": "A job with a key is created once per kind."}),
            "event_id": _nullable({"type": "integer", "description": "The event it came from."}),
            "recipient": _nullable({"type": "string", "description": "Its jobs run one at a time, in order."}),
            "payload": {"type": "object"},
            "created_at": _TIME,
            "updated_at": _TIME,
            "finished_at": _nullable(_TIME),
        },
    },
    "JobDetail": {
        "allOf": [
            _ref("Job"),
            {
                "type": "object",
                "required": ["attempt_log"],
                "properties": {
                    "attempt_log": {
                        "type": "array", "items": _ref("Attempt"),
                        "description": "One entry per attempt, oldest first (the one running now included).",
                    },
                },
            },
        ],
    },
    "Attempt": {
        "type": "object",
        "required": ["attempt", "started", "ended", "outcome", "error", "traceback", "log"],
        "additionalProperties": False,
        "properties": {
            "attempt": {"type": "integer", "minimum": 1,
                        "description": "1 = the job's first run; numbered on across manual retries."},
            "started": _nullable({**_TIME, "description": "When it was claimed (unknown before migration 0008)."}),
            "ended": _nullable({**_TIME, "description": "NULL while it runs."}),
            "started_at": _nullable({**_TIME, "deprecated": True, "description": "The same as started."}),
            "ended_at": _nullable({**_TIME, "deprecated": True, "description": "The same as ended."}),
            "outcome": {"type": "string", "enum": ["retry", "failed", "lease_expired", "cancelled", "running", "done"]},
            "error": _nullable({"type": "string"}),
            "traceback": _nullable({"type": "string",
                                    "description": "The handler's traceback when it raised an unexpected error."}),
            "log": _nullable({"type": "array", "items": {"type": "string"},
                              "description": "The lines the handler logged through ctx.log (at most 100)."}),
        },
    },
    "JobList": {
        "type": "object",
        "required": ["jobs"],
        "properties": {"jobs": {"type": "array", "items": _ref("Job"), "description": "Newest first."}},
    },
    "Event": {
        "type": "object",
        "required": ["id", "source", "received_at", "dedup_key", "headers", "body", "job_ids"],
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "source": {"type": "string"},
            "received_at": _TIME,
            "dedup_key": _nullable({"type": "string", "description": "The sender's delivery id, if any."}),
            "headers": {
                "type": "object", "additionalProperties": {"type": "string"},
                "description": "Request headers, names lower-cased, credentials and signatures left out.",
            },
            "body": {"type": "string", "description": "Byte for byte what the sender sent (UTF-8 text)."},
            "job_ids": {"type": "array", "items": {"type": "integer"}, "description": "Its jobs, oldest first."},
        },
    },
    "EventSummary": {
        "type": "object",
        "required": ["id", "source", "received_at", "dedup_key", "body_bytes", "jobs"],
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "source": {"type": "string"},
            "received_at": _TIME,
            "dedup_key": _nullable({"type": "string"}),
            "body_bytes": {"type": "integer", "minimum": 0},
            "jobs": {"type": "integer", "minimum": 0, "description": "How many jobs it has."},
        },
    },
    "EventList": {
        "type": "object",
        "required": ["events"],
        "properties": {"events": {"type": "array", "items": _ref("EventSummary"), "description": "Newest first."}},
    },
    "BulkRetried": {
        "type": "object",
        "required": ["retried", "skipped", "more", "ids"],
        "additionalProperties": False,
        "properties": {
            "retried": {"type": "integer", "minimum": 0, "description": "Jobs put back in the queue."},
            "skipped": {"type": "integer", "minimum": 0, "description": "Matched, but left failed meanwhile."},
            "more": {"type": "boolean", "description": f"The cap ({BULK_RETRY_CAP}) was reached: call again."},
            "ids": {"type": "array", "items": {"type": "integer"}},
        },
    },
    "PausedKinds": {
        "type": "object",
        "required": ["paused"],
        "properties": {
            "paused": {
                "type": "array",
                "items": {
                    "type": "object", "required": ["kind", "paused_at"],
                    "properties": {"kind": {"type": "string"}, "paused_at": _TIME},
                },
            },
        },
    },
    "KindState": {
        "type": "object",
        "required": ["kind", "paused", "changed"],
        "additionalProperties": False,
        "properties": {
            "kind": {"type": "string"},
            "paused": {"type": "boolean", "description": "Whether the kind is paused now."},
            "changed": {"type": "boolean", "description": "False when it already was (idempotent)."},
        },
    },
    "Replayed": {
        "type": "object",
        "required": ["jobs"],
        "additionalProperties": False,
        "properties": {
            "jobs": {
                "type": "array", "items": {"type": "integer"},
                "description": "Ids of the jobs created: always new ones (a replayed job's key is made distinct).",
            },
        },
    },
    "Stats": {
        "type": "object",
        "required": ["jobs", "by_kind", "queue_lag_seconds", "failed_last_hour", "paused_kinds"],
        "properties": {
            "jobs": {
                "type": "object",
                "required": list(JOB_STATUSES),
                "properties": {s: {"type": "integer", "minimum": 0} for s in JOB_STATUSES},
                "additionalProperties": {"type": "integer", "minimum": 0},
                "description": "Jobs by status.",
            },
            "by_kind": {
                "type": "object",
                "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
                "description": "Per kind, jobs by status (statuses with no job left out).",
            },
            "queue_lag_seconds": {
                "type": "number", "minimum": 0,
                "description": "How long the oldest due pending job has waited (0 when none).",
            },
            "failed_last_hour": {"type": "integer", "minimum": 0},
            "paused_kinds": {"type": "array", "items": {"type": "string"}},
        },
    },
    "Accepted": {
        "oneOf": [
            {
                "type": "object",
                "required": ["id", "jobs"],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "description": "The stored event's id."},
                    "jobs": {"type": "integer", "minimum": 0, "description": "Jobs created for it."},
                },
            },
            {
                "type": "object",
                "required": ["duplicate"],
                "additionalProperties": False,
                "properties": {"duplicate": {"const": True, "description": "A redelivery: nothing was stored."}},
            },
        ],
    },
    "Health": {
        "type": "object",
        "required": ["status", "database"],
        "properties": {
            "status": {"type": "string", "enum": ["ok", "degraded", "unavailable"]},
            "database": {"type": "string", "enum": ["ok", "down"]},
            "alerts": {
                "type": "object",
                "required": ["unsent"],
                "additionalProperties": False,
                "properties": {
                    "unsent": {"type": "integer", "minimum": 0, "description": "Alerts not delivered yet."},
                    "problems": {
                        "type": "array", "items": {"type": "string"},
                        "description": "Why alerts do not get out (status degraded).",
                    },
                },
            },
            "uptime_seconds": {"type": "number", "minimum": 0},
        },
    },
}

_SOURCE_HEADERS = [
    ("X-Telegram-Bot-Api-Secret-Token", "telegram: TELEGRAM_WEBHOOK_SECRET, as given to setWebhook."),
    ("X-Signature", "site: `sha256=<hex HMAC-SHA256 of the raw body>` keyed with SITE_WEBHOOK_SECRET."),
    ("X-Hub-Signature-256", "github: `sha256=<hex HMAC>` as GitHub documents it."),
    ("X-GitHub-Delivery", "github: the delivery id (the dedup key)."),
    ("Stripe-Signature", "stripe: `t=<unix>,v1=<hex HMAC of \"t.body\">`, ±300 s."),
    ("webhook-id", "standard: the message id (the dedup key)."),
    ("webhook-timestamp", "standard: unix seconds, ±300 s."),
    ("webhook-signature", "standard: `v1,<base64 HMAC of \"id.timestamp.body\">`."),
]

_PATHS: dict[str, Any] = {
    "/hooks/{source}": {
        "post": {
            "operationId": "receiveWebhook",
            "tags": ["intake"],
            "summary": "Receive a webhook delivery",
            "description": (
                "Checked in this order, and nothing is written unless all pass: 404 unknown or disabled "
                "source; 429 the client is over CLIENT_RATE or keeps failing verification (before the body "
                "is read); 413 body larger than MAX_BODY_BYTES; 401 the source's verification failed; 400 a "
                "verified body that is not UTF-8 text (or holds NUL); 503 database down, or the backlog is "
                "full for this sender; 429 the delivery's recipient is at MAX_PENDING_PER_RECIPIENT. "
                "429 and 503 carry Retry-After (whole seconds). Otherwise 202: "
                "the event and its jobs are stored in one transaction. A verified body that does not "
                "parse is stored with no jobs (replayable)."
            ),
            "parameters": [
                {
                    "name": "source", "in": "path", "required": True,
                    "description": "telegram, site, github, stripe or standard (enabled when its secret is set).",
                    "schema": {"type": "string"},
                },
                *(
                    {"name": name, "in": "header", "required": False, "description": text,
                     "schema": {"type": "string"}}
                    for name, text in _SOURCE_HEADERS
                ),
            ],
            "requestBody": {
                "required": False,
                "description": "The sender's body, stored byte for byte; any content type.",
                "content": {"application/json": {"schema": {}}, "text/plain": {"schema": {"type": "string"}}},
            },
            "responses": {
                "202": _json("Stored (`id`, `jobs`), or a redelivery of a stored event (`duplicate`).",
                             _ref("Accepted")),
                "400": _error("The verified body is not UTF-8 text, or holds a NUL character."),
                "401": _error("Verification failed."),
                "404": _error("Unknown or disabled source."),
                "408": _error("The body did not arrive in time."),
                "413": _error("The body is larger than MAX_BODY_BYTES."),
                "429": _error("Too many requests from this client, too many failed deliveries from it, or too "
                              "many unfinished jobs for the delivery's recipient.", _RETRY_AFTER),
                "503": _error("The database is unavailable, or the backlog of unfinished jobs is full for "
                              "this sender.", _RETRY_AFTER),
            },
        },
    },
    "/health": {
        "get": {
            "operationId": "health",
            "tags": ["service"],
            "summary": "Whether the database answers (within about a second)",
            "responses": {
                "200": _json("The database answers; `degraded` when alerts do not get out.", _ref("Health")),
                "503": _json("The database does not answer.", _ref("Health")),
            },
        },
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "tags": ["service"],
            "summary": "Prometheus metrics of this process",
            "description": (
                "Prometheus text format 0.0.4. Database gauges (`autom_jobs{status,kind}`, "
                "`autom_queue_lag_seconds`) are refreshed at most every 5 s; when the database is down "
                "the answer is still 200, with `autom_database_up 0`."
            ),
            "responses": {
                "200": {"description": "The metrics.", "content": {"text/plain": {"schema": {"type": "string"}}}},
            },
        },
    },
    "/openapi.json": {
        "get": {
            "operationId": "openapi",
            "tags": ["service"],
            "summary": "This description",
            "responses": {"200": _json("OpenAPI 3.1.", {"type": "object"})},
        },
    },
    "/admin/jobs": {
        "get": _admin_list(
            "listJobs", "The newest jobs, filtered", "created_at", "jobs",
            [
                _query("status", {"type": "string", "enum": ["", *JOB_STATUSES]}),
                _query("kind", _NAME),
                _query("recipient", _NAME),
                _query("event_id", _ID),
                _query("failed_since", _SINCE, "finished_at at or after (failed jobs: failed since)."),
            ],
            bad_request="An unknown, repeated or malformed query parameter (named in the message).",
            description=(
                "Every filter is optional; an empty value counts as not given. An unknown query parameter "
                "is 400, never ignored. Page with `before` = the last id of the previous page. Failed jobs "
                "(`status=failed`) come newest failure first (finished_at, then id)."
            ),
        ),
    },
    "/admin/retry-failed": {
        "post": {
            **_admin_operation(
                "retryFailedJobs", "Retry every failed job that matches",
                {
                    "200": _json("How many were put back in the queue.", _ref("BulkRetried")),
                    "400": _error("A body that is not a JSON object, an unknown field or query parameter, a "
                                  "malformed value, or a filter given both in the query and the body."),
                },
                description=(
                    f"The body `{{\"kind\", \"recipient\", \"since\"}}` (each optional; also accepted as query "
                    f"parameters) filters which failed jobs are retried. At most {BULK_RETRY_CAP} jobs per call, "
                    "oldest first, in batches; `more` says to call again. `since` = failed at or after."
                ),
                parameters=[_query("kind", _NAME), _query("recipient", _NAME),
                            _query("since", _SINCE, "Failed at or after (ISO 8601 or an age).")],
            ),
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False,
                "properties": {"kind": _nullable(_NAME), "recipient": _nullable(_NAME), "since": _nullable(_SINCE)},
            }}}},
        },
    },
    "/admin/jobs/{job_id}": {
        "get": _admin_by_id("getJob", "One job with its attempt log", "job",
                            {"200": _json("The job.", _ref("JobDetail"))}),
    },
    "/admin/jobs/{job_id}/retry": {
        "post": _admin_by_id(
            "retryJob", "Put a failed, cancelled (or pending) job back in the queue now, attempts reset", "job",
            {
                "200": _json("The job as the retry left it: pending, attempts 0.", _ref("Job")),
                "409": _error("The job is running or done (replay its event instead)."),
            },
        ),
    },
    "/admin/jobs/{job_id}/cancel": {
        "post": _admin_by_id(
            "cancelJob", "Cancel a pending or running job: it never runs (again), no retry, no alert", "job",
            {
                "200": _json("The job, now cancelled; a running one's handler is stopped within about a second.",
                             _ref("Job")),
                "409": _error("The job is done, failed or cancelled already."),
            },
        ),
    },
    "/admin/jobs/{job_id}/reschedule": {
        "post": {
            **_admin_by_id(
                "rescheduleJob", "Run a pending job (also one waiting for its retry) not before a time, or now",
                "job",
                {
                    "200": _json("The job, pending, with its new run_at (its retry delay replaced).", _ref("Job")),
                    "400": _error('A missing or malformed run_at ("now" or an ISO 8601 time), or an unknown field.'),
                    "409": _error("The job is not pending."),
                },
            ),
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "required": ["run_at"],
                "properties": {"run_at": {"type": "string", "description": '"now" or an ISO 8601 time.'}},
            }}}},
        },
    },
    "/admin/events": {
        "get": _admin_list(
            "listEvents", "The newest stored events (without bodies)", "received_at", "events",
            [_query("source", _NAME)],
        ),
    },
    "/admin/events/{event_id}": {
        "get": _admin_by_id(
            "getEvent", "One stored event and the ids of its jobs", "event",
            {"200": _json("The event.", _ref("Event"))},
        ),
    },
    "/admin/events/{event_id}/replay": {
        "post": _admin_by_id(
            "replayEvent", "Parse a stored event again and create its jobs anew", "event",
            {
                "202": _json("The jobs created (also when jobs of the event exist or are done).", _ref("Replayed")),
                "409": _error("The event's source is not one autom knows, or its body does not parse."),
            },
        ),
    },
    "/admin/kinds/paused": {
        "get": _admin_operation(
            "pausedKinds", "The paused kinds",
            {"200": _json("The paused kinds.", _ref("PausedKinds")), "400": _NO_QUERY},
        ),
    },
    # pause and resume (of a kind, of a recipient) are alike by design: one entry each, as data
    "/admin/kinds/{kind}/pause": {
        "post": _admin_operation(
            "pauseKind", "Pause a kind: its jobs stay pending (every replica) until resumed",
            {"200": _json("Paused.", _ref("KindState")), "400": _BAD_KIND,
             "404": _error("No handler serves this kind (the message names it and the kinds that exist).")},
            parameters=[_KIND_PARAMETER],
        ),
    },
    "/admin/kinds/{kind}/resume": {
        "post": _admin_operation(
            "resumeKind", "Resume a paused kind",
            {"200": _json("Resumed.", _ref("KindState")), "400": _BAD_KIND,
             "404": _error("The kind is not paused and no handler serves it.")},
            parameters=[_KIND_PARAMETER],
        ),
    },
    "/admin/recipients/{recipient}": {
        "get": _admin_operation(
            "getRecipient",
            "A recipient's state and timeline (events, jobs, attempts, finishes, actions), newest first",
            {"200": _json("The recipient: `recipient`, `paused`, `blocked`, `timeline` (each `{at, type, ...}`), "
                          "`next_before` (the `before` of the next page, or null).", {"type": "object"}),
             "400": _error("A malformed recipient or query parameter.")},
            parameters=[_RECIPIENT_PARAMETER, _query("before", _ID, "Only jobs with a smaller id (paging)."),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT})],
        ),
    },
    **{f"/admin/recipients/{{recipient}}/{action}": {
        "post": _admin_operation(
            f"{action}Recipient", summary,
            {"200": _json(answer, {"type": "object"}), "400": _error("A malformed recipient, or a body with a field.")},
            parameters=[_RECIPIENT_PARAMETER],
        ),
    } for action, summary, answer in (
        ("pause", "Pause a recipient: its jobs stay pending (every replica) until resumed", "The recipient."),
        ("resume", "Resume a paused recipient", "The recipient."),
        ("purge", "Cancel every pending job of a recipient", "`{\"cancelled\": n}`."),
    )},
    "/admin/stats": {
        "get": _admin_operation(
            "stats", "Jobs by status and kind, queue lag, failures in the last hour, paused kinds",
            {"200": _json("The numbers.", _ref("Stats")), "400": _NO_QUERY},
        ),
    },
}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 description of autom's HTTP interface (a fresh copy: callers may change it)."""
    return copy.deepcopy({
        "openapi": "3.1.0",
        "info": {
            "title": "autom",
            "version": __version__,
            "description": (
                "Webhooks in, reliable work out. Every answer is JSON except /metrics; every error is "
                "`{\"error\": \"<one line>\"}`. /admin needs `Authorization: Bearer $ADMIN_TOKEN`."
            ),
        },
        "tags": [
            {"name": "intake", "description": "Webhook deliveries from the senders."},
            {"name": "admin", "description": "The operator's API (bearer token)."},
            {"name": "service", "description": "Health, metrics, this description."},
        ],
        "paths": _PATHS,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {
                "adminToken": {"type": "http", "scheme": "bearer", "description": "ADMIN_TOKEN."},
            },
        },
    })


def openapi_blueprint() -> Blueprint:
    """The blueprint serving ``GET /openapi.json``."""
    bp = Blueprint("openapi", __name__)
    document = openapi_document()

    @bp.get("/openapi.json")
    async def openapi() -> Response:
        """200 the OpenAPI description."""
        return json_response(200, document)

    return bp
