"""Job handlers, one module per kind, and the registry the worker looks kinds up in.

A handler is ``async def handle(ctx: HandlerContext, job: Job) -> None``. It steers
the queue with exceptions: return = done; ``PermanentError`` = failed for good;
``Retry(after=s)`` = retry no sooner than ``s``; any other ``Exception`` = retry
with backoff. **Running a handler twice must do no harm** (the queue is
at-least-once: a worker killed mid-job runs it again).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autom.handlers import heartbeat, log_event, prune, telegram_message

if TYPE_CHECKING:
    from autom.config import Settings
    from autom.db.bridge import Database
    from autom.jobs.models import Job
    from autom.telegram import TelegramClient


@dataclass(frozen=True)
class HandlerContext:
    """What a handler may use: settings, the database, the Telegram client."""

    settings: Settings
    db: Database
    telegram: TelegramClient


Handler = Callable[[HandlerContext, "Job"], Awaitable[None]]


def default_handlers() -> Mapping[str, Handler]:
    """The kinds autom handles out of the box (README, Handlers)."""
    return {
        "telegram.message": telegram_message.handle,
        "site.form": log_event.handle,
        "github.event": log_event.handle,
        "stripe.event": log_event.handle,
        "standard.event": log_event.handle,
        "heartbeat": heartbeat.handle,
        "maintenance.prune": prune.handle,
    }
