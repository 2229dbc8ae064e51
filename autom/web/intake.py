"""``POST /hooks/{source}``: verify a webhook delivery, parse it, and store it with its jobs.

``Intake.deliver`` is the whole route once the door has read the body: 401 failed
verification, 400 a body that is not UTF-8 text (or holds NUL), 503/429 admission
(``autom.admission``), 503 the database did not store it by ``DELIVERY_SECONDS``,
else 202 ``{"id": N, "jobs": K}`` or ``{"duplicate": true}``. Invariants: nothing is
written unless every check passes; a verified body that does not parse is stored
without jobs (replayable); no credential header is stored. Storing is
``autom.events.StoreBatcher``'s. The order and the reasons: docs/design/intake.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import trio
from quart import Blueprint, Response

from autom import tracing
from autom.admission import Admission
from autom.checks import one_line
from autom.deps import Deps
from autom.errors import DatabaseUnavailable, QueryError, VerificationError
from autom.events.batcher import Gone, Left, SenderGone, StoreBatcher
from autom.events.encode import encode_delivery
from autom.jobs.models import NewJob
from autom.sources import SECRET_SETTINGS
from autom.sources.base import Headers, ParseError, Source
from autom.web.responses import error_response

log = logging.getLogger("autom.intake")

#: Headers never stored whatever the source: they carry credentials.
ALWAYS_SECRET_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})

# Bodies above this are parsed in a worker thread: json.loads of a 1 MiB body takes
# milliseconds, which would stall every other request on the trio thread meanwhile.
_PARSE_IN_THREAD_BYTES = 64 * 1024

#: A delivery's deadline once its body is read: its answer comes by then, whatever the
#: database does (autom.events.StoreBatcher: the hop is cut off FATE_SECONDS before, the
#: rest is for its commit record, which turns a hop that committed all the same into its
#: 202). Senders give up after about 10 s themselves (GitHub: 10 s).
DELIVERY_SECONDS = 10.0

def intake_blueprint(intake: Intake) -> Blueprint:
    """The blueprint serving ``POST /hooks/<source>`` through Quart (what the door passes on: ``Intake``)."""
    bp = Blueprint("intake", __name__)
    bp.add_url_rule("/hooks/<source>", "hook", intake.not_found, methods=["POST"])
    return bp


class Answer(NamedTuple):
    """An intake answer as the ASGI messages need it: status, JSON body, extra header pairs."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()


