"""Helpers for testing your automations on a real PostgreSQL (pytest + pytest-trio).

::

    from autom import testing
    from shop_automations import app

    async def test_order_tells_the_manager():
        async with testing.open_testbed(app) as bed:
            run = await bed.run_job("shop.order", {"id": 7, "total": 120})
        assert run.status == "done", run.error
        run.assert_enqueued("telegram.send", chat_id=MANAGER)

``open_testbed`` gives a migrated throwaway database (on AUTOM_TEST_DATABASE_URL's
server, else an embedded PostgreSQL), a Telegram stub (``bed.telegram``, a real
HTTP server on 127.0.0.1 that records every call) and, on first use, the intake
on 127.0.0.1. ``run_job`` runs one job through your handler the way the service
does (the real claim, context, timeout, transaction and completion), so what a
test sees is what production does: no eager mode, no in-memory queue.
Follow-up jobs a run enqueues are recorded (``run.enqueued``), not run; run
them with ``run_job`` when the test wants to. ``run_schedule(kind, at=...)`` runs
the slot of a schedule that is due at ``at``, with the ticker's key and payload.

External APIs your handlers call are faked at the network edge:
``running_http_stub()`` serves a recording JSON API on 127.0.0.1; point your
handler's URL setting at its ``url`` (the example project's tests do this for
its CRM); ``running_model_stub()`` is an OpenAI-compatible chat-completions API
whose refusals (429, overloaded) are scripted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import trio

from autom.app import App, Registry
from autom.config import Settings
from autom.context import BoundedHTTP
from autom.db.bridge import Database, open_database
from autom.db.migrate import apply_migrations
from autom.db.queries import Q
from autom.db.scratch import PgServer, start_pg_server, temporary_database
from autom.deps import Deps
from autom.jobs.models import NewJob
from autom.jobs.outcome import Outcome
from autom.jobs.retry import RetryPolicy
from autom.jobs.store import JobStore
from autom.schedule import process_zone
from autom.sources.base import hmac_sha256
from autom.telegram import TelegramClient
from autom.testing.http_stub import HttpStub, running_http_stub
from autom.testing.model_stub import ModelStub, running_model_stub
from autom.testing.telegram_stub import Reply, TelegramStub, running_stub
from autom.ticker import due_jobs
from autom.worker import WorkerPool

__all__ = [
    "Delivery",
    "EnqueuedJob",
    "HttpStub",
    "JobRun",
    "ModelStub",
    "Reply",
    "TelegramStub",
    "Testbed",
    "hmac_signature",
    "open_testbed",
    "running_http_stub",
    "running_model_stub",
    "running_stub",
]

#: the bot token the testbed's Telegram client uses (the stub accepts any)
TEST_BOT_TOKEN = "123456:TEST-token-of-autom-testing"  # noqa: S105 (a stub accepts it)


@dataclass(frozen=True)
class EnqueuedJob:
    """A job a run enqueued (committed with its completion)."""

    id: int
    kind: str
    payload: dict[str, Any]
    key: str | None
    recipient: str | None
    run_at: datetime | None
    max_attempts: int


@dataclass(frozen=True)
class JobRun:
    """What one ``run_job`` did.

    ``status``: ``done``; ``pending`` (a failed attempt that will be retried: ``error``
    says why); ``failed`` (for good); ``running`` only if the run lost its lease.
    ``enqueued``: the follow-up jobs this run committed. ``once_keys``: the
    ``ctx.once`` keys it recorded.
    """

    id: int
    kind: str
    status: str
    attempts: int
    error: str | None
    enqueued: list[EnqueuedJob] = field(default_factory=list)
    once_keys: list[str] = field(default_factory=list)

    def enqueued_of(self, kind: str) -> list[EnqueuedJob]:
        """The follow-up jobs of ``kind``."""
        return [job for job in self.enqueued if job.kind == kind]

    def assert_enqueued(self, kind: str, **payload: Any) -> EnqueuedJob:
        """The one follow-up of ``kind`` whose payload has these items; AssertionError naming what was enqueued."""
        matches = [job for job in self.enqueued_of(kind)
                   if all(k in job.payload and job.payload[k] == v for k, v in payload.items())]
        if len(matches) != 1:
            seen = [(job.kind, job.payload) for job in self.enqueued] or "nothing"
            raise AssertionError(f"expected one {kind!r} job with {payload}, found {len(matches)}; "
                                 f"this run enqueued {seen}")
        return matches[0]


@dataclass(frozen=True)
class Delivery:
    """The intake's answer to one ``Testbed.post``: status, JSON body, and the jobs it created."""

    status: int
    body: dict[str, Any]
    jobs: list[EnqueuedJob]


def hmac_signature(secret: str | bytes, body: bytes, *, prefix: str = "sha256=") -> str:
    """``prefix`` + hex HMAC-SHA256 of ``body`` (the ``site`` scheme, and many senders')."""
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    return prefix + hmac_sha256(key, body).hex()


