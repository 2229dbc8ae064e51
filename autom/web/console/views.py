"""The console's routes (see the package docstring for the pages and the rules they keep)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlencode

import jinja2
from markupsafe import Markup
from quart import Blueprint, Response, g, request

from autom.admission import retry_after
from autom.db.queries import Q
from autom.deps import Deps
from autom.errors import Conflict, DatabaseUnavailable, NotFound, QueryError
from autom.ops import BULK_RETRY_CAP, JOB_STATUSES, FailedFilter, JobFilter, Operations, error_headline, visible
from autom.web import params as p
from autom.web.console import present
from autom.web.console.auth import COOKIE, SKEW_SECONDS, Session, Sessions, cross_site
from autom.web.lockout import Lockout
from autom.web.params import BadParameter

log = logging.getLogger("autom.console")

T = TypeVar("T")

#: how long one console query may run before the page says "narrow the filter"
QUERY_SECONDS = 3.0
#: counts stop here and show "1,000+"
COUNT_CAP = 1000
#: rows per page: default and the most a client may ask for
PAGE = 50
MAX_PAGE = 200
#: the overview's opt-in auto-refresh periods (seconds); nothing else is accepted
REFRESH = (5, 10, 30, 60)

#: no script at all, styles only from our own stylesheet, forms only to ourselves
CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

JOB_FILTERS: dict[str, p.Parser] = {
    "status": p.status, "kind": p.text, "recipient": p.text, "event_id": p.ident, "since": p.when, "until": p.when,
    "failed_since": p.when,
}
JOB_PAGE = {**JOB_FILTERS, "before": p.ident, "before_at": p.when, "limit": p.limit(MAX_PAGE)}
EVENT_PAGE = {"source": p.text, "since": p.when, "until": p.when, "before": p.ident, "limit": p.limit(MAX_PAGE)}
#: a bulk retry's filters: the Failed list's own (since = failed since; created_since/_until = its created range)
RETRY_FILTER = {"kind": p.text, "recipient": p.text, "since": p.when, "event_id": p.ident,
                "created_since": p.when, "created_until": p.when}
#: what a redirect after an action may tell the page it lands on (never free text)
NOTICES = {
    "retried": "Put back in the queue: it runs as soon as a worker is free.",
    "cancelled": "Cancelled: it will not run. A running handler is stopped within about a second.",
    "rescheduled": "Rescheduled: it runs not before its new run time.",
}
#: ... on a recipient's page after its actions ("purged:N")
RECIPIENT_NOTICES = {
    "paused": "Paused: its jobs stay pending (every replica) until resumed.{}",
    "resumed": "Resumed: its jobs run again.{}",
    "not-paused": "It was not paused.{}",
    "purged": "Purged: {} pending job(s) cancelled.",
}
RECIPIENT_PAGE = {"before": p.ident, "limit": p.limit(MAX_PAGE)}
#: an operator action in a recipient's timeline (audit_log's action → what the page says)
ACTION_WORDS = {
    "retry": "Retried", "cancel": "Cancelled", "reschedule": "Rescheduled",
    "recipient_pause": "Paused", "recipient_resume": "Resumed", "recipient_purge": "Purged",
    "bulk_retry": "Its failed jobs retried",
}
#: ... after a pause or resume, naming the kind (the sealed notice is "paused:KIND")
KIND_NOTICES = {
    "paused": "Paused {}: its jobs stay pending until resumed.",
    "resumed": "Resumed {}: its jobs run again.",
    "already-paused": "{} was paused already.",
    "not-paused": "{} was not paused.",
}


def _shown(value: Any) -> Any:
    """What a template prints of ``value``: stored text with what would act on the screen escaped.

    A bidi override (U+202E) would turn the rest of its cell around, autom's own text
    included; an unpaired surrogate (from a JSON escape in an event body) cannot be
    sent as UTF-8 at all. Both, and control characters, show as ``\\u202e`` etc.
    """
    return visible(value) if isinstance(value, str) and not isinstance(value, Markup) else value


#: The console's own template environment (not the app's): the error pages render under
#: ROLE=worker too, where the console's blueprint is not registered. Everything is escaped
#: (autoescape) and shown visibly (``_shown``) before it is escaped.
TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("autom.web.console", "templates"), autoescape=True, finalize=_shown,
)
#: a value as one path segment of a link (``/ui/recipients/{{ r|pathpart }}``): every ``/``, ``?``, ``#`` escaped
TEMPLATES.filters["pathpart"] = lambda value: quote(str(value), safe="")


def render(template: str, **context: Any) -> str:
    """``template`` of the console rendered with ``context``."""
    return TEMPLATES.get_template(template).render(when=present.when, headline_of=error_headline, **context)


class PageError(Exception):
    """An answer other than the page: its status and one line for the person."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def console_blueprint(deps: Deps) -> Blueprint:
    """The blueprint serving ``/ui/...`` for ``deps``."""
    bp = Blueprint("console", __name__, url_prefix="/ui")
    console = Console(deps)
    bp.before_request(console.guard)
    bp.after_request(console.secure)
    rules: list[tuple[str, str, Callable[..., Awaitable[Any]], list[str]]] = [
        ("/static/console.css", "css", console.css, ["GET"]),
        ("/login", "login", console.login_page, ["GET"]),
        ("/login", "login_post", console.login, ["POST"]),
        ("/logout", "logout", console.logout, ["POST"]),
        ("/", "overview", console.overview, ["GET"]),
        ("/jobs", "jobs", console.jobs, ["GET"]),
        ("/jobs/<job_id>", "job", console.job, ["GET"]),
        ("/jobs/<job_id>/retry", "retry", console.retry, ["POST"]),
        ("/jobs/<job_id>/cancel", "cancel", console.cancel, ["POST"]),
        ("/jobs/<job_id>/reschedule", "reschedule", console.reschedule, ["POST"]),
        ("/events", "events", console.events, ["GET"]),
        ("/audit", "audit", console.audit, ["GET"]),
        ("/events/<event_id>", "event", console.event, ["GET"]),
        ("/events/<event_id>/replay", "replay", console.replay, ["POST"]),
        ("/retry-failed", "retry_failed", console.retry_failed_page, ["GET"]),
        ("/retry-failed", "retry_failed_post", console.retry_failed, ["POST"]),
        ("/kinds/pause", "pause", console.pause, ["POST"]),
        ("/recipients/<name:recipient>/pause", "recipient_pause", console.recipient_pause, ["POST"]),
        ("/recipients/<name:recipient>/resume", "recipient_resume", console.recipient_resume, ["POST"]),
        ("/recipients/<name:recipient>/purge", "recipient_purge", console.recipient_purge, ["POST"]),
        ("/recipients/<name:recipient>", "recipient", console.recipient, ["GET"]),
        ("/kinds/resume", "resume", console.resume, ["POST"]),
    ]
    for path, name, view, methods in rules:
        bp.add_url_rule(path, name, view, methods=methods)
    return bp