def answer(status: int, data: Mapping[str, Any], retry_after: int | None = None) -> Answer:
    """``data`` as a compact JSON ``Answer``, with ``Retry-After`` when given."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return Answer(status, body, () if retry_after is None else ((b"retry-after", str(retry_after).encode()),))


def error_answer(status: int, message: str, retry_after: int | None = None) -> Answer:
    """``{"error": message}`` (one line) with ``status``."""
    return answer(status, {"error": one_line(message)}, retry_after)


_DUPLICATE = answer(202, {"duplicate": True})


class Intake:
    """The webhook route and its bookkeeping (metrics, one log line per delivery).

    ``deliver`` is the whole route for a known source once its body is read; the door
    (autom/web/door.py) calls it directly and sends its ``Answer`` as ASGI messages, so
    a delivery never goes through Quart's request machinery (docs/design/intake.md).
    ``not_found`` is the Quart route behind it, for what the door passes on: a delivery
    to an unknown source.
    """

    def __init__(self, deps: Deps, admission: Admission | None = None) -> None:
        """Bind the route to ``deps`` (sources, database, metrics, doorbell) and ``admission``."""
        self._deps = deps
        self._admission = admission
        self._batcher = StoreBatcher(deps.db, handoff=deps.handoff)
        #: the total deadline of a delivery once its body is read (``DELIVERY_SECONDS``)
        self.deadline_seconds = DELIVERY_SECONDS

    async def not_found(self, source: str) -> Response:
        """The Quart route behind the door: what it passes on is a delivery to an unknown source, 404."""
        # not counted in the metrics: the label would be whatever a scanner sends
        setting = SECRET_SETTINGS.get(source)
        if setting is not None:  # a built-in source whose secret is unset: say which setting
            log.info("webhook for the disabled source %s: set %s to enable it", source, setting,
                     extra={"outcome": "not_found"})
        else:
            log.info("webhook for an unknown source %s", ascii(source[:64]), extra={"outcome": "not_found"})
        return error_response(404, "unknown source")

    async def deliver(self, src: Source, headers: Headers, body: bytes, gone: Gone | None = None,
                      left: Left | None = None) -> Answer | None:
        """Handle one delivery to ``src`` (module docstring: checks, order, answers).

        ``gone`` returns once the sender has disconnected (the door waits on its ASGI
        ``receive``), or ``left`` tells without waiting whether it has (checked when a hop
        would take the delivery: ``StoreBatcher.deliver``): a delivery still waiting for the
        database then is withdrawn, one already sent is stored all the same, and there is
        no answer (None).

        ``headers`` as ``request_headers`` gives them. The source's ``verify`` always
        runs, also for a delivery the door let in on ``verify_headers``: that is an
        early refusal (and the pass past the per-address limits), never the whole proof,
        so a source that pre-checks a header there and signs the body in ``verify``
        cannot be half verified (for Telegram it is one more digest compare).
        """
        started = time.perf_counter()
        deadline = trio.current_time() + self.deadline_seconds
        try:
            src.verify(headers, body, time.time())
        except VerificationError as exc:
            # the sender hears only "verification failed"; the reason (safe to log) goes to the log
            return self._reject(src.name, 401, "verification failed", str(exc))
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return self._reject(src.name, 400, "body is not UTF-8 text", "body is not UTF-8")
        if "\x00" in text:
            return self._reject(
                src.name, 400, "body contains a NUL character, which cannot be stored as text", "NUL in body"
            )

        dedup_key, jobs, parse_error = await self._parse(src, headers, body, text)
        jobs = tracing.stamped(jobs)  # the delivery's span, stored with its jobs
        stored = {k: v for k, v in headers.items() if k not in src.secret_headers and k not in ALWAYS_SECRET_HEADERS}
        try:
            # the recipient's count may wait for the database too: bounded by the deadline
            # there, not by a cancel scope here, which every delivery would pay for (~14 µs)
            refusal = await self._admission_refusal(src, jobs, deadline)
            if refusal is not None:
                return refusal
            params = await encode_delivery(src.name, stored, text, dedup_key, jobs)
            event_id, created, handed = await self._batcher.deliver(params, deadline, gone, left)
        except SenderGone as exc:
            # no answer, so not counted; a delivery already sent is stored all the same
            outcome = "sent" if exc.sent else "withdrawn"
            log.info("webhook %s: its sender disconnected before the answer", outcome,
                     extra={"source": src.name, "outcome": outcome})
            return None
        except DatabaseUnavailable as exc:
            self._deps.metrics.db_up.set(0)
            return self._reject(src.name, 503, "database unavailable", str(exc), level=logging.WARNING)
        except QueryError as exc:
            # the database answers but did not store it (a statement or lock timeout, say):
            # nothing was written, and 503 is the one answer the contract has for it
            return self._reject(src.name, 503, "database unavailable", str(exc), level=logging.WARNING)
        self._deps.metrics.db_up.set(1)

        elapsed = time.perf_counter() - started
        self._deps.metrics.intake_seconds.labels(src.name).observe(elapsed)
        extra: dict[str, Any] = {"source": src.name, "duration_ms": round(elapsed * 1000, 2)}
        if event_id is None:
            self._deps.metrics.events.labels(src.name, "duplicate").inc()
            log.info("webhook duplicate", extra={**extra, "outcome": "duplicate"})
            return _DUPLICATE

        self._deps.metrics.events.labels(src.name, "accepted").inc()
        if self._admission is not None:
            self._admission.stored(jobs, created)
        if created > handed:
            self._deps.doorbell.set()  # in-process workers wake now instead of at their next poll
        extra.update(event_id=event_id, outcome="accepted", count=created)
        if parse_error is None:
            log.info("webhook accepted: event %d, %d job(s)", event_id, created, extra=extra)
        else:
            log.warning(
                "webhook stored without jobs, its body did not parse (replay it once fixed): event %d",
                event_id, extra={**extra, "error": parse_error},
            )
        return Answer(202, b'{"id":%d,"jobs":%d}' % (event_id, created))

    async def _admission_refusal(self, src: Source, jobs: Sequence[NewJob], deadline: float) -> Answer | None:
        """503 for a full backlog, 429 for a recipient at its cap (autom/admission.py), else None;
        ``DatabaseUnavailable`` if counting a recipient's jobs takes past ``deadline``."""
        if self._admission is None:
            return None
        refusal = self._admission.backlog_refusal(src) or await self._admission.recipient_refusal(jobs, deadline)
        if refusal is None:
            return None
        self._admission.refuse(refusal.reason, src.name, refusal.message)
        self._deps.metrics.events.labels(src.name, "rejected").inc()
        return error_answer(refusal.status, refusal.message, refusal.retry_after)

    async def _parse(
        self, src: Source, headers: Headers, body: bytes, text: str
    ) -> tuple[str | None, list[NewJob], str | None]:
        """``(dedup_key, jobs, parse_error)`` of a verified body; never raises but Cancelled."""
        try:
            if len(body) > _PARSE_IN_THREAD_BYTES:
                parsed = await trio.to_thread.run_sync(src.parse, headers, text)
            else:
                parsed = src.parse(headers, text)
            jobs = list(parsed.jobs)
            registry = self._deps.registry
            # a job the source left without max_attempts gets its kind's (the App's handler)
            return parsed.dedup_key, jobs if registry is None else registry.with_defaults(jobs), None
        except ParseError as exc:
            error = str(exc)
        except Exception as exc:
            # A bug in a source must not lose a verified delivery: store it without jobs
            # (replayable once fixed), as for a body that does not parse.
            log.exception("source %s failed to parse a verified body", src.name, extra={"source": src.name})
            error = f"{type(exc).__name__} in {src.name}.parse"
        try:
            dedup_key = src.dedup_key(headers, body)
        except Exception:  # documented never to raise; a bug here costs only redelivery detection
            log.exception("source %s failed to find a dedup key", src.name, extra={"source": src.name})
            dedup_key = None
        return dedup_key, [], error

    def _reject(self, source: str, status: int, message: str, reason: str, level: int = logging.INFO) -> Answer:
        """Count and log a refused delivery of a known source, and answer ``{"error": message}``."""
        self._deps.metrics.events.labels(source, "rejected").inc()
        log.log(level, "webhook rejected (%d): %s", status, reason,
                extra={"source": source, "outcome": "rejected", "error": reason})
        return error_answer(status, message)


def request_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI header pairs as a dict: names lower-cased, repeated headers joined by ``", "``.

    Values are UTF-8 when they decode as such, else Latin-1 (HTTP's historical
    charset), so any byte sequence becomes storable text.
    """
    headers: dict[str, str] = {}
    for raw_name, raw_value in raw:
        name = raw_name.decode("latin-1").lower()
        try:
            value = raw_value.decode("utf-8")
        except UnicodeDecodeError:
            value = raw_value.decode("latin-1")
        previous = headers.get(name)
        headers[name] = value if previous is None else f"{previous}, {value}"
    return headers