class Testbed:
    """A database, a Telegram stub and your App's registry; made by ``open_testbed``."""

    def __init__(self, *, settings: Settings, db: Database, registry: Registry, telegram: TelegramStub,
                 deps: Deps, nursery: trio.Nursery) -> None:
        # a constructor's assignments, like every other one (what duplicates pairs it with)
        self.settings = settings
        self.db = db
        self.registry = registry
        self.telegram = telegram
        self.deps = deps
        self._nursery = nursery
        self._pool = WorkerPool(deps, registry.handlers, workers=1)
        self._intake: httpx.AsyncClient | None = None
        self._stack = AsyncExitStack()

    @property
    def database_url(self) -> str:
        """The throwaway database's connection string (for ``autom.enqueue`` and your own queries)."""
        assert self.settings.database_url
        return self.settings.database_url

    async def enqueue(self, kind: str, payload: Mapping[str, Any] | None = None, *, key: str | None = None,
                      recipient: str | int | None = None, max_attempts: int | None = None) -> int:
        """Create a pending job (as a source or ``autom.enqueue`` would); returns its id."""
        job = NewJob(kind, dict(payload or {}), key=key, recipient=None if recipient is None else str(recipient),
                     max_attempts=max_attempts)
        ids = await self.deps.store.enqueue_many(self.registry.with_defaults([job]))
        if not ids:
            raise AssertionError(f"a job with key {key!r} exists already")
        return ids[0]

    async def run_job(self, kind: str, payload: Mapping[str, Any] | None = None, *, key: str | None = None,
                      recipient: str | int | None = None, max_attempts: int | None = None) -> JobRun:
        """Enqueue one job and run it through its handler the way a worker does; report what happened."""
        job_id = await self.enqueue(kind, payload, key=key, recipient=recipient, max_attempts=max_attempts)
        return await self.run(job_id)

    async def run_schedule(self, kind: str, *, at: datetime) -> JobRun:
        """Enqueue the slot of ``kind``'s schedule that is due at ``at`` (timezone-aware) and run it.

        The job is the one the ticker would enqueue at ``at`` (same key ``kind:slot`` and
        payload, with ``"slot"``; daily and cron specs in the testbed's TZ setting, else the
        process's zone). AssertionError if no slot is due at ``at`` or that slot's job
        exists already (the ticker would enqueue nothing).
        """
        specs = [spec for spec in self.registry.schedules if spec.kind == kind]
        if len(specs) != 1:
            raise AssertionError(f"expected one schedule of kind {kind!r}, found {len(specs)}: "
                                 f"{[spec.describe() for spec in specs]}")
        tz = ZoneInfo(self.settings.tz) if self.settings.tz else process_zone()
        jobs = due_jobs(specs, at, tz)
        if not jobs:
            raise AssertionError(f"no slot of {kind!r} ({specs[0].describe()}) is due at {at.isoformat()}")
        ids = await self.deps.store.enqueue_many(jobs)
        if not ids:
            raise AssertionError(f"the slot's job exists already (key {jobs[0].key!r}): the ticker would enqueue "
                                 "nothing")
        return await self.run(ids[0])

    async def run(self, job_id: int, *, wait: float = 10.0) -> JobRun:
        """Claim job ``job_id`` (with the service's claim) and run it once; report what happened.

        Waits up to ``wait`` seconds for the job to become claimable (a retry's backoff,
        its recipient's earlier job). Other due jobs the claim takes on the way
        (follow-ups of earlier runs) are put back untouched. AssertionError if the job
        cannot be claimed in time.
        """
        store = self.deps.store
        mine = None
        with trio.move_on_after(wait):
            while mine is None:
                others = []
                claimed_at = trio.current_time()
                while mine is None and (claimed := await store.claim(100)):
                    for job in claimed:
                        if job.id == job_id:
                            mine = job
                        else:
                            others.append(job)
                if others:
                    await store.write([Outcome.released(job) for job in others])
                if mine is None:
                    await trio.sleep(0.02)
        if mine is None:
            row = await store.get(job_id)
            state = "no such job" if row is None else f"status {row['status']}, run_at {row['run_at']}"
            raise AssertionError(f"job {job_id} could not be claimed within {wait:g} s ({state})")
        last = await self.db.fetch_val(Q.testing_last_job_id)
        await self._pool.run_claimed(mine, claimed_at)
        row = await store.get(job_id)
        assert row is not None
        created = await self.db.fetch_all(Q.testing_jobs_after, {"last": last})
        keys = await self.db.fetch_all(Q.once_keys_of_job, {"job_id": job_id})
        return JobRun(id=job_id, kind=row["kind"], status=row["status"], attempts=row["attempts"],
                      error=row["last_error"] if row["status"] != "done" else None,
                      enqueued=[EnqueuedJob(**r) for r in created], once_keys=[r["key"] for r in keys])

    async def post(self, source: str, body: bytes | str | Mapping[str, Any],
                   headers: Mapping[str, str] | None = None) -> Delivery:
        """POST ``body`` to ``/hooks/{source}`` of the real intake (served on 127.0.0.1 for this testbed).

        A dict is sent as JSON. Sign it the way your source verifies (``hmac_signature``
        for the common ``sha256=<hex>`` scheme).
        """
        if self._intake is None:
            self._intake = await self._start_intake()
        content = body if isinstance(body, bytes) else (
            body.encode("utf-8") if isinstance(body, str) else json.dumps(body).encode("utf-8"))
        response = await self._intake.post(f"/hooks/{source}", content=content, headers=dict(headers or {}))
        answer = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        jobs: list[EnqueuedJob] = []
        if isinstance(answer, dict) and "id" in answer:
            rows = await self.db.fetch_all(Q.testing_jobs_of_event, {"event_id": answer["id"]})
            jobs = [EnqueuedJob(**r) for r in rows]
        return Delivery(status=response.status_code, body=answer if isinstance(answer, dict) else {}, jobs=jobs)

    async def _start_intake(self) -> httpx.AsyncClient:
        from autom.web import create_app, serve_http

        urls: list[str] = await self._nursery.start(partial(
            serve_http, self.deps, create_app(self.deps), binds=["127.0.0.1:0"]))
        return await self._stack.enter_async_context(httpx.AsyncClient(base_url=urls[0], timeout=10.0))

    async def aclose(self) -> None:
        """Stop the intake (if started)."""
        self.deps.shutdown.value = True
        await self._stack.aclose()


