"""The composition root: builds ``Deps`` and runs the service (``run_service``, in ``main``).

::

    run_service
    ├── database pool     opened (and migrated) before anything serves
    ├── background        LISTEN autom_jobs → doorbell; alert sender (outbox); watchdog
    └── services          (started in order, each ready before the next)
        ├── schedule ticker
        ├── worker pool   (fetcher, runners, the one outcome writer: autom/worker/)
        └── hypercorn     /health /metrics /hooks /admin
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from zoneinfo import ZoneInfo

import trio
import trio_util

from autom import tracing
from autom.alerts import AlertSender
from autom.app import App, Registry
from autom.config import Settings
from autom.context import BoundedHTTP
from autom.db.bridge import open_database
from autom.db.migrate import apply_migrations
from autom.db.stats import first_analyze
from autom.deps import Deps
from autom.handlers.spec import Handler, HandlerSpec, handler_specs
from autom.jobs.retry import RetryPolicy
from autom.jobs.store import JobStore
from autom.limits import SendLimiter
from autom.schedule import Schedule, process_zone
from autom.sources import disabled_sources
from autom.telegram import open_telegram
from autom.ticker import run_ticker
from autom.watchdog import Watchdog
from autom.web import create_app, serve_http
from autom.worker import WorkerPool

log = logging.getLogger("autom")

NOTIFY_CHANNEL = "autom_jobs"

@dataclass
class Control:
    """How the outside (signals, tests) stops a running service."""

    shutdown: trio_util.AsyncBool = field(default_factory=lambda: trio_util.AsyncBool(False))
    pool: WorkerPool | None = None
    grace: float = 50.0

    def request_stop(self) -> None:
        """Phase 1: stop intake and claiming; running jobs get ``grace`` seconds."""
        if not self.shutdown.value:
            log.info("shutting down: draining (grace %gs)", self.grace)
        self.shutdown.value = True
        if self.pool is not None:
            self.pool.stop_at(trio.current_time() + self.grace)

    def stop_now(self) -> None:
        """Phase 2: cancel running jobs now (they go back to pending)."""
        log.warning("shutting down now: cancelling running jobs")
        self.shutdown.value = True
        if self.pool is not None:
            self.pool.cancel_now()


@dataclass
class Service:
    """A running service, as ``nursery.start(run_service, ...)`` returns it."""

    deps: Deps
    #: None under ROLE=intake (no workers)
    pool: WorkerPool | None
    urls: list[str]
    control: Control


def _notified(deps: Deps, pool: WorkerPool | None, payload: str) -> None:
    """A NOTIFY on autom_jobs: work may be due; 'cancel': a running job was cancelled (renew now to stop it)."""
    deps.doorbell.set()
    if payload == "cancel" and pool is not None:
        pool.renew_soon()


async def run_service(
    settings: Settings,
    *,
    control: Control | None = None,
    app: App | None = None,
    handlers: Mapping[str, Handler | HandlerSpec] | None = None,
    schedules: Sequence[Schedule] | None = None,
    binds: list[str] | None = None,
    telegram_log_only: bool | None = None,
    task_status: trio.TaskStatus[Service] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run everything until ``control.request_stop()`` and the drain finish.

    ``task_status.started(Service)`` is called once HTTP listens (``urls`` are the
    bound addresses: bind port 0 in tests). ``app``: the user's App (default: the
    built-in one); it is validated before the database is opened. ``handlers`` /
    ``schedules`` replace the App's whole set (tests and benches).

    ``settings.role`` picks the parts: ``all`` runs everything; ``intake`` only the
    database and hypercorn (no LISTEN, no alerts, no watchdog, no ticker, no pool);
    ``worker`` everything but the webhook and admin routes (hypercorn serves only
    /health and /metrics, ``create_app``).

    Shutdown: ``control.request_stop()`` sets ``deps.shutdown``, which closes the
    listener and stops claiming; running handlers get SHUTDOWN_GRACE_SECONDS, then are
    cancelled and their jobs released (``control.stop_now()``: at once).
    """
    tracing.setup()  # OpenTelemetry, if the otel extra and OTEL_* ask for it (autom/tracing.py)
    control = control or Control()
    control.grace = settings.shutdown_grace_seconds
    assert settings.database_url, "DATABASE_URL is checked by the CLI"
    registry = build_registry(settings, app, handlers, schedules)
    log.info("registered %s", registry.describe())
    tz = ZoneInfo(settings.tz) if settings.tz else process_zone()
    # pool_timeout: while the database is down, a call (a webhook's 503, a claim) gives
    # up after 1 s instead of the default 5 s. Under load, calls queue on the pool's
    # limiter (one slot per connection), not on this timeout.
    # An intake-only replica runs no workers, so it needs no connection for them: 8 serve
    # the intake's group commit (one hop at a time), /health, /metrics and /admin.
    works = settings.role in ("all", "worker")
    async with open_database(
        settings.database_url, min_size=2, max_size=(settings.workers if works else 0) + 8, name="autom",
        pool_timeout=1.0,
    ) as db:
        applied = await apply_migrations(db, app.user_migrations() if app is not None else ())
        if applied:
            log.info("applied %d migrations", len(applied))
        async with (
            open_telegram(settings, log_only=telegram_log_only) as telegram,
            BoundedHTTP(deadline=settings.http_timeout_seconds) as http,
        ):
            if not telegram.log_only:  # Telegram's limits, shared with every replica (autom/limits.py)
                telegram.limiter = SendLimiter.from_settings(db, settings)
            store = JobStore(
                db,
                lease_seconds=settings.job_lease_seconds,
                retry=RetryPolicy(base=settings.retry_base_seconds, cap=settings.retry_max_seconds),
                max_defer_seconds=settings.max_defer_seconds,
            )
            # each kind's max_attempts, for jobs enqueued from outside (autom_enqueue)
            await store.register_kinds({kind: spec.max_attempts for kind, spec in registry.handlers.items()})
            deps = Deps(
                settings=settings, db=db, store=store, sources=registry.sources,
                telegram=telegram, shutdown=control.shutdown, registry=registry, http=http,
            )
            if telegram.limiter is not None:
                telegram.limiter.metrics = deps.metrics  # its waits are counted, not logged each
            if settings.role != "worker":  # said once at start, not as "unknown source" at each delivery
                for name, setting in disabled_sources(settings).items():
                    log.info("source %s is disabled: POST /hooks/%s answers 404 until %s is set", name, name, setting)
            # ROLE: intake = HTTP only; worker = workers, schedule, alerts and watchdog,
            # with HTTP serving only /health and /metrics (create_app); all = both.
            pool = WorkerPool(deps, registry.handlers) if works else None
            control.pool = pool
            if pool is not None and telegram.limiter is not None:
                telegram.limiter.on_due = pool.due_in  # a chat's next job, moved to the chat's next slot
            if pool is not None and settings.role == "all":
                deps.handoff = pool  # the intake hands a lone delivery's job to it (autom/events/handoff.py)
            alerts = AlertSender(deps) if works else None
            async with trio.open_nursery() as background:
                # every role writes jobs (intake) or recipients (worker): whichever runs
                # first gives them planner statistics early (autom/db/stats.py)
                background.start_soon(first_analyze, db)
                if alerts is not None:
                    await background.start(db.listen, NOTIFY_CHANNEL, partial(_notified, deps, pool))
                    background.start_soon(alerts.run)
                    background.start_soon(Watchdog(deps, registry.schedules, tz=tz).run)
                async with trio.open_nursery() as services:
                    if pool is not None:
                        await services.start(run_ticker, deps, registry.schedules, tz)
                        await services.start(pool.run)
                    urls = await services.start(partial(serve_http, deps, create_app(deps), binds=binds))
                    log.info("autom serving on %s as %s with %d workers", ", ".join(urls), settings.role,
                             pool.workers if pool else 0, extra={"role": settings.role})
                    task_status.started(Service(deps=deps, pool=pool, urls=urls, control=control))
                # ticker, pool and HTTP have all stopped: end the background tasks, but
                # first send this process's alerts, held ones as one summary (bounded;
                # what does not go out stays in the outbox for the next sender)
                if alerts is not None:
                    with trio.CancelScope(shield=True), trio.move_on_after(2 * settings.http_timeout_seconds + 2):
                        try:
                            await alerts.flush()
                        except Exception as exc:  # the database is away: the outbox keeps them
                            log.warning("could not send the last alerts at shutdown; they stay queued: %s", exc)
                background.cancel_scope.cancel()
    log.info("autom stopped")