class Console:
    """The console's routes bound to one ``Deps``."""

    def __init__(self, deps: Deps, clock: Callable[[], float] = time.time) -> None:
        """Bind to ``deps``; ``clock`` is the wall clock (unix seconds) sessions are checked against."""
        self._deps = deps
        self._ops = Operations.of(deps.db, deps.registry)
        token = deps.settings.admin_token
        self._sessions = Sessions(token, deps.settings.console_session_hours * 3600) if token else None
        self._lockout = Lockout(deps, log)
        self._clock = clock
        self._css = resources.files("autom.web.console").joinpath("static", "console.css").read_bytes()

    # -- every request ------------------------------------------------------------------------

    async def guard(self) -> Response | None:
        """Before every console route: the session, then for a POST the origin and CSRF checks."""
        endpoint = (request.endpoint or "").rpartition(".")[2]
        if endpoint == "css":
            return None
        if request.method == "POST" and cross_site(
            request.headers.get("Sec-Fetch-Site"), request.headers.get("Origin"), request.headers.get("Host")
        ):
            log.warning("console: a cross-site POST to %s was refused", request.path)
            return await self._error(403, "Refused: this form was sent from another site.")
        if endpoint in ("login", "login_post"):
            return None
        try:
            session = await self._live_session()
        except (DatabaseUnavailable, QueryError) as exc:
            return await self._error(503, _db_message(exc))
        if session is None:
            target = request.full_path.rstrip("?") if request.method == "GET" else ""
            query = f"?{urlencode({'next': target})}" if _safe_next(target) else ""
            return _redirect(f"/ui/login{query}", 303 if request.method == "POST" else 302)
        g.console_session = session
        if request.method == "POST":
            form = await request.form
            assert self._sessions is not None
            if not self._sessions.csrf_ok(session, form.get("csrf")):
                log.warning("console: a POST to %s without a valid CSRF token was refused", request.path)
                return await self._error(403, "Refused: the form's security token is missing or wrong. "
                                              "Reload the page and try again.")
        return None

    async def secure(self, response: Response) -> Response:
        """After every console answer: the security headers (CSP without scripts, no framing, no caching)."""
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def css(self) -> Response:
        """The one stylesheet (a static file of the package)."""
        response = Response(self._css, content_type="text/css; charset=utf-8")
        response.headers["Cache-Control"] = "public, max-age=3600"
        return response

    # -- login ------------------------------------------------------------------------------

    async def login_page(self) -> Response | str:
        """``GET /ui/login``: the form (a valid session goes straight on)."""
        nxt = request.args.get("next", "")
        try:
            live = await self._live_session()
        except (DatabaseUnavailable, QueryError):
            live = None  # the form, then; logging in says what is wrong
        if live is not None:
            return _redirect(nxt if _safe_next(nxt) else "/ui/", 302)
        return await self._render("login.html", next=nxt if _safe_next(nxt) else "", error=None,
                                  disabled=self._sessions is None)

    async def login(self) -> Response | str:
        """``POST /ui/login``: check ``token``; set the session cookie, or say no (rate-limited)."""
        form = await request.form
        nxt = form.get("next", "")
        nxt = nxt if _safe_next(nxt) else ""
        if self._sessions is None:
            return await self._render("login.html", 403, next=nxt, error="The console is disabled: "
                                      "ADMIN_TOKEN is not set.", disabled=True)
        # the client as the door sees it (behind TRUSTED_PROXIES, whom X-Forwarded-For names):
        # its wrong tokens lock only it out, never the right token from anyone else
        client = self._lockout.client()
        wait = self._lockout.blocked_for(client)
        if wait > 0:
            self._lockout.note(client, "console: refused (429) a login from a client that keeps failing")
            seconds = retry_after(wait)
            response = await self._render("login.html", 429, next=nxt, disabled=False,
                                          error=f"Too many failed logins from your address: wait {seconds} s.")
            return _with_headers(response, {"Retry-After": str(seconds)})
        if not self._sessions.token_matches(str(form.get("token", ""))):
            self._lockout.failed(client, "console: failed login")
            return await self._render("login.html", 401, next=nxt, disabled=False,
                                      error="That is not the ADMIN_TOKEN.")
        log.info("console: login from %s", visible(client, one_line=True))
        await self._note("login")
        response = _redirect(nxt or "/ui/", 303)
        response.set_cookie(COOKIE, self._sessions.issue(self._clock()), max_age=int(self._sessions.lifetime),
                            path="/ui/", secure=_https(), httponly=True, samesite="Strict")
        return response

    async def logout(self) -> Response:
        """``POST /ui/logout``: the session ends on the server (its cookie, replayed, is no session), and
        the browser forgets the cookie."""
        session: Session = g.console_session
        assert self._sessions is not None
        try:
            await self._deps.db.execute(Q.console_end_session, {
                "name": _ended(session), "until": datetime.fromtimestamp(session.issued + self._sessions.lifetime
                                                                         + SKEW_SECONDS, UTC)})
        except (DatabaseUnavailable, QueryError) as exc:
            return await self._error(503, f"Not logged out: {_db_message(exc)}")
        log.info("console: logout")
        await self._note("logout")
        response = _redirect("/ui/login", 303)
        response.delete_cookie(COOKIE, path="/ui/", secure=_https(), httponly=True, samesite="Strict")
        return response

    # -- pages ------------------------------------------------------------------------------

    async def overview(self) -> Response | str:
        """``GET /ui/``: the queue at a glance; every part that timed out shows "—"."""
        try:
            q = p.parse_query(request.args.items(multi=True),
                              {"refresh": p.limit(3600), "notice": p.text, "seal": p.text})
        except BadParameter as exc:
            return await self._error(400, str(exc))
        refresh = q["refresh"] if q["refresh"] in REFRESH else None
        now = datetime.now(UTC)
        counts = await self._maybe(self._ops.overview_counts(COUNT_CAP, QUERY_SECONDS))
        rows = await self._maybe(self._ops.throughput(60, QUERY_SECONDS))
        failing = await self._maybe(self._ops.failed_by_kind(60, QUERY_SECONDS))
        health = await self._maybe(self._ops.health(QUERY_SECONDS))
        paused = await self._maybe(self._ops.paused_kinds())
        kinds = await self._maybe(self._ops.known_kinds())
        beat = health["last_heartbeat"] if health else None
        return await self._render(
            "overview.html",
            table=present.count_table(counts) if counts is not None else None,
            chart=present.throughput_chart(rows, now) if rows is not None else None,
            health=health, paused=paused, paused_names={r["kind"] for r in paused or []}, failing=failing,
            kinds=kinds or [],
            refresh=refresh, refresh_choices=REFRESH,
            lag=present.age(health["queue_lag_seconds"]) if health else "—",
            heartbeat_age=present.age((now - beat).total_seconds()) if beat else None,
            notice=_kind_notice(self._told("notice", q["notice"], q["seal"])), updated=now,
        )

    async def jobs(self) -> Response | str:
        """``GET /ui/jobs``: filtered, newest first, keyset pages."""
        try:
            q = p.parse_query(request.args.items(multi=True), JOB_PAGE)
        except BadParameter as exc:
            return await self._render("jobs.html", 400, jobs=[], error=str(exc), filters=_echo(request.args),
                                      statuses=JOB_STATUSES, next_page=None, limit=PAGE)
        limit = q["limit"] or PAGE
        filt = JobFilter(**{k: q[k] for k in JOB_FILTERS})
        try:
            jobs = await self._ops.list_jobs(filt, limit=limit, before=q["before"], before_at=q["before_at"],
                                             statement_seconds=QUERY_SECONDS)
        except (DatabaseUnavailable, QueryError) as exc:
            return await self._render("jobs.html", 503, jobs=[], error=_db_message(exc), filters=_echo(request.args),
                                      statuses=JOB_STATUSES, next_page=None, limit=limit)
        for job in jobs:
            job["headline"] = error_headline(job.get("last_error"))
        # how many match: exact up to COUNT_CAP, then the planner's estimate ("about N"); "—" if it timed out
        total = await self._maybe(self._ops.count_jobs(filt, COUNT_CAP, QUERY_SECONDS)) if jobs else None
        next_page = None
        if len(jobs) == limit:
            # failed jobs page by (finished_at, id): the cursor carries both
            last = jobs[-1]
            at = last["finished_at"] if q["status"] == "failed" else None
            next_page = _query_string(request.args, before=str(last["id"]), before_at=at)
        return await self._render("jobs.html", jobs=jobs, error=None, filters=_echo(request.args),
                                  statuses=JOB_STATUSES, next_page=next_page, limit=limit, total=total,
                                  first_page=_query_string(request.args, before=None, before_at=None)
                                  if q["before"] else None,
                                  retry_all=_retry_all_link(request.args, q))

    async def job(self, job_id: str) -> Response | str:
        """``GET /ui/jobs/{id}``: everything about one job, with Retry / Cancel where allowed."""
        try:
            q = p.parse_query(request.args.items(multi=True), {"notice": p.text, "seal": p.text})
            job = await self._call(self._ops.get_job(_ident(job_id, "job")))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        except BadParameter as exc:
            return await self._error(400, str(exc))
        return await self._render(
            "job.html", job=job, payload=present.pretty_json(job.get("payload")),
            headline=error_headline(job.get("last_error")),
            notice=NOTICES.get(self._told("notice", q["notice"], q["seal"]) or ""),
            can_retry=job["status"] in ("failed", "cancelled", "pending"),
            can_cancel=job["status"] in ("pending", "running"),
        )

    async def retry(self, job_id: str) -> Response | str:
        """``POST /ui/jobs/{id}/retry``: back in the queue; then the job's page."""
        try:
            ident = _ident(job_id, "job")
            await self._call(self._ops.retry_job(ident, via="console"))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        self._deps.doorbell.set()
        log.info("console: job %d put back in the queue", ident, extra={"job_id": ident})
        return _redirect(self._sealed(f"/ui/jobs/{ident}", "notice", "retried"), 303)

    async def cancel(self, job_id: str) -> Response | str:
        """``POST /ui/jobs/{id}/cancel``: cancelled; then the job's page."""
        try:
            ident = _ident(job_id, "job")
            await self._call(self._ops.cancel_job(ident, via="console"))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        self._deps.doorbell.set()
        log.info("console: job %d cancelled", ident, extra={"job_id": ident})
        return _redirect(self._sealed(f"/ui/jobs/{ident}", "notice", "cancelled"), 303)

    async def reschedule(self, job_id: str) -> Response | str:
        """``POST /ui/jobs/{id}/reschedule`` (field run_at: ``now`` or an ISO 8601 time); then the job's page."""
        form = await request.form
        try:
            ident = _ident(job_id, "job")
            run_at = p.run_at("run at", str(form.get("run_at", "")))
            await self._call(self._ops.reschedule_job(ident, run_at, via="console"))
        except BadParameter as exc:
            return await self._error(400, str(exc))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        self._deps.doorbell.set()
        log.info("console: job %d rescheduled", ident, extra={"job_id": ident})
        return _redirect(self._sealed(f"/ui/jobs/{ident}", "notice", "rescheduled"), 303)

    async def _note(self, action: str) -> None:
        """Record a login or logout in the audit trail; a database away does not stop either."""
        try:
            await self._ops.record_action("console", action)
        except (DatabaseUnavailable, QueryError) as exc:
            log.warning("console: %s not recorded in the audit trail: %s", action, _db_message(exc))

    async def audit(self) -> Response | str:
        """``GET /ui/audit``: the operator actions, newest first (``?limit=``)."""
        try:
            q = p.parse_query(request.args.items(multi=True), {"limit": p.limit(MAX_PAGE)})
        except BadParameter as exc:
            return await self._render("audit.html", 400, actions=[], error=str(exc))
        try:
            actions = await self._ops.audit(q["limit"] or PAGE)
        except (DatabaseUnavailable, QueryError) as exc:
            return await self._render("audit.html", 503, actions=[], error=_db_message(exc))
        return await self._render("audit.html", actions=actions, error=None)

    async def events(self) -> Response | str:
        """``GET /ui/events``: by source and time, newest first, keyset pages."""
        try:
            q = p.parse_query(request.args.items(multi=True), EVENT_PAGE)
        except BadParameter as exc:
            return await self._render("events.html", 400, events=[], error=str(exc), filters=_echo(request.args),
                                      next_page=None, sources=sorted(self._deps.sources))
        limit = q["limit"] or PAGE
        try:
            events = await self._ops.list_events(source=q["source"], since=q["since"], until=q["until"],
                                                 before=q["before"], limit=limit, statement_seconds=QUERY_SECONDS)
        except (DatabaseUnavailable, QueryError) as exc:
            return await self._render("events.html", 503, events=[], error=_db_message(exc),
                                      filters=_echo(request.args), next_page=None, sources=sorted(self._deps.sources))
        next_page = _query_string(request.args, before=str(events[-1]["id"])) if len(events) == limit else None
        return await self._render("events.html", events=events, error=None, filters=_echo(request.args),
                                  next_page=next_page, sources=sorted(self._deps.sources),
                                  first_page=_query_string(request.args, before=None) if q["before"] else None)

    async def event(self, event_id: str) -> Response | str:
        """``GET /ui/events/{id}``: headers, body (JSON and raw), its jobs, Replay."""
        try:
            q = p.parse_query(request.args.items(multi=True), {"created": p.text, "seal": p.text})
            event = await self._call(self._ops.get_event(_ident(event_id, "event")))
            jobs = await self._call(self._ops.event_jobs(event["job_ids"]))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        except BadParameter as exc:
            return await self._error(400, str(exc))
        # shown only after a replay of this session's (a crafted link shows nothing: it was not replayed)
        told = self._told("created", q["created"], q["seal"])
        created = [int(x) for x in (told or "").split(",") if x.isascii() and x.isdigit()][:100]
        for job in jobs:
            job["headline"] = error_headline(job.get("last_error"))
        return await self._render(
            "event.html", event=event, jobs=jobs, created=created, replayed=told is not None,
            headers=sorted((event.get("headers") or {}).items()), body_json=present.body_as_json(event["body"]),
            body=present.cut(event["body"]), body_bytes=len(event["body"].encode("utf-8")),
        )

    async def replay(self, event_id: str) -> Response | str:
        """``POST /ui/events/{id}/replay``: its jobs created anew; then the event's page listing them."""
        try:
            ident = _ident(event_id, "event")
            created = await self._call(self._ops.replay_event(ident, via="console"))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        if created:
            self._deps.doorbell.set()
        log.info("console: event %d replayed, %d job(s) created", ident, len(created), extra={"event_id": ident})
        return _redirect(self._sealed(f"/ui/events/{ident}", "created", ",".join(map(str, created)) or "none"), 303)

    async def retry_failed_page(self) -> Response | str:
        """``GET /ui/retry-failed?kind=&recipient=&since=...``: how many would be retried, per kind, and the button."""
        try:
            q = p.parse_query(request.args.items(multi=True), RETRY_FILTER)
            count = await self._call(self._ops.count_failed(FailedFilter(**q), cap=BULK_RETRY_CAP,
                                                            statement_seconds=QUERY_SECONDS))
        except BadParameter as exc:
            return await self._error(400, str(exc))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        return await self._render("retry_failed.html", count=count, filters=_retry_echo(request.args),
                                  result=None, cap=BULK_RETRY_CAP)

    async def retry_failed(self) -> Response | str:
        """``POST /ui/retry-failed`` (the confirm page's filters): retry them in batches; say how many."""
        form = await request.form
        try:
            q = p.parse_query(((k, v) for k, v in form.items(multi=True) if k != "csrf"), RETRY_FILTER)
            result = await self._call(self._ops.retry_failed(FailedFilter(**q), cap=BULK_RETRY_CAP, via="console"))
        except BadParameter as exc:
            return await self._error(400, str(exc))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        if result.retried:
            self._deps.doorbell.set()
        log.info("console: retried %d failed job(s), skipped %d", len(result.retried), result.skipped)
        return await self._render("retry_failed.html", count=None, filters=_retry_echo(form), result=result,
                                  cap=BULK_RETRY_CAP)

    async def recipient(self, recipient: str) -> Response | str:
        """``GET /ui/recipients/{r}``: its timeline (events, jobs, attempts, finishes), newest first, in
        pages of its jobs; Pause / Resume / Purge."""
        try:
            q = p.parse_query(request.args.items(multi=True), {**RECIPIENT_PAGE, "notice": p.text, "seal": p.text})
            name = p.text("recipient", recipient)
            story = await self._call(self._ops.recipient(name, before=q["before"], limit=q["limit"] or PAGE,
                                                         statement_seconds=QUERY_SECONDS))
        except BadParameter as exc:
            return await self._error(400, str(exc))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        told = self._told("notice", q["notice"], q["seal"]) or ""
        notice = RECIPIENT_NOTICES.get(told.partition(":")[0], "").format(told.partition(":")[2]) or None
        for entry in story["timeline"]:
            entry["headline"] = error_headline(entry.get("error"))
        path = f"/ui/recipients/{quote(name, safe='')}"
        return await self._render(
            "recipient.html", r=story, path=path, notice=notice, action_words=ACTION_WORDS,
            next_page=_query_string(request.args, before=str(story["next_before"]), notice=None, seal=None)
            if story["next_before"] else None,
            first_page=path if q["before"] else None,
        )

    async def recipient_pause(self, recipient: str) -> Response | str:
        """``POST /ui/recipients/{r}/pause``: its jobs stay pending (every replica) until resumed."""
        return await self._recipient_action(recipient, "pause")

    async def recipient_resume(self, recipient: str) -> Response | str:
        """``POST /ui/recipients/{r}/resume``: its jobs run again."""
        return await self._recipient_action(recipient, "resume")

    async def recipient_purge(self, recipient: str) -> Response | str:
        """``POST /ui/recipients/{r}/purge``: every pending job of it ends cancelled."""
        return await self._recipient_action(recipient, "purge")

    async def _recipient_action(self, raw: str, action: str) -> Response | str:
        try:
            name = p.text("recipient", raw)
            if action == "purge":
                purged = await self._call(self._ops.purge_recipient(name, via="console"))
                told = f"purged:{purged}"
            elif action == "pause":
                await self._call(self._ops.pause_recipient(name, via="console"))
                told = "paused:"
            else:
                resumed = await self._call(self._ops.resume_recipient(name, via="console"))
                told = "resumed:" if resumed else "not-paused:"
                self._deps.doorbell.set()
        except BadParameter as exc:
            return await self._error(400, str(exc))
        except PageError as exc:
            return await self._error(exc.status, str(exc))
        log.info("console: recipient %s: %s", visible(name, one_line=True), told)
        return _redirect(self._sealed(f"/ui/recipients/{quote(name, safe='')}", "notice", told), 303)

    async def pause(self) -> Response | str:
        """``POST /ui/kinds/pause`` (field kind)."""
        return await self._kind(pause=True)

    async def resume(self) -> Response | str:
        """``POST /ui/kinds/resume`` (field kind)."""
        return await self._kind(pause=False)

    async def _kind(self, *, pause: bool) -> Response | str:
        form = await request.form
        try:
            kind = p.text("kind", str(form.get("kind", "")).strip())
            if not kind:
                raise BadParameter("kind must not be empty")
            changed = await self._call(self._ops.pause_kind(kind, via="console") if pause
                                                else self._ops.resume_kind(kind, via="console"))
        except BadParameter as exc:
            return await self._error(400, str(exc))
        except PageError as exc:
            return await self._error(400 if exc.status == 404 else exc.status, str(exc))
        if changed and not pause:
            self._deps.doorbell.set()
        log.info("console: kind %s %s", kind, "paused" if pause else "resumed", extra={"kind": kind})
        notice = ("paused" if changed else "already-paused") if pause else ("resumed" if changed else "not-paused")
        return _redirect(self._sealed("/ui/", "notice", f"{notice}:{kind}"), 303)

    # -- helpers ----------------------------------------------------------------------------

    def _sealed(self, path: str, name: str, value: str) -> str:
        """``path?name=value&seal=...``: what a redirect after an action tells its page, sealed for this session."""
        assert self._sessions is not None
        query = urlencode({name: value})
        # sealed as the page will see its own path: decoded (a recipient's %2F is "/" there)
        return f"{path}?{query}&seal={self._sessions.seal(g.console_session, f'{unquote(path)}?{query}')}"

    def _told(self, name: str, value: str | None, seal: str | None) -> str | None:
        """``value`` of the query parameter ``name`` if this page's link was sealed for this session, else None."""
        session: Session | None = g.get("console_session")
        if value is None or session is None or self._sessions is None:
            return None
        text = f"{request.path}?{urlencode({name: value})}"
        return value if self._sessions.unsealed(session, text, seal) else None

    async def _live_session(self) -> Session | None:
        """The request's session: its cookie authentic and unexpired, and not logged out (one look-up).

        Raises ``DatabaseUnavailable`` or ``QueryError`` when the database cannot say.
        """
        if self._sessions is None:
            return None
        session = self._sessions.check(request.cookies.get(COOKIE), self._clock())
        if session is None or await self._deps.db.fetch_val(Q.console_session_ended, {"name": _ended(session)}):
            return None
        return session

    async def _call(self, op: Awaitable[T]) -> T:
        """``await op`` with autom's errors turned into ``PageError`` (404, 409, 503)."""
        try:
            return await op
        except NotFound as exc:
            raise PageError(404, str(exc)) from None
        except Conflict as exc:
            raise PageError(409, str(exc)) from None
        except (DatabaseUnavailable, QueryError) as exc:
            raise PageError(503, _db_message(exc)) from None

    async def _maybe(self, op: Awaitable[T]) -> T | None:
        """``await op``, or None when the database could not answer in time (the page shows "—")."""
        try:
            return await op
        except (DatabaseUnavailable, QueryError) as exc:
            log.warning("console: a part of the overview is not shown: %s", _db_message(exc))
            return None

    async def _render(self, template: str, status: int = 200, **context: Any) -> Response:
        session: Session | None = g.get("console_session")
        csrf = self._sessions.csrf_token(session) if session is not None and self._sessions else ""
        body = render(template, csrf=csrf, logged_in=session is not None, **context)
        return Response(body, status=status, content_type="text/html; charset=utf-8")

    async def _error(self, status: int, message: str) -> Response:
        return await self._render("message.html", status, code=status, message=message)


