"""``telegram.message``: answer ``/ping`` with ``pong`` in the same chat; other messages are logged.

Rerun-safe: answering twice would send two ``pong`` messages, which is harmless.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from autom.errors import PermanentError

if TYPE_CHECKING:
    from autom.handlers import HandlerContext
    from autom.jobs.models import Job

log = logging.getLogger("autom.handlers.telegram")


def _command(text: str) -> str:
    """``/ping@MyBot args`` → ``/ping``."""
    first = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    return first.split("@", 1)[0].lower()


async def handle(ctx: HandlerContext, job: Job) -> None:
    """Reply ``pong`` to ``/ping``."""
    chat_id = job.payload.get("chat_id")
    text = job.payload.get("text") or ""
    if chat_id is None:
        raise PermanentError("telegram.message payload has no chat_id")
    if _command(str(text)) == "/ping":
        await ctx.telegram.send_message(chat_id, "pong")
        log.info("answered /ping", extra={"job_id": job.id, "kind": job.kind, "recipient": str(chat_id)})
    else:
        log.info("message received", extra={"job_id": job.id, "kind": job.kind, "recipient": str(chat_id)})
