"""The built-in job handlers, one module per kind; every ``autom.App`` includes them.

A handler is ``async def handle(ctx: HandlerContext, job: Job) -> None``. It steers
the queue with exceptions: return = done; ``PermanentError`` = failed for good;
``Retry(after=s)`` = retry no sooner than ``s``; any other ``Exception`` = retry
with backoff. **Running a handler twice must do no harm** (the queue is
at-least-once: a worker killed mid-job runs it again).
"""

from __future__ import annotations

from collections.abc import Mapping

from autom.context import HandlerContext
from autom.handlers import (
    heartbeat,
    log_event,
    prune,
    telegram_callback,
    telegram_edited,
    telegram_member,
    telegram_message,
    telegram_send,
)
from autom.handlers.spec import Handler, HandlerSpec

__all__ = ["Handler", "HandlerContext", "builtin_handlers", "default_handlers"]


def default_handlers() -> Mapping[str, Handler]:
    """The kinds autom handles out of the box (README, Handlers), kind → function."""
    return {
        "telegram.message": telegram_message.handle,
        "telegram.send": telegram_send.handle,
        "telegram.member": telegram_member.handle,
        "telegram.callback": telegram_callback.handle,
        "telegram.edited": telegram_edited.handle,
        "site.form": log_event.handle,
        "github.event": log_event.handle,
        "stripe.event": log_event.handle,
        "standard.event": log_event.handle,
        "heartbeat": heartbeat.handle,
        "maintenance.prune": prune.handle,
    }


def builtin_handlers() -> dict[str, HandlerSpec]:
    """The built-in kinds as an App registers them (8 attempts, no timeout beyond the lease)."""
    return {kind: HandlerSpec(kind, fn, builtin=True) for kind, fn in default_handlers().items()}