async def error_page(status: int, message: str) -> Response:
    """An HTML error answer for a ``/ui/`` path no console route serves (404, 405), with the security headers."""
    body = render("message.html", csrf="", logged_in=False, code=status, message=message)
    return Response(body, status=status, content_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


def _ended(session: Session) -> str:
    """The ``service_state`` row that says ``session`` was logged out."""
    return f"console session ended {session.nonce}"


def _ident(raw: str, what: str) -> int:
    try:
        return p.ident(f"{what} id", raw)
    except BadParameter as exc:
        raise PageError(400, str(exc)) from None


def _db_message(exc: Exception) -> str:
    """What the page says when the database did not answer: what really happened, and what helps."""
    if isinstance(exc, QueryError) and exc.sqlstate == "57014":
        return (f"The database did not answer within {QUERY_SECONDS:g} s: narrow the filter "
                "(a kind, a status, a time range) and try again.")
    if isinstance(exc, QueryError) and exc.sqlstate == "55P03":
        return ("A table or row this page reads is locked by another transaction (a migration, a VACUUM FULL, "
                "a long update): try again in a moment; a narrower filter would not help.")
    if isinstance(exc, QueryError):
        return f"The database refused the query (SQLSTATE {exc.sqlstate or 'unknown'}); try again in a moment."
    return "The database is unavailable; try again in a moment."


def _safe_next(target: str) -> bool:
    """Whether ``target`` is a console path to go back to after login (never another site)."""
    return (target.startswith("/ui/") and not target.startswith("/ui/login") and "//" not in target
            and "\\" not in target and len(target) < 2000 and target.isprintable())


def _https() -> bool:
    """Whether the client talks https to us, or to the proxy in front of us (which says so)."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.scheme == "https" or forwarded == "https"


def _echo(args: Mapping[str, str]) -> dict[str, str]:
    """The filter values to put back in the form (escaped by the template like everything else)."""
    return {k: str(v)[:300] for k, v in args.items()}


def _query_string(args: Any, **changes: str | None) -> str:
    """This page's query with ``changes`` (None removes a parameter)."""
    values = {k: v for k, v in args.items() if k not in changes and v != ""}
    values.update({k: v for k, v in changes.items() if v is not None})
    return urlencode(values)


def _kind_notice(told: str | None) -> str | None:
    """The overview's notice after a pause or resume (``paused:KIND``), naming the kind."""
    name, _, kind = (told or "").partition(":")
    return KIND_NOTICES[name].format(kind) if name in KIND_NOTICES and kind else None


#: a Failed list's filter → the bulk retry's field of the same meaning
_RETRY_KEEPS = {"kind": "kind", "recipient": "recipient", "event_id": "event_id", "failed_since": "since",
                "since": "created_since", "until": "created_until"}


def _retry_all_link(args: Mapping[str, str], q: Mapping[str, Any]) -> str | None:
    """The bulk-retry confirm page for exactly this list's filters, when it lists failed jobs."""
    if q["status"] != "failed":
        return None
    kept = {field: args[name] for name, field in _RETRY_KEEPS.items() if q[name] is not None and args.get(name)}
    return "/ui/retry-failed" + (f"?{urlencode(kept)}" if kept else "")


def _retry_echo(args: Mapping[str, str]) -> dict[str, str]:
    """The bulk retry's filters as given (to show and to send again), every field present."""
    return {name: str(args.get(name, ""))[:300] for name in RETRY_FILTER}


def _redirect(location: str, status: int) -> Response:
    """A redirect to one of our own paths (302 after a GET, 303 after a POST)."""
    return Response("", status=status, headers={"Location": location})


def _with_headers(response: Response, headers: Mapping[str, str]) -> Response:
    response.headers.update(headers)
    return response
