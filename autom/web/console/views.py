"""The console's routes (see the package docstring for the pages and the rules they keep)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlencode

from quart import Blueprint, Response, g, request

from autom.admission import retry_after
from autom.db.queries import Q
from autom.deps import Deps
from autom.errors import DatabaseUnavailable, NotFound, QueryError
from autom.ops import BULK_RETRY_CAP, JOB_STATUSES, FailedFilter, Operations, error_headline, visible
from autom.web import errors
from autom.web import params as p
from autom.web.console import present
from autom.web.console.auth import COOKIE, SKEW_SECONDS, Session, Sessions, cross_site
from autom.web.console.pages import (
    ACTION_WORDS,
    NOTICES,
    RETRY_EVERY,
    RETRY_FILTER,
    SECURITY_HEADERS,
    echo,
    html,
    https,
    kind_notice,
    query_string,
    recipient_notice,
    redirect,
    render,
    retry_all_link,
    retry_echo,
    safe_next,
)
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

JOB_PAGE = {**p.JOB_FILTERS, "before": p.ident, "before_at": p.when, "limit": p.limit(MAX_PAGE)}
EVENT_PAGE = {**p.EVENT_FILTERS, "before": p.ident, "limit": p.limit(MAX_PAGE)}
RECIPIENT_PAGE = {"before": p.ident, "limit": p.limit(MAX_PAGE)}

#: what a page shows in place of its content when its route raised: ``page(status, message)``
ErrorPage = Callable[[int, str], Awaitable[Response]]


def console_blueprint(deps: Deps) -> Blueprint:
    """The blueprint serving ``/ui/...`` for ``deps``."""
    bp = Blueprint("console", __name__, url_prefix="/ui")
    console = Console(deps)
    bp.before_request(console.guard)
    bp.after_request(console.secure)
    errors.register(bp, console.error_answer, deps.metrics, log, for_people=True)
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
    """The console's routes bound to one ``Deps``.

    A route raises what goes wrong (``BadParameter``, ``NotFound``, ``Conflict``, a
    database error); ``error_answer`` shows it (``autom.web.errors``): the message page,
    or the route's own page with the error above its form (``_on_error``).
    """

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
        session = await self._live_session()
        if session is None:
            target = request.full_path.rstrip("?") if request.method == "GET" else ""
            query = f"?{urlencode({'next': target})}" if safe_next(target) else ""
            return redirect(f"/ui/login{query}", 303 if request.method == "POST" else 302)
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

    async def error_answer(self, status: int, message: str, headers: dict[str, str]) -> Response:
        """The answer to an error a route raised (``autom.web.errors``): the page the route named
        for it (``_on_error``), else the message page."""
        own: ErrorPage | None = g.get("console_error_page")
        response = await (own(status, message) if own is not None else self._error(status, message))
        response.headers.update(headers)
        return response

    async def css(self) -> Response:
        """The one stylesheet (a static file of the package)."""
        response = Response(self._css, content_type="text/css; charset=utf-8")
        response.headers["Cache-Control"] = "public, max-age=3600"
        return response

    # -- login ------------------------------------------------------------------------------

    async def login_page(self) -> Response:
        """``GET /ui/login``: the form (a valid session goes straight on)."""
        nxt = request.args.get("next", "")
        try:
            live = await self._live_session()
        except (DatabaseUnavailable, QueryError):
            live = None  # the form, then; logging in says what is wrong
        if live is not None:
            return redirect(nxt if safe_next(nxt) else "/ui/", 302)
        return await self._render("login.html", next=nxt if safe_next(nxt) else "", error=None,
                                  disabled=self._sessions is None)

    async def login(self) -> Response:
        """``POST /ui/login``: check ``token``; set the session cookie, or say no (rate-limited)."""
        form = await request.form
        nxt = form.get("next", "")
        nxt = nxt if safe_next(nxt) else ""
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
            response.headers["Retry-After"] = str(seconds)
            return response
        if not self._sessions.token_matches(str(form.get("token", ""))):
            self._lockout.failed(client, "console: failed login")
            return await self._render("login.html", 401, next=nxt, disabled=False,
                                      error="That is not the ADMIN_TOKEN.")
        log.info("console: login from %s", visible(client, one_line=True))
        await self._note("login")
        response = redirect(nxt or "/ui/", 303)
        response.set_cookie(COOKIE, self._sessions.issue(self._clock()), max_age=int(self._sessions.lifetime),
                            path="/ui/", secure=https(), httponly=True, samesite="Strict")
        return response

    async def logout(self) -> Response:
        """``POST /ui/logout``: the session ends on the server (its cookie, replayed, is no session), and
        the browser forgets the cookie."""
        session: Session = g.console_session
        assert self._sessions is not None
        self._on_error(lambda status, message: self._error(status, f"Not logged out: {message}"))
        await self._deps.db.execute(Q.console_end_session, {
            "name": _ended(session), "until": datetime.fromtimestamp(session.issued + self._sessions.lifetime
                                                                     + SKEW_SECONDS, UTC)})
        log.info("console: logout")
        await self._note("logout")
        response = redirect("/ui/login", 303)
        response.delete_cookie(COOKIE, path="/ui/", secure=https(), httponly=True, samesite="Strict")
        return response

    # -- pages ------------------------------------------------------------------------------

    async def overview(self) -> Response:
        """``GET /ui/``: the queue at a glance; every part that timed out shows "—"."""
        q = p.parse_query(request.args.items(multi=True), {"refresh": p.limit(3600), "notice": p.text, "seal": p.text})
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
            kinds=kinds or [], retry_every=RETRY_EVERY,
            refresh=refresh, refresh_choices=REFRESH,
            lag=present.age(health["queue_lag_seconds"]) if health else "—",
            heartbeat_age=present.age((now - beat).total_seconds()) if beat else None,
            notice=kind_notice(self._told("notice", q["notice"], q["seal"])), updated=now,
        )

    async def jobs(self) -> Response:
        """``GET /ui/jobs``: filtered, newest first, keyset pages."""
        self._on_error(lambda status, message: self._render(
            "jobs.html", status, jobs=[], error=message, filters=echo(request.args), statuses=JOB_STATUSES,
            next_page=None, limit=PAGE))
        q = p.parse_query(request.args.items(multi=True), JOB_PAGE)
        limit, filt = q["limit"] or PAGE, p.job_filter(q)
        jobs = await self._ops.list_jobs(filt, limit=limit, before=q["before"], before_at=q["before_at"],
                                         statement_seconds=QUERY_SECONDS)
        for job in jobs:
            job["headline"] = error_headline(job.get("last_error"))
        # how many match: exact up to COUNT_CAP, then the planner's estimate ("about N"); "—" if it timed out
        total = await self._maybe(self._ops.count_jobs(filt, COUNT_CAP, QUERY_SECONDS)) if jobs else None
        next_page = None
        if len(jobs) == limit:
            # failed jobs page by (finished_at, id): the cursor carries both
            last = jobs[-1]
            at = last["finished_at"] if q["status"] == "failed" else None
            next_page = query_string(request.args, before=str(last["id"]), before_at=at)
        return await self._render("jobs.html", jobs=jobs, error=None, filters=echo(request.args),
                                  statuses=JOB_STATUSES, next_page=next_page, limit=limit, total=total,
                                  first_page=query_string(request.args, before=None, before_at=None)
                                  if q["before"] else None,
                                  retry_all=retry_all_link(request.args, q), retry_every=RETRY_EVERY)

    async def job(self, job_id: str) -> Response:
        """``GET /ui/jobs/{id}``: everything about one job, with Retry / Cancel where allowed."""
        q = p.parse_query(request.args.items(multi=True), {"notice": p.text, "seal": p.text})
        job = await self._ops.get_job(p.ident("job id", job_id))
        return await self._render(
            "job.html", job=job, payload=present.pretty_json(job.get("payload")),
            headline=error_headline(job.get("last_error")),
            notice=NOTICES.get(self._told("notice", q["notice"], q["seal"]) or ""),
            can_retry=job["status"] in ("failed", "cancelled", "pending"),
            can_cancel=job["status"] in ("pending", "running"),
        )

    async def retry(self, job_id: str) -> Response:
        """``POST /ui/jobs/{id}/retry``: back in the queue; then the job's page."""
        return await self._job_action(job_id, self._ops.retry_job, "retried", "put back in the queue")

    async def cancel(self, job_id: str) -> Response:
        """``POST /ui/jobs/{id}/cancel``: cancelled; then the job's page."""
        return await self._job_action(job_id, self._ops.cancel_job, "cancelled", "cancelled")

    async def _job_action(self, raw: str, op: Callable[..., Awaitable[Any]], notice: str, done: str) -> Response:
        ident = p.ident("job id", raw)
        await op(ident, via="console")
        self._deps.doorbell.set()  # a retried job may run now; a cancelled one may free its recipient's next
        log.info("console: job %d %s", ident, done, extra={"job_id": ident})
        return redirect(self._sealed(f"/ui/jobs/{ident}", "notice", notice), 303)

    async def reschedule(self, job_id: str) -> Response:
        """``POST /ui/jobs/{id}/reschedule`` (field run_at: ``now`` or an ISO 8601 time); then the job's page."""
        form = await request.form
        ident = p.ident("job id", job_id)
        run_at = p.run_at("run at", str(form.get("run_at", "")))
        await self._ops.reschedule_job(ident, run_at, via="console")
        self._deps.doorbell.set()
        log.info("console: job %d rescheduled", ident, extra={"job_id": ident})
        return redirect(self._sealed(f"/ui/jobs/{ident}", "notice", "rescheduled"), 303)

    async def _note(self, action: str) -> None:
        """Record a login or logout in the audit trail; a database away does not stop either."""
        try:
            await self._ops.record_action("console", action)
        except (DatabaseUnavailable, QueryError) as exc:
            log.warning("console: %s not recorded in the audit trail: %s", action, errors.message(exc))

    async def audit(self) -> Response:
        """``GET /ui/audit``: the operator actions, newest first (``?limit=``)."""
        self._on_error(lambda status, message: self._render("audit.html", status, actions=[], error=message))
        q = p.parse_query(request.args.items(multi=True), {"limit": p.limit(MAX_PAGE)})
        actions = await self._ops.audit(q["limit"] or PAGE)
        return await self._render("audit.html", actions=actions, error=None)

    async def events(self) -> Response:
        """``GET /ui/events``: by source and time, newest first, keyset pages."""
        sources = sorted(self._deps.sources)
        self._on_error(lambda status, message: self._render(
            "events.html", status, events=[], error=message, filters=echo(request.args), next_page=None,
            sources=sources))
        q = p.parse_query(request.args.items(multi=True), EVENT_PAGE)
        limit = q["limit"] or PAGE
        events = await self._ops.list_events(source=q["source"], since=q["since"], until=q["until"],
                                             before=q["before"], limit=limit, statement_seconds=QUERY_SECONDS)
        next_page = query_string(request.args, before=str(events[-1]["id"])) if len(events) == limit else None
        return await self._render("events.html", events=events, error=None, filters=echo(request.args),
                                  next_page=next_page, sources=sources,
                                  first_page=query_string(request.args, before=None) if q["before"] else None)

    async def event(self, event_id: str) -> Response:
        """``GET /ui/events/{id}``: headers, body (JSON and raw), its jobs, Replay."""
        q = p.parse_query(request.args.items(multi=True), {"created": p.text, "seal": p.text})
        event = await self._ops.get_event(p.ident("event id", event_id))
        jobs = await self._ops.event_jobs(event["job_ids"])
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

    async def replay(self, event_id: str) -> Response:
        """``POST /ui/events/{id}/replay``: its jobs created anew; then the event's page listing them."""
        ident = p.ident("event id", event_id)
        created = await self._ops.replay_event(ident, via="console")
        if created:
            self._deps.doorbell.set()
        log.info("console: event %d replayed, %d job(s) created", ident, len(created), extra={"event_id": ident})
        return redirect(self._sealed(f"/ui/events/{ident}", "created", ",".join(map(str, created)) or "none"), 303)

    async def retry_failed_page(self) -> Response:
        """``GET /ui/retry-failed?kind=&recipient=&since=...``: how many would be retried, per kind (exact up
        to ``COUNT_CAP``, then "about N" as the lists say it), and the button."""
        q = p.parse_query(request.args.items(multi=True), RETRY_FILTER)
        count = await self._ops.count_failed(FailedFilter(**q), cap=COUNT_CAP, statement_seconds=QUERY_SECONDS)
        return await self._render("retry_failed.html", count=count, filters=retry_echo(request.args),
                                  result=None, cap=BULK_RETRY_CAP, count_cap=COUNT_CAP)

    async def retry_failed(self) -> Response:
        """``POST /ui/retry-failed`` (the confirm page's filters): retry them in batches; say how many."""
        form = await request.form
        q = p.parse_query(((k, v) for k, v in form.items(multi=True) if k != "csrf"), RETRY_FILTER)
        result = await self._ops.retry_failed(FailedFilter(**q), cap=BULK_RETRY_CAP, via="console")
        if result.retried:
            self._deps.doorbell.set()
        log.info("console: retried %d failed job(s), skipped %d", len(result.retried), result.skipped)
        return await self._render("retry_failed.html", count=None, filters=retry_echo(form), result=result,
                                  cap=BULK_RETRY_CAP)

    async def recipient(self, recipient: str) -> Response:
        """``GET /ui/recipients/{r}``: its timeline (events, jobs, attempts, finishes), newest first, in
        pages of its jobs; Pause / Resume / Purge."""
        q = p.parse_query(request.args.items(multi=True), {**RECIPIENT_PAGE, "notice": p.text, "seal": p.text})
        name = p.text("recipient", recipient)
        story = await self._ops.recipient(name, before=q["before"], limit=q["limit"] or PAGE,
                                          statement_seconds=QUERY_SECONDS)
        for entry in story["timeline"]:
            entry["headline"] = error_headline(entry.get("error"))
        path = f"/ui/recipients/{quote(name, safe='')}"
        return await self._render(
            "recipient.html", r=story, path=path, action_words=ACTION_WORDS,
            retry_its_failed=f"{RETRY_EVERY}?{urlencode({'recipient': name})}",
            notice=recipient_notice(self._told("notice", q["notice"], q["seal"])),
            next_page=query_string(request.args, before=str(story["next_before"]), notice=None, seal=None)
            if story["next_before"] else None,
            first_page=path if q["before"] else None,
        )

    async def recipient_pause(self, recipient: str) -> Response:
        """``POST /ui/recipients/{r}/pause``: its jobs stay pending (every replica) until resumed."""
        name = p.text("recipient", recipient)
        await self._ops.pause_recipient(name, via="console")
        return self._recipient_told(name, "paused:")

    async def recipient_resume(self, recipient: str) -> Response:
        """``POST /ui/recipients/{r}/resume``: its jobs run again."""
        name = p.text("recipient", recipient)
        resumed = await self._ops.resume_recipient(name, via="console")
        self._deps.doorbell.set()
        return self._recipient_told(name, "resumed:" if resumed else "not-paused:")

    async def recipient_purge(self, recipient: str) -> Response:
        """``POST /ui/recipients/{r}/purge``: every pending job of it ends cancelled."""
        name = p.text("recipient", recipient)
        purged = await self._ops.purge_recipient(name, via="console")
        return self._recipient_told(name, f"purged:{purged}")

    def _recipient_told(self, name: str, told: str) -> Response:
        """Back to the recipient's page after an action, with its notice (``told``)."""
        log.info("console: recipient %s: %s", visible(name, one_line=True), told)
        return redirect(self._sealed(f"/ui/recipients/{quote(name, safe='')}", "notice", told), 303)

    async def pause(self) -> Response:
        """``POST /ui/kinds/pause`` (field kind)."""
        return await self._kind(pause=True)

    async def resume(self) -> Response:
        """``POST /ui/kinds/resume`` (field kind)."""
        return await self._kind(pause=False)

    async def _kind(self, *, pause: bool) -> Response:
        form = await request.form
        kind = p.text("kind", str(form.get("kind", "")).strip())
        if not kind:
            raise BadParameter("kind must not be empty")
        try:
            changed = await (self._ops.pause_kind(kind, via="console") if pause
                             else self._ops.resume_kind(kind, via="console"))
        except NotFound as exc:  # a kind no handler serves, typed into the form: a bad field, not a missing page
            raise BadParameter(str(exc)) from None
        if changed and not pause:
            self._deps.doorbell.set()
        log.info("console: kind %s %s", kind, "paused" if pause else "resumed", extra={"kind": kind})
        notice = ("paused" if changed else "already-paused") if pause else ("resumed" if changed else "not-paused")
        return redirect(self._sealed("/ui/", "notice", f"{notice}:{kind}"), 303)

    # -- helpers ----------------------------------------------------------------------------

    def _on_error(self, page: ErrorPage) -> None:
        """Show an error this request raises from now on with ``page`` (a list's form with the error above it)."""
        g.console_error_page = page

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

    async def _maybe(self, op: Awaitable[T]) -> T | None:
        """``await op``, or None when the database could not answer in time (the page shows "—")."""
        try:
            return await op
        except (DatabaseUnavailable, QueryError) as exc:
            log.warning("console: a part of the overview is not shown: %s", errors.message(exc))
            return None

    async def _render(self, template: str, status: int = 200, **context: Any) -> Response:
        session: Session | None = g.get("console_session")
        csrf = self._sessions.csrf_token(session) if session is not None and self._sessions else ""
        return html(render(template, csrf=csrf, logged_in=session is not None, **context), status)

    async def _error(self, status: int, message: str) -> Response:
        return await self._render("message.html", status, code=status, message=message)


def _ended(session: Session) -> str:
    """The ``service_state`` row that says ``session`` was logged out."""
    return f"console session ended {session.nonce}"
