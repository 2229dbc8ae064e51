"""Running the whole service in the test's own trio nursery, and talking to it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import trio

from autom.config import Settings
from autom.schedule import Schedule
from autom.service import Control, Service, run_service

TG_SECRET = "tg-secret_123"
SITE_SECRET = "site-secret"
ADMIN_TOKEN = "admin-token-of-the-tests-0123"  # at least 24 characters, as the settings demand
ALERT_CHAT = "-1000"


def service_env(dsn: str, telegram_url: str) -> dict[str, str]:
    """The settings of a service under test as environment variables: every required
    setting, quick timings (in-process services and ``autom run`` processes alike)."""
    return {
        "DATABASE_URL": dsn,
        "TELEGRAM_BOT_TOKEN": "123456:TEST-token",
        "TELEGRAM_ALERT_CHAT_ID": ALERT_CHAT,
        "TELEGRAM_WEBHOOK_SECRET": TG_SECRET,
        "SITE_WEBHOOK_SECRET": SITE_SECRET,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "TELEGRAM_API": telegram_url,
        "HOST": "127.0.0.1",
        "PORT": "0",
        "WORKERS": "4",
        "RETRY_BASE_SECONDS": "0.2",
        "RETRY_MAX_SECONDS": "1",
        "HTTP_TIMEOUT_SECONDS": "2",
        "SHUTDOWN_GRACE_SECONDS": "5",
        "LOG_FORMAT": "text",
    }


def service_settings(dsn: str, telegram_url: str, **overrides: Any) -> Settings:
    """Settings for a service under test (``service_env``), with attribute overrides."""
    env = service_env(dsn, telegram_url)
    settings = Settings.from_env(env, env_file=None)
    return settings.replace(**overrides)


@asynccontextmanager
async def running_service(
    settings: Settings, *, schedules: Sequence[Schedule] = (), handlers: Mapping[str, Any] | None = None,
) -> AsyncIterator[Service]:
    """The service running in a nursery for the block; drained and stopped at its end."""
    control = Control()
    async with trio.open_nursery() as nursery:
        service: Service = await nursery.start(partial(
            run_service, settings, control=control, schedules=schedules, handlers=handlers,
            binds=["127.0.0.1:0"],
        ))
        try:
            yield service
        finally:
            control.request_stop()
            nursery.cancel_scope.deadline = trio.current_time() + settings.shutdown_grace_seconds + 5


def telegram_update(update_id: int, chat_id: int, text: str) -> dict[str, Any]:
    """A Telegram ``message`` update as the Bot API sends it."""
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id, "date": 1700000000, "text": text,
            "chat": {"id": chat_id, "type": "private"},
            "from": {"id": chat_id, "is_bot": False, "first_name": "T"},
        },
    }


async def post_telegram(client: httpx.AsyncClient, update: dict[str, Any], secret: str = TG_SECRET) -> httpx.Response:
    """POST an update to /hooks/telegram with the secret header."""
    return await client.post(
        "/hooks/telegram", content=json.dumps(update).encode(),
        headers={"X-Telegram-Bot-Api-Secret-Token": secret, "Content-Type": "application/json"},
    )


async def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Await ``predicate()`` (sync or async) until it is truthy; return its value."""
    with trio.fail_after(timeout):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await trio.sleep(interval)