def build_registry(
    settings: Settings,
    app: App | None = None,
    handlers: Mapping[str, Handler | HandlerSpec] | None = None,
    schedules: Sequence[Schedule] | None = None,
) -> Registry:
    """The validated registry the service runs: ``app``'s (default: the built-in App), with
    ``handlers`` / ``schedules`` replacing its whole set when given (tests, benches)."""
    registry = (app or App()).registry(settings)
    if handlers is not None:
        registry = Registry(handlers=handler_specs(handlers), sources=registry.sources,
                            schedules=registry.schedules)
    if schedules is not None:
        registry = Registry(handlers=registry.handlers, sources=registry.sources, schedules=tuple(schedules))
    return registry


async def _watch_signals(control: Control, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    # SIGHUP too: a closed terminal (autom dev, a foreground autom run) drains like SIGTERM
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()
        async for signum in signals:
            if not control.shutdown.value:
                log.info("got %s", signal.Signals(signum).name)
                control.request_stop()
            else:
                control.stop_now()


async def main(settings: Settings, **kwargs: object) -> None:
    """The process: ``run_service`` plus a signal watcher that lives outside it.

    SIGTERM, SIGINT and SIGHUP: the first drains (``Control.request_stop``), the second
    cancels running handlers at once (``Control.stop_now``). The watcher sits in an outer
    nursery and is cancelled when the service ends; inside the service nursery it would
    hold the process for the whole grace period.
    """
    control = Control(grace=settings.shutdown_grace_seconds)
    async with trio.open_nursery() as outer:
        await outer.start(_watch_signals, control)
        await run_service(settings, control=control, **kwargs)  # type: ignore[arg-type]
        outer.cancel_scope.cancel()