@asynccontextmanager
async def _database(database_url: str | None) -> AsyncIterator[str]:
    if database_url is not None:
        yield database_url
        return
    try:
        server: PgServer = await trio.to_thread.run_sync(start_pg_server)
    except ModuleNotFoundError as exc:  # no server named and no embedded one installed
        raise RuntimeError("autom.testing needs a PostgreSQL: set AUTOM_TEST_DATABASE_URL to a server it may "
                           'create databases on, or pip install "autom[embedded]"') from exc
    try:
        with temporary_database(server, prefix="user") as dsn:
            yield dsn
    finally:
        await trio.to_thread.run_sync(server.close)


@asynccontextmanager
async def open_testbed(
    app: App,
    *,
    database_url: str | None = None,
    settings: Mapping[str, Any] | None = None,
    telegram: TelegramStub | None = None,
) -> AsyncIterator[Testbed]:
    """A testbed for ``app`` for the duration of the block.

    ``database_url``: a database to use as it is (migrated on entry, the App's own
    migrations too); default a fresh
    throwaway database on AUTOM_TEST_DATABASE_URL's server (dropped on exit), else on
    an embedded PostgreSQL. ``settings``: Settings fields to change (``http_timeout_seconds``
    and so on; source secrets enable the built-in sources). ``telegram``: a stub of
    yours (default: one started for the block, ``bed.telegram``).
    """
    app.validate(Settings(**dict(settings or {})))
    async with AsyncExitStack() as stack:
        dsn = await stack.enter_async_context(_database(database_url))
        stub: TelegramStub = telegram if telegram is not None else await stack.enter_async_context(running_stub())
        values: dict[str, Any] = {
            "database_url": dsn, "telegram_bot_token": TEST_BOT_TOKEN, "telegram_alert_chat_id": "-1",
            "telegram_api": stub.url, "host": "127.0.0.1", "port": 0, "log_format": "text",
            "retry_base_seconds": 0.1, "retry_max_seconds": 1.0, "shutdown_grace_seconds": 2.0,
        }
        values.update(settings or {})
        config = Settings(**values)
        registry = app.registry(config)
        db = await stack.enter_async_context(open_database(dsn, min_size=1, max_size=6, name="autom-testing"))
        await apply_migrations(db, app.user_migrations())
        telegram_client = TelegramClient(config)
        stack.push_async_callback(telegram_client.aclose)
        http = await stack.enter_async_context(BoundedHTTP(deadline=config.http_timeout_seconds))
        store = JobStore(db, lease_seconds=config.job_lease_seconds,
                         retry=RetryPolicy(base=config.retry_base_seconds, cap=config.retry_max_seconds),
                         max_defer_seconds=config.max_defer_seconds)
        # each kind's max_attempts, for autom.enqueue in the user's tests (as the service does)
        await store.register_kinds({kind: spec.max_attempts for kind, spec in registry.handlers.items()})
        deps = Deps(settings=config, db=db, store=store,
                    sources=registry.sources, telegram=telegram_client, registry=registry, http=http)
        nursery = await stack.enter_async_context(trio.open_nursery())
        bed = Testbed(settings=config, db=db, registry=registry, telegram=stub, deps=deps, nursery=nursery)
        try:
            yield bed
        finally:
            await bed.aclose()
