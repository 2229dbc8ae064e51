"""``POST /hooks/{source}``: verify a webhook delivery, store it and its jobs in one transaction.

The checks run in CONTRACT.md's order, and nothing is written unless all pass:

1. 404 the source is unknown or not enabled (its secret is unset);
2. 413 the body is larger than MAX_BODY_BYTES (by Content-Length at once, or
   mid-stream for a chunked body: Quart's ``MAX_CONTENT_LENGTH``);
3. 401 the source's verification fails;
4. 400 the verified body is not UTF-8 text, or holds a NUL character
   (PostgreSQL ``text`` cannot store one, and ``events.body`` is the exact body);
5. 503 the database is unavailable;
6. 202 ``{"id": N, "jobs": K}``, or 202 ``{"duplicate": true}`` for a redelivery.

The body is parsed into jobs *before* the database hop, and the hop is one
statement (``intake_store`` in queries_intake.sql) that inserts the event, its
jobs and their recipients' rows: atomic on its own, so one round trip with no
BEGIN/COMMIT trips, and a pooled connection held for milliseconds. (The first
version ran ``insert_jobs_sync`` inside ``db.run``, four round trips; the single
statement halved the hop's CPU time and latency, bench/RESULTS.md, Intake.)

Group commit (``StoreBatcher``): deliveries that arrive while a hop is in flight
wait for it to end, then go together in the next hop, ``intake_store_many``:
one statement, one transaction, one commit for the batch (the process's CPU per
hop, not PostgreSQL, limits the intake's rate). Each delivery still gets its own
answer, and only once the batch is committed. The batch stores its deliveries
one after the other, so a redelivery inside a batch is a duplicate exactly as it
would be in separate transactions. If the batch fails because the database is
unreachable, nothing of it is stored and every delivery of it gets a 503; if it
fails for any other reason (a deadlock, say, or one delivery PostgreSQL
refuses), each delivery is stored on its own, as without batching, and gets its
own answer.
A verified body that does not parse is still stored, with no jobs: it is an
event we (or the sender) got wrong, and ``autom replay`` can make its jobs once
the parser is fixed.

Headers are stored with lower-cased names and without the secret-bearing ones
(the source's ``secret_headers``, plus Authorization, Cookie and
Proxy-Authorization), so the events table never holds a credential.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import trio
from quart import Blueprint, Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from autom.db.bridge import Database, Row
from autom.db.queries import Q
from autom.deps import Deps
from autom.errors import DatabaseUnavailable, VerificationError
from autom.jobs.models import NewJob
from autom.jobs.store import jobs_json
from autom.sources.base import Headers, ParseError, Source
from autom.web.responses import error_response, json_response

log = logging.getLogger("autom.intake")

#: Headers never stored whatever the source: they carry credentials.
ALWAYS_SECRET_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})

# Bodies above this are parsed in a worker thread: json.loads of a 1 MiB body takes
# milliseconds, which would stall every other request on the trio thread meanwhile.
_PARSE_IN_THREAD_BYTES = 64 * 1024

_DUPLICATE = {"duplicate": True}

#: Most deliveries stored by one hop (a batch waits for the one in flight, so it holds
#: about as many as arrived meanwhile: up to the number of concurrent senders).
MAX_BATCH = 64
#: Longest a batch's hop may take; it runs shielded from the cancellation of the request
#: that leads it (that sender gave up, the others did not). Beyond it: 503 for the batch.
BATCH_HOP_SECONDS = 10.0


def intake_blueprint(deps: Deps) -> Blueprint:
    """The blueprint serving ``POST /hooks/<source>`` for ``deps``."""
    bp = Blueprint("intake", __name__)
    intake = Intake(deps)
    bp.add_url_rule("/hooks/<source>", "hook", intake.receive, methods=["POST"])
    return bp


class Intake:
    """The webhook route and its bookkeeping (metrics, one log line per delivery)."""

    def __init__(self, deps: Deps) -> None:
        """Bind the route to ``deps`` (sources, database, metrics, doorbell)."""
        self._deps = deps
        self._max_body = deps.settings.max_body_bytes
        self._batcher = StoreBatcher(deps.db)

    async def receive(self, source: str) -> Response:
        """Handle one delivery to ``source`` (module docstring: checks, order, answers)."""
        started = time.perf_counter()
        src = self._deps.sources.get(source)
        if src is None:
            # not counted in the metrics: the label would be whatever a scanner sends
            log.info("webhook for an unknown source %s", ascii(source[:64]), extra={"outcome": "not_found"})
            return error_response(404, "unknown source")
        try:
            body: bytes = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        except RequestEntityTooLarge:
            return self._reject(src.name, 413, f"body larger than {self._max_body} bytes", "body too large")

        headers = request_headers(request.scope["headers"])
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
        stored = {k: v for k, v in headers.items() if k not in src.secret_headers and k not in ALWAYS_SECRET_HEADERS}
        params = store_params(src.name, stored, text, dedup_key, jobs)
        try:
            event_id, created = await self._batcher.store(params)
        except DatabaseUnavailable as exc:
            self._deps.metrics.db_up.set(0)
            return self._reject(src.name, 503, "database unavailable", str(exc), level=logging.WARNING)
        self._deps.metrics.db_up.set(1)

        elapsed = time.perf_counter() - started
        self._deps.metrics.intake_seconds.labels(src.name).observe(elapsed)
        extra: dict[str, Any] = {"source": src.name, "duration_ms": round(elapsed * 1000, 2)}
        if event_id is None:
            self._deps.metrics.events.labels(src.name, "duplicate").inc()
            log.info("webhook duplicate", extra={**extra, "outcome": "duplicate"})
            return json_response(202, _DUPLICATE)

        self._deps.metrics.events.labels(src.name, "accepted").inc()
        if created:
            self._deps.doorbell.set()  # in-process workers wake now instead of at their next poll
        extra.update(event_id=event_id, outcome="accepted", count=created)
        if parse_error is None:
            log.info("webhook accepted: event %d, %d job(s)", event_id, created, extra=extra)
        else:
            log.warning(
                "webhook stored without jobs, its body did not parse (replay it once fixed): event %d",
                event_id, extra={**extra, "error": parse_error},
            )
        return json_response(202, {"id": event_id, "jobs": created})

    async def _parse(
        self, src: Source, headers: Headers, body: bytes, text: str
    ) -> tuple[str | None, list[NewJob], str | None]:
        """``(dedup_key, jobs, parse_error)`` of a verified body; never raises but Cancelled."""
        try:
            if len(body) > _PARSE_IN_THREAD_BYTES:
                parsed = await trio.to_thread.run_sync(src.parse, headers, text)
            else:
                parsed = src.parse(headers, text)
            return parsed.dedup_key, list(parsed.jobs), None
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

    def _reject(self, source: str, status: int, answer: str, reason: str, level: int = logging.INFO) -> Response:
        """Count and log a refused delivery of a known source, and answer ``{"error": answer}``."""
        self._deps.metrics.events.labels(source, "rejected").inc()
        log.log(level, "webhook rejected (%d): %s", status, reason,
                extra={"source": source, "outcome": "rejected", "error": reason})
        return error_response(status, answer)


class _Delivery:
    """One delivery waiting in a ``StoreBatcher``: its parameters, then its outcome."""

    __slots__ = ("alone", "error", "lead", "outcome", "params", "taken", "wake")

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.wake = trio.Event()  # its batch is over, or it is to lead the next one
        self.lead = False  # it runs the next hop (for everyone queued)
        self.taken = False  # it is in a batch (in flight or done)
        self.alone = False  # its batch failed: it is to be stored on its own
        self.outcome: tuple[int | None, int] | None = None  # (event id or None for a duplicate, jobs)
        self.error: BaseException | None = None


class StoreBatcher:
    """Group commit of deliveries: one hop at a time, taking every delivery queued meanwhile.

    One hop at a time: a batch holds its recipients' row locks until it commits,
    and two batches of this process taking them in different orders could
    deadlock (PostgreSQL would break it after deadlock_timeout, 1 s, and the
    deliveries would then be stored one by one). Two hops at a time were no
    faster in bench/intake.py (RESULTS.md, Intake).

    ``await store(params)`` returns ``(event_id, jobs)`` once the delivery is
    committed, ``(None, 0)`` for a redelivery, or raises (``DatabaseUnavailable``
    for a 503). No task of its own: the first delivery to find no hop in flight runs
    one for everything queued (the *leader*); when it ends, the first delivery still
    queued is woken to lead the next. A delivery whose request is cancelled while it
    waits leaves the queue (nothing stored) unless its batch is already in flight.
    """

    def __init__(self, db: Database, max_batch: int = MAX_BATCH) -> None:
        """Store through ``db``, at most ``max_batch`` deliveries per hop."""
        self._db = db
        self._max_batch = max_batch
        self._queue: list[_Delivery] = []
        self._busy = False  # a hop is in flight, or a leader has been woken to run one
        #: hops run so far (a batch of many is one hop)
        self.hops_run = 0

    @property
    def queued(self) -> int:
        """Deliveries waiting for a hop (not counting those in a hop in flight)."""
        return len(self._queue)

    async def store(self, params: dict[str, Any]) -> tuple[int | None, int]:
        """Store one delivery (``store_params``); see the class docstring."""
        delivery = _Delivery(params)
        self._queue.append(delivery)
        if self._busy:
            try:
                await delivery.wake.wait()
            except BaseException:
                self._withdraw(delivery)
                raise
        else:
            self._busy = True
            delivery.lead = True
        if delivery.lead:
            await self._lead()
        if delivery.alone:
            return _outcome(await self._db.fetch_one(Q.intake_store, params, prepare=True))
        if delivery.error is not None:
            raise delivery.error
        assert delivery.outcome is not None
        return delivery.outcome

    async def _lead(self) -> None:
        batch = self._queue[: self._max_batch]
        del self._queue[: self._max_batch]
        for delivery in batch:
            delivery.taken = True
        self.hops_run += 1
        try:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + BATCH_HOP_SECONDS
                await self._hop(batch)
            if scope.cancelled_caught:
                timeout = DatabaseUnavailable(f"storing a batch took more than {BATCH_HOP_SECONDS:g} s")
                for delivery in batch:
                    if delivery.outcome is None and delivery.error is None:
                        delivery.error = timeout
        finally:
            for delivery in batch:
                delivery.wake.set()
            self._hand_over()

    async def _hop(self, batch: list[_Delivery]) -> None:
        """Store ``batch`` in one hop; set each delivery's outcome, error or ``alone``."""
        if len(batch) == 1:
            (delivery,) = batch
            try:
                delivery.outcome = _outcome(await self._db.fetch_one(Q.intake_store, delivery.params, prepare=True))
            except Exception as exc:
                delivery.error = exc
            return
        try:
            rows = await self._db.fetch_all(
                Q.intake_store_many, {"items": batch_items(d.params for d in batch)}, prepare=True)
        except DatabaseUnavailable as exc:
            for delivery in batch:  # nothing of the batch was stored: 503 for each
                delivery.error = DatabaseUnavailable(str(exc))
            return
        except Exception as exc:
            # Nothing of the batch was stored (one transaction). Whatever it was (a deadlock,
            # one delivery PostgreSQL refuses), each delivery gets the answer it would get alone.
            log.warning("a batch of %d deliveries failed (%s: %s); storing them one by one",
                        len(batch), type(exc).__name__, exc)
            for delivery in batch:
                delivery.alone = True
            return
        for delivery, row in zip(batch, rows, strict=True):
            event_id = row["event_id"]
            delivery.outcome = (None, 0) if event_id is None else (int(event_id), int(row["jobs_created"]))

    def _hand_over(self) -> None:
        """After a hop: wake the first queued delivery to lead the next one, or go idle."""
        if self._queue:
            leader = self._queue[0]
            leader.lead = True
            leader.wake.set()
        else:
            self._busy = False

    def _withdraw(self, delivery: _Delivery) -> None:
        """``delivery``'s request stopped waiting (cancelled)."""
        if delivery.taken:
            return  # its batch is in flight: stored or not, nobody waits for the answer
        self._queue.remove(delivery)
        if delivery.lead:
            self._hand_over()  # it was woken to lead, and never will


