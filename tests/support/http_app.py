"""The HTTP app served for real on 127.0.0.1 for one test: ``async with running_app(db) as app:``.

Builds ``Deps`` around a test's database, serves ``create_app(deps)`` with
``serve_http`` on a free port in the caller's trio task tree, and gives an
``httpx.AsyncClient`` pointed at it. Leaving the block sets ``deps.shutdown``
(hypercorn's graceful drain), as SIGTERM does in the service.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from autom.config import Settings
from autom.deps import Deps
from autom.jobs.store import JobStore
from autom.sources import enabled_sources
from autom.web import create_app, serve_http
from tests.support.service import ADMIN_TOKEN

TELEGRAM_SECRET = "tg-secret-token_1"
SITE_SECRET = "site-secret"
GITHUB_SECRET = "github-secret"
STRIPE_SECRET = "whsec_stripe-test-secret"
STANDARD_KEY = b"standard-webhooks-test-key-32by!"
STANDARD_SECRET = "whsec_" + base64.b64encode(STANDARD_KEY).decode()


def app_settings(**changes: Any) -> Settings:
    """Settings with every source enabled and short timeouts; ``changes`` override."""
    values: dict[str, Any] = {
        "database_url": "postgresql://unused",
        "telegram_bot_token": "123:test-token",
        "telegram_alert_chat_id": "1",
        "telegram_webhook_secret": TELEGRAM_SECRET,
        "site_webhook_secret": SITE_SECRET,
        "github_webhook_secret": GITHUB_SECRET,
        "stripe_webhook_secret": STRIPE_SECRET,
        "standard_webhook_secret": STANDARD_SECRET,
        "admin_token": ADMIN_TOKEN,
        "host": "127.0.0.1",
        "shutdown_grace_seconds": 5.0,
        "log_format": "text",
    }
    values.update(changes)
    return Settings(**values)


def make_deps(settings: Settings, db: Any) -> Deps:
    """Deps for the HTTP side: real sources and database, Telegram calls only logged."""
    telegram: Any
    try:
        from autom.telegram import TelegramClient

        telegram = TelegramClient(settings, log_only=True)
    except ImportError:
        telegram = None
    return Deps(
        settings=settings,
        db=db,
        store=JobStore(db, lease_seconds=settings.job_lease_seconds),
        sources=enabled_sources(settings),
        telegram=telegram,
    )


@dataclass
class RunningApp:
    """A served app: its deps, its base URL and a client for it."""

    deps: Deps
    url: str
    client: httpx.AsyncClient
    done: trio.Event
    #: the served Quart app (its ``asgi_app`` is the door, autom/web/door.py)
    app: Any = None

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.url.rsplit(":", 1)[1])

    def shutdown(self) -> None:
        """Start the graceful shutdown (as SIGTERM does); ``await app.done.wait()`` for the end."""
        self.deps.shutdown.value = True


@asynccontextmanager
async def running_app(
    db: Any,
    settings: Settings | None = None,
    *,
    keep_alive_timeout: float | None = None,
    sources: Mapping[str, Any] | None = None,
) -> AsyncIterator[RunningApp]:
    """Serve the app on 127.0.0.1:0 for the block; drain it on exit.

    ``sources`` replaces the enabled sources (a test's fake source, say).
    """
    settings = settings or app_settings()
    deps = make_deps(settings, db)
    if sources is not None:
        deps.sources = sources
    app = create_app(deps)
    done = trio.Event()

    async def serve(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        kwargs = {} if keep_alive_timeout is None else {"keep_alive_timeout": keep_alive_timeout}
        try:
            await serve_http(deps, app, binds=["127.0.0.1:0"], task_status=task_status, **kwargs)
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(serve)
        async with httpx.AsyncClient(base_url=urls[0], timeout=10.0) as client:
            yield RunningApp(deps=deps, url=urls[0], client=client, done=done, app=app)
        deps.shutdown.value = True
        nursery.cancel_scope.deadline = trio.current_time() + 10


def client_at(url: str, address: str) -> httpx.AsyncClient:
    """A client of ``url`` that connects from ``address`` (127.0.0.2, 127.0.0.3, ...: another client
    to the server, as another machine would be; Linux routes all of 127/8 to loopback)."""
    return httpx.AsyncClient(base_url=url, timeout=10.0, transport=httpx.AsyncHTTPTransport(local_address=address))


def sample(metric: Any, **labels: str) -> float:
    """The current value of a labelled counter (0 when never touched)."""
    value = metric.labels(**labels)._value.get() if labels else metric._value.get()
    return float(value)


async def count_rows(db: Any, table: str) -> int:
    """Rows in ``events`` or ``jobs``."""
    assert table in ("events", "jobs")
    return int(await db.fetch_val(f"select count(*) from {table}"))

