"""Operations: what an operator reads and fixes, shared by the CLI, the admin API and the console.

Jobs will fail: list and filter them, see every attempt's error, retry one or
every failed job a filter matches, cancel one that should not run, replay an
event, pause a kind whose handler is broken, and see the queue at a glance.
No path ends in "use the other command": a done job is replayed through its
event, and a replay always creates the event's jobs anew.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from autom.db.bounded import QUERY_CANCELED, fetch_all_bounded
from autom.db.bridge import Database
from autom.db.queries import Q
from autom.errors import Conflict, NotFound, QueryError
from autom.events.replay import JobDefaults, fetch_event, replay_event
from autom.jobs import health
from autom.jobs.store import JobStore
from autom.sources import replay_sources
from autom.sources.base import Source

if TYPE_CHECKING:
    from autom.app import Registry

#: through what an operator acted (the audit trail): the console, the admin API, the CLI
Via = Literal["console", "api", "cli"]

JOB_STATUSES = ("pending", "running", "done", "failed", "cancelled")
#: statuses a single job may be retried from (README, Operations: `autom retry JOB_ID`)
RETRYABLE = ("failed", "cancelled", "pending")
#: a bulk retry takes at most this many jobs per call (run it again for more) ...
BULK_RETRY_CAP = 10_000
#: ... in statements of this many rows, so no statement locks a big part of the table
BULK_RETRY_BATCH = 500
#: longest a kind, recipient or source filter (or a paused kind) may be
MAX_NAME = 200
#: the most per-kind counts of a bulk retry's confirm page past their cap that are estimated (one EXPLAIN each)
MAX_ESTIMATES = 20

#: How many jobs a list (ops_list_jobs, ops_list_failed) matches: its own statement, counted
#: with ``limit`` = the cap (the list's walk, stopped there) and, past it, estimated by the
#: planner (EXPLAIN with ``limit`` = ``_NO_LIMIT``: the rows it expects, none read).
_COUNT_OF = {q: f"select count(*) as n from (\n{q.rstrip(';')}\n) c" for q in (Q.ops_list_jobs, Q.ops_list_failed)}
_ESTIMATE_OF = {q: f"explain (format json)\n{q}" for q in (Q.ops_list_jobs, Q.ops_list_failed)}
_NO_LIMIT = 2**62

_AGAIN = "try again in a moment"
#: What an operator is told about a query error, by SQLSTATE (code, then class prefix): the kind of
#: trouble and what helps, never the SQL text or the data in the server's message. Every one is
#: worth trying again in a moment (wider than ``QueryError.transient``, which code uses to retry
#: at once: a server out of resources or restarting may well be fine by the time a person tries).
#: The one table for the CLI, the admin API and the console (``autom.web.errors``).
_QUERY_ERRORS = {
    "55P03": ("a row or table it needs is locked by another transaction (lock timeout)", _AGAIN),
    # the console's reads run with a short statement timeout: a filter that scans too much ends here
    QUERY_CANCELED: ("the query was cancelled (statement timeout)",
              f"narrow the filter (a kind, a status, a time range) or {_AGAIN}"),
    "40001": ("it conflicted with another transaction", _AGAIN),
    "40P01": ("it conflicted with another transaction (deadlock)", _AGAIN),
    "53": ("the database is out of resources", _AGAIN),
    "57P": ("the database is shutting down or restarting", _AGAIN),
}


def query_error_message(exc: QueryError) -> str:
    """One line for an operator about a failed query (the API's and the console's 503, the CLI's exit 1).

    Lock and statement timeouts, conflicts and a restarting server say what helps
    (``_QUERY_ERRORS``); anything else names its SQLSTATE. Never the SQL or the
    server's message, which can quote row data.
    """
    state = exc.sqlstate or ""
    known = _QUERY_ERRORS.get(state) or _QUERY_ERRORS.get(state[:3]) or _QUERY_ERRORS.get(state[:2])
    if known is None:
        return f"database error: the query failed (SQLSTATE {state or 'unknown'})"
    reason, advice = known
    return f"database busy: {reason}; {advice}"


def parse_run_at(raw: str, now: datetime) -> datetime:
    """When a rescheduled job may run: ``now``, or an ISO 8601 time (no zone = UTC), in UTC.

    ``ValueError`` with a one-line reason otherwise (an age such as ``6h`` is refused: it
    would mean six hours ago).
    """
    text = raw.strip()
    if text.lower() == "now":
        return now
    try:
        when = datetime.fromisoformat(text)
        return when.astimezone(UTC) if when.tzinfo is not None else when.replace(tzinfo=UTC)
    except OverflowError:
        raise ValueError("is out of range (years 1 to 9999)") from None
    except ValueError:
        raise ValueError('must be "now" or an ISO 8601 time (2026-12-01T09:30:00Z)') from None


def job_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as the admin API and ``--json`` show it (times in ISO 8601)."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


def _attempt_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """One ``attempt_log`` entry: CONTRACT's ``started``/``ended``, and the same times as
    ``started_at``/``ended_at``, the names the API gave them before (deprecated, kept for
    clients written against them)."""
    entry = job_json(row)
    entry["started_at"], entry["ended_at"] = entry["started"], entry["ended"]
    return entry


# "PermanentError: telegram sendMessage: HTTP 400 Bad Request: chat not found"
# (autom.checks.check, through autom.jobs.retry.describe); telegram.py adds "ok=false".
_WRAPPED = re.compile(r"^(?P<wrapper>\w+: .+?: HTTP \d{3})(?: ok=false)? (?P<description>.+)$")


def error_headline(error: str | None) -> str:
    """``last_error`` with the external API's own description first, the wrapper after it.

    "PermanentError: telegram sendMessage: HTTP 400 Bad Request: chat not found"
    reads "Bad Request: chat not found (PermanentError: telegram sendMessage: HTTP
    400)": cut to a terminal's width, the part that says what went wrong stays.
    Other texts come back unchanged (whitespace collapsed).
    """
    text = " ".join((error or "").split())
    match = _WRAPPED.match(text)
    if match is None:
        return text
    return f"{match['description']} ({match['wrapper']})"


#: What would act on a screen instead of showing: C0/C1 controls but tab and line ends (a
#: terminal's escape sequences), bidi controls (U+202E turns the rest of a line around),
#: zero-width space, line/paragraph separators, and unpaired surrogates (UTF-8 cannot hold them).
_HIDDEN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e"
                     r"\u2060-\u2069\ufeff\ud800-\udfff]")
#: ... and, for one line of a terminal's table, tab and line ends too
_HIDDEN_IN_LINE = re.compile(_HIDDEN.pattern.replace("[", "[\\t\\n\\r", 1))


def visible(text: str, *, one_line: bool = False) -> str:
    """``text`` with every character that would act on the screen (``_HIDDEN``) shown escaped instead.

    ESC becomes ``\\x1b``, U+202E ``\\u202e``, a lone surrogate ``\\ud800``: what stored text
    holds stays readable, and never reorders, clears or colours what follows it.
    ``one_line``: tab and line ends are escaped too (a row of a terminal's table).
    """
    return (_HIDDEN_IN_LINE if one_line else _HIDDEN).sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a list is about; ``None`` = any. ``since``/``until`` bound created_at,
    ``failed_since`` finished_at (a list of failed jobs: "failed since")."""

    # alike in shape with FailedFilter and Job's optional fields, not in meaning: each filter
    # holds exactly the named parameters of its own queries (asdict is the parameters)
    status: str | None = None
    kind: str | None = None
    recipient: str | None = None
    event_id: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    failed_since: datetime | None = None

    def params(self) -> dict[str, Any]:
        """The filter as the named parameters of ``ops_list_jobs``."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class BulkRetry:
    """What ``retry_failed`` did: ``retried`` jobs are pending again; ``skipped`` had left
    ``failed`` meanwhile; ``more`` is true when the cap stopped it (run it again)."""

    retried: list[int]
    skipped: int
    more: bool

    def as_json(self) -> dict[str, Any]:
        """The admin API's answer."""
        return {"retried": len(self.retried), "skipped": self.skipped, "more": self.more, "ids": self.retried}


@dataclass(frozen=True)
class Capped:
    """A count that stopped at ``cap``, never a made-up exact number: "1,000+", or with the
    planner's ``estimate`` (rows it expects, from its statistics) "about 45,000"."""

    n: int
    cap: int
    estimate: int | None = None

    @property
    def capped(self) -> bool:
        """Whether the real number may be larger."""
        return self.n >= self.cap

    @property
    def estimated(self) -> bool:
        """Whether it is said as an estimate: capped, and the planner expects more than the cap."""
        return self.capped and self.estimate is not None and self.estimate > self.cap

    @property
    def value(self) -> int:
        """The best number known: exact, the estimate, or the cap (a lower bound)."""
        return self.estimate if self.estimated and self.estimate is not None else self.n

    def __str__(self) -> str:
        if self.estimated:
            return f"about {about(self.value):,}"
        return f"{self.cap:,}+" if self.capped else f"{self.n:,}"


def _plan_rows(plan: Any) -> int | None:
    """The rows EXPLAIN (FORMAT JSON) says its top node returns; None when it says no such thing."""
    try:
        if isinstance(plan, str):
            plan = json.loads(plan)
        return int(plan[0]["Plan"]["Plan Rows"])
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def about(n: int) -> int:
    """``n`` to two significant digits (943,512 → 940,000): an estimate said without false precision."""
    digits = len(str(abs(n)))
    return n if digits <= 2 else int(round(n, 2 - digits))


@dataclass(frozen=True)
class FailedFilter:
    """Which failed jobs a bulk retry takes; ``None`` = any. ``since`` bounds when they failed,
    ``created_since``/``created_until`` when they were created (a console list's own range)."""

    kind: str | None = None
    recipient: str | None = None
    since: datetime | None = None
    event_id: int | None = None
    created_since: datetime | None = None
    created_until: datetime | None = None

    def params(self) -> dict[str, Any]:
        """The filter as the named parameters of ``ops_failed_ids`` and ``ops_count_failed``."""
        return dataclasses.asdict(self)

    def as_list(self) -> JobFilter:
        """The Failed list these jobs are (the console's ``/ui/jobs?status=failed&...``)."""
        return JobFilter(status="failed", kind=self.kind, recipient=self.recipient, event_id=self.event_id,
                         since=self.created_since, until=self.created_until, failed_since=self.since)


@dataclass(frozen=True)
class FailedCount:
    """What a bulk retry would take: ``total`` and how many of each kind, most first, each
    exact up to the cap and past it the planner's estimate ("about N"), as the lists say it."""

    total: Capped
    by_kind: list[tuple[str, Capped]]


class Operations:
    """Reads and fixes over one database.

    Replays parse with every known source (``replay_sources``), enabled or not: a
    stored event was verified when it arrived, and parsing it needs no secret.
    """

    def __init__(self, db: Database, sources: Mapping[str, Source] | None = None, *,
                 defaults: JobDefaults | None = None) -> None:
        self.db = db
        self.sources = replay_sources() if sources is None else sources
        #: fills in what a replayed job's producer left open (its kind's max_attempts: the App's)
        self.defaults = defaults
        self.store = JobStore(db)
        #: the App's registry (None: the built-ins and table kinds say which kinds exist)
        self.registry: Registry | None = None

    @classmethod
    def of(cls, db: Database, registry: Registry | None) -> Operations:
        """Operations for a running App (None: the built-ins only): replays parse with its
        sources too and give its kinds' ``max_attempts``, as the intake does."""
        if registry is None:
            return cls(db)
        ops = cls(db, registry.replay_sources(), defaults=registry.with_defaults)
        ops.registry = registry
        return ops

    # -- jobs ------------------------------------------------------------------------------

    async def list_jobs(
        self, filt: JobFilter | None = None, *, limit: int = 50, before: int | None = None,
        before_at: datetime | None = None, statement_seconds: float | None = None,
    ) -> list[dict]:
        """The newest jobs matching ``filt``, older than id ``before`` (keyset paging).

        Failed jobs (``filt.status`` failed) come newest failure first; their cursor is the
        last row's ``finished_at`` (``before_at``) and id (``before_at`` None: that job's own).

        ``statement_seconds``: how long the query may run (``QueryError`` 57014 past it); the
        console passes one, the CLI and the admin API keep the pool's backstop.
        """
        filt = filt or JobFilter()
        params = {**filt.params(), "limit": limit, "before": before, "before_at": before_at}
        # failed jobs newest failure first (the on-call question: what broke just now?)
        sql = Q.ops_list_failed if filt.status == "failed" else Q.ops_list_jobs
        if statement_seconds is None:
            rows = await self.db.fetch_all(sql, params)
        else:
            rows = await fetch_all_bounded(self.db, sql, params, seconds=statement_seconds)
        return [job_json(r) for r in rows]

    async def count_jobs(self, filt: JobFilter | None, cap: int, statement_seconds: float) -> Capped:
        """How many jobs ``filt`` matches: exact up to ``cap``, past it with the planner's estimate."""
        filt = filt or JobFilter()
        sql = Q.ops_list_failed if filt.status == "failed" else Q.ops_list_jobs
        params = {**filt.params(), "before": None, "before_at": None}
        rows = await fetch_all_bounded(self.db, _COUNT_OF[sql], {**params, "limit": cap}, seconds=statement_seconds)
        n = int(rows[0]["n"]) if rows else 0
        return Capped(n, cap, await self._estimate(filt) if n >= cap else None)

    async def _estimate(self, filt: JobFilter) -> int | None:
        """How many jobs the planner expects ``filt`` to match (EXPLAIN of its list: no row read)."""
        sql = Q.ops_list_failed if filt.status == "failed" else Q.ops_list_jobs
        params = {**filt.params(), "before": None, "before_at": None, "limit": _NO_LIMIT}
        return _plan_rows(await self.db.fetch_val(_ESTIMATE_OF[sql], params))

    async def failed_jobs(self, limit: int = 20) -> list[dict]:
        """The latest failed jobs, most recent failure first."""
        return [job_json(r) for r in await self.db.fetch_all(Q.ops_failed_jobs, {"limit": limit})]

    async def get_job(self, job_id: int) -> dict:
        """One job with its ``attempt_log``; ``NotFound`` if there is none with that id.

        The log has one entry per attempt: the ones that did not end done come from
        ``job_attempts`` (written by a trigger on ``jobs``); the attempt running
        now, or the one that ended done, from the job row itself.
        """
        row = await self.db.fetch_one(Q.ops_get_job, {"id": job_id})
        if row is None:
            raise NotFound(f"no job with id {job_id}")
        log = [_attempt_json(a) for a in await self.db.fetch_all(Q.ops_job_attempts, {"id": job_id})]
        claimed = row.pop("claimed_at")
        run_log = row.pop("run_log", None)
        row.pop("last_traceback", None)
        if row["status"] in ("running", "done") and row["attempts"] > 0:
            log.append(_attempt_json({
                "attempt": len(log) + 1, "started": claimed,
                "ended": row["finished_at"] if row["status"] == "done" else None,
                "outcome": row["status"], "error": None, "traceback": None,
                "log": run_log if row["status"] == "done" else None,
            }))
        job = job_json(row)
        job["attempt_log"] = log
        job["actions"] = await self.actions_on(f"job:{job_id}")
        return job

    # -- the audit trail -------------------------------------------------------------------

    async def record_action(self, via: Via, action: str, target: str | None = None,
                            detail: Mapping[str, Any] | None = None) -> None:
        """Record one operator action (``via``: console, api or cli; ``target``: ``job:ID``,
        ``event:ID``, ``kind:K``, ``recipient:R`` or None; ``detail``: JSON-able extras)."""
        await self.db.execute(Q.ops_record_action, {
            "via": via, "action": action, "target": target,
            "detail": json.dumps(dict(detail), default=str) if detail is not None else None})

    async def audit(self, limit: int = 50) -> list[dict]:
        """The operator actions, newest first."""
        return [job_json(r) for r in await self.db.fetch_all(Q.ops_audit, {"limit": limit})]

    async def actions_on(self, target: str) -> list[dict]:
        """The operator actions on one target (``job:ID``), oldest first."""
        return [job_json(r) for r in await self.db.fetch_all(Q.ops_target_actions, {"target": target})]

    async def retry_job(self, job_id: int, *, via: Via | None = None) -> dict:
        """Put a failed, cancelled (or pending) job back in the queue now with its attempts reset.

        ``Conflict`` for a running or done job (replay its event instead), ``NotFound``
        for an unknown id.
        """
        rows = await self.db.fetch_all(Q.ops_retry_jobs, {"ids": [job_id], "statuses": list(RETRYABLE)})
        if not rows:
            job = await self.get_job(job_id)
            hint = f"replay event {job['event_id']} to run its jobs again as new jobs" if job["event_id"] else \
                "it has no event to replay: enqueue a new job"
            if job["status"] == "running":
                hint = f"it runs now and is retried by itself if it fails; or {hint}"
            raise Conflict(f"job {job_id} is {job['status']}: only a failed, cancelled or pending job can be "
                           f"retried ({hint})")
        if via is not None:
            await self.record_action(via, "retry", f"job:{job_id}")
        return job_json(rows[0])

    async def cancel_job(self, job_id: int, *, running: bool = True, via: Via | None = None) -> dict:
        """A pending job (also one waiting for its retry) ends ``cancelled``; so does a running one
        (``running``), whose handler its worker cancels within about a second (no retry, no alert).
        ``Conflict`` for other statuses, ``NotFound`` for an unknown id."""
        statuses = ["pending", "running"] if running else ["pending"]
        row = await self.db.fetch_one(Q.ops_cancel_job, {"id": job_id, "statuses": statuses})
        if row is None:
            job = await self.get_job(job_id)
            which = "a pending or running job" if running else "a pending job (also one waiting for its retry)"
            raise Conflict(f"job {job_id} is {job['status']}: only {which} can be cancelled")
        row.pop("was", None)
        if via is not None:
            await self.record_action(via, "cancel", f"job:{job_id}")
        return job_json(row)

    async def reschedule_job(self, job_id: int, run_at: datetime, *, via: Via | None = None) -> dict:
        """A pending job (also one waiting for its retry) runs not before ``run_at`` (its retry delay
        is cleared); ``Conflict`` for any other status, ``NotFound`` for an unknown id."""
        row = await self.db.fetch_one(Q.ops_reschedule_job, {"id": job_id, "run_at": run_at})
        if row is None:
            job = await self.get_job(job_id)
            raise Conflict(f"job {job_id} is {job['status']}: only a pending job (also one waiting for its "
                           "retry) can be rescheduled")
        if via is not None:
            await self.record_action(via, "reschedule", f"job:{job_id}", {"run_at": run_at.isoformat()})
        return job_json(row)

    async def count_failed(self, filt: FailedFilter | None = None, *, cap: int,
                           statement_seconds: float | None = None) -> FailedCount:
        """How many failed jobs ``retry_failed(filt)`` would match (it takes ``BULK_RETRY_CAP`` a round), per
        kind: each exact up to ``cap``, past it the planner's estimate, as ``count_jobs`` says a list's."""
        filt = filt or FailedFilter()
        params = {**filt.params(), "cap": cap}
        if statement_seconds is None:
            rows = await self.db.fetch_all(Q.ops_count_failed, params)
        else:
            rows = await fetch_all_bounded(self.db, Q.ops_count_failed, params, seconds=statement_seconds)
        listed = filt.as_list()
        by_kind: list[tuple[str, Capped]] = []
        for row in rows:
            n = int(row["n"])
            # past the cap, the planner's estimate of this kind's share (the first MAX_ESTIMATES kinds)
            estimate = (await self._estimate(dataclasses.replace(listed, kind=row["kind"]))
                        if n >= cap and len(by_kind) < MAX_ESTIMATES else None)
            by_kind.append((str(row["kind"]), Capped(n, cap, estimate)))
        by_kind.sort(key=lambda kc: (-kc[1].value, kc[0]))  # most first, estimates included
        n = sum(c.n for _, c in by_kind)
        capped = any(c.capped for _, c in by_kind)
        # the total as the list of these jobs says it: exact, else the planner's estimate of the whole filter
        total = Capped(n, n, await self._estimate(listed)) if capped else Capped(n, n + 1)
        return FailedCount(total, by_kind)

    async def retry_failed(self, filt: FailedFilter | None = None, *, cap: int = BULK_RETRY_CAP,
                           batch: int = BULK_RETRY_BATCH, via: Via | None = None) -> BulkRetry:
        """Retry every failed job ``filt`` matches (each of its fields optional).

        At most ``cap`` jobs per call, in statements of ``batch`` rows, oldest first;
        a job that left ``failed`` meanwhile (retried or deleted by someone else) is
        counted in ``skipped``.
        """
        ids = [r["id"] for r in await self.db.fetch_all(
            Q.ops_failed_ids, {**(filt or FailedFilter()).params(), "limit": cap + 1})]
        more = len(ids) > cap
        ids = ids[:cap]
        retried: list[int] = []
        for start in range(0, len(ids), batch):
            chunk = ids[start:start + batch]
            rows = await self.db.fetch_all(Q.ops_retry_jobs, {"ids": chunk, "statuses": ["failed"]})
            retried.extend(r["id"] for r in rows)
        if via is not None:
            # filtered to one recipient: its target, so the recipient's timeline shows it
            target = f"recipient:{filt.recipient}" if filt is not None and filt.recipient else None
            await self.record_action(via, "bulk_retry", target, {
                **{k: v for k, v in (filt or FailedFilter()).params().items() if v is not None},
                "retried": len(retried)})
        return BulkRetry(retried=retried, skipped=len(ids) - len(retried), more=more)

    # -- kinds -----------------------------------------------------------------------------

    async def known_kinds(self) -> list[str]:
        """The kinds a handler serves: the App's (the service, or the CLI with AUTOM_APP); without
        one, the built-ins and every kind a replica's App registered at its start (table kinds)."""
        if self.registry is not None:
            return sorted(self.registry.handlers)
        from autom.handlers import builtin_handlers

        rows = await self.db.fetch_all(Q.ops_known_kinds)
        return sorted(set(builtin_handlers()) | {str(r["kind"]) for r in rows})

    async def pause_kind(self, kind: str, *, via: Via | None = None) -> bool:
        """Pause ``kind`` (its jobs stay pending, on every replica); False if it was paused already.

        ``NotFound`` for a kind no handler serves (a misspelt kind would pause nothing).
        """
        known = await self.known_kinds()
        if kind not in known:
            raise NotFound(f"no handler serves kind {visible(kind, one_line=True)!r}: nothing to pause "
                           f"(kinds: {', '.join(known)})")
        paused = await self.db.fetch_one(Q.ops_pause_kind, {"kind": kind}) is not None
        if via is not None:
            await self.record_action(via, "pause", f"kind:{kind}")
        return paused

    async def resume_kind(self, kind: str, *, via: Via | None = None) -> bool:
        """Resume ``kind``; False if it was not paused (``NotFound`` if it is neither paused nor served)."""
        if await self.db.fetch_one(Q.ops_resume_kind, {"kind": kind}) is not None:
            if via is not None:
                await self.record_action(via, "resume", f"kind:{kind}")
            return True  # also a kind no handler serves any more: its pause can always be lifted
        known = await self.known_kinds()
        if kind not in known:
            raise NotFound(f"no handler serves kind {visible(kind, one_line=True)!r} and it is not paused "
                           f"(kinds: {', '.join(known)})")
        return False

    async def paused_kinds(self) -> list[dict]:
        """The paused kinds, with when each was paused."""
        return [job_json(r) for r in await self.db.fetch_all(Q.ops_paused_kinds)]

    # -- recipients ------------------------------------------------------------------------

    async def recipient(self, recipient: str, *, before: int | None = None, limit: int = 50,
                        statement_seconds: float | None = None) -> dict[str, Any]:
        """A recipient's state and story: ``{"recipient", "paused", "paused_at", "blocked", "blocked_at",
        "timeline", "next_before"}``; the timeline covers its ``limit`` newest jobs before job id ``before``
        (their creation, attempts, finish and events, newest first); ``next_before`` pages on (None: the end)."""
        from autom.limits import blocked_chat

        params = {"recipient": recipient, "before": before, "limit": limit}
        if statement_seconds is None:
            rows = await self.db.fetch_all(Q.ops_recipient_timeline, params)
        else:
            rows = await fetch_all_bounded(self.db, Q.ops_recipient_timeline, params, seconds=statement_seconds)
        state = await self.db.fetch_one(Q.ops_recipient_state, {"recipient": recipient})
        blocked = await blocked_chat(self.db, recipient)
        timeline = [job_json({k: v for k, v in r.items() if v is not None}) for r in rows]
        jobs = [r["job_id"] for r in rows if r["type"] == "job"]
        paused_at = state["paused_at"] if state else None
        return {
            "recipient": recipient, "paused": paused_at is not None,
            "paused_at": paused_at.isoformat() if paused_at else None,
            "blocked": blocked is not None,
            "blocked_at": blocked["blocked_at"].isoformat() if blocked else None,
            "timeline": timeline,
            "next_before": min(jobs) if len(jobs) == limit else None,
        }

    async def pause_recipient(self, recipient: str, *, via: Via | None = None) -> None:
        """Workers of every replica skip ``recipient``'s jobs (they stay pending) until it is resumed."""
        await self.db.fetch_one(Q.ops_recipient_pause, {"recipient": recipient})
        if via is not None:
            await self.record_action(via, "recipient_pause", f"recipient:{recipient}")

    async def resume_recipient(self, recipient: str, *, via: Via | None = None) -> bool:
        """``recipient``'s jobs are claimed again; False if it was not paused."""
        resumed = await self.db.fetch_one(Q.ops_recipient_resume, {"recipient": recipient}) is not None
        if via is not None:
            await self.record_action(via, "recipient_resume", f"recipient:{recipient}", {"changed": resumed})
        return resumed

    async def purge_recipient(self, recipient: str, *, via: Via | None = None) -> int:
        """Every pending job of ``recipient`` ends ``cancelled`` (never runs, no alert); how many."""
        n = int(await self.db.fetch_val(Q.ops_recipient_purge, {"recipient": recipient}) or 0)
        if via is not None:
            await self.record_action(via, "recipient_purge", f"recipient:{recipient}", {"cancelled": n})
        return n

    # -- events ----------------------------------------------------------------------------

    async def get_event(self, event_id: int) -> dict:
        """One stored event with the ids of its jobs; ``NotFound`` if there is none."""
        return job_json(await fetch_event(self.db, event_id))

    async def list_events(
        self, *, source: str | None = None, since: datetime | None = None, until: datetime | None = None,
        before: int | None = None, limit: int = 50, statement_seconds: float | None = None,
    ) -> list[dict]:
        """The newest events (no bodies: their size), optionally of one source and time range."""
        params = {"source": source, "since": since, "until": until, "before": before, "limit": limit}
        if statement_seconds is None:
            rows = await self.db.fetch_all(Q.ops_list_events, params)
        else:
            rows = await fetch_all_bounded(self.db, Q.ops_list_events, params, seconds=statement_seconds)
        return [job_json(r) for r in rows]

    async def replay_event(self, event_id: int, *, via: Via | None = None) -> list[int]:
        """Parse a stored event again and create its jobs anew; the ids created (``autom.events.replay_event``)."""
        created = await replay_event(self.store, self.sources, event_id, defaults=self.defaults)
        if via is not None:
            await self.record_action(via, "replay", f"event:{event_id}", {"jobs": created})
        return created

    # -- the numbers -----------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """Counts by status and kind, queue lag, failures in the last hour, paused kinds."""
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
            "paused_kinds": [r["kind"] for r in await self.paused_kinds()],
        }

    async def overview_counts(self, cap: int, statement_seconds: float) -> dict[str, dict[str, Capped]]:
        """Jobs per kind and status, each count exact up to ``cap``, past it with the planner's statistics'
        estimate, read in the same statement (the console's overview): "1,000+" where they have none."""
        rows = await fetch_all_bounded(self.db, Q.ops_overview_counts, {"cap": cap}, seconds=statement_seconds)
        counts: dict[str, dict[str, Capped]] = {}
        for row in rows:
            n, estimate = int(row["n"]), row["estimate"]
            counts.setdefault(row["kind"], {})[row["status"]] = Capped(
                n, cap, int(estimate) if n >= cap and estimate is not None else None)
        return counts

    async def throughput(self, minutes: int, statement_seconds: float) -> list[dict]:
        """Done and failed jobs per minute over the last ``minutes`` minutes (rows: minute, status, n)."""
        return await fetch_all_bounded(self.db, Q.ops_throughput, {"minutes": minutes}, seconds=statement_seconds)

    async def failed_by_kind(self, minutes: int, statement_seconds: float) -> list[dict]:
        """Kinds with jobs that failed for good in the last ``minutes`` minutes, most failures first."""
        return await fetch_all_bounded(self.db, Q.ops_failed_by_kind, {"minutes": minutes}, seconds=statement_seconds)

    async def health(self, statement_seconds: float) -> dict[str, Any]:
        """Queue lag, unsent alerts and the last heartbeat, for the overview."""
        # the lag as autom.jobs.health defines it (its query), bounded like every console read
        lag = await fetch_all_bounded(self.db, Q.health_queue_lag, None, seconds=statement_seconds)
        alerts = await fetch_all_bounded(self.db, Q.ops_unsent_alerts, None, seconds=statement_seconds)
        beat = await fetch_all_bounded(self.db, Q.ops_heartbeat, None, seconds=statement_seconds)
        return {
            "queue_lag_seconds": float(lag[0]["lag"] or 0.0) if lag else 0.0,
            "unsent_alerts": int(alerts[0]["count"]) if alerts else 0,
            # the oldest unsent alert: its job, failed tries and next try (None when none waits)
            "oldest_unsent": alerts[0] if alerts and alerts[0]["job_id"] is not None else None,
            "last_heartbeat": beat[0]["updated_at"] if beat else None,
        }

    async def event_jobs(self, job_ids: Sequence[int]) -> list[dict]:
        """The jobs of an event (ids from ``get_event``), oldest first."""
        if not job_ids:
            return []
        rows = await self.db.fetch_all(Q.ops_jobs_by_ids, {"ids": list(job_ids)})
        return [job_json(r) for r in rows]