def _outcome(row: Row | None) -> tuple[int | None, int]:
    """``(event_id, jobs)`` of an ``intake_store`` row; ``(None, 0)`` for a redelivery."""
    return (None, 0) if row is None else (int(row["id"]), int(row["jobs"]))


def batch_items(batch: Iterable[Mapping[str, Any]]) -> str:
    """The ``%(items)s`` of ``intake_store_many``: the deliveries' ``store_params`` as one JSON array.

    The headers and jobs are JSON already (``store_params``) and go in as they are.
    """
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    return "[" + ",".join(
        f"[{dumps(p['source'])},{p['headers']},{dumps(p['body'])},{dumps(p['dedup_key'])},{p['jobs']}]"
        for p in batch
    ) + "]"


def store_params(
    source: str, headers: Mapping[str, str], body: str, dedup_key: str | None, jobs: Sequence[NewJob]
) -> dict[str, Any]:
    """The parameters of the ``intake_store`` statement (queries_intake.sql).

    Jobs travel as one JSON array (``jobs_json``, the queue's own encoding) rather
    than one typed array per column: psycopg adapts one text parameter much faster
    than six lists (measured: the hop's CPU time went from ~0.8 to ~0.65 ms).
    ``event_id`` is the new event's, set by the statement.
    """
    return {
        "source": source,
        "headers": json.dumps(headers, ensure_ascii=False),
        "body": body,
        "dedup_key": dedup_key,
        "jobs": jobs_json(jobs),
    }


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
