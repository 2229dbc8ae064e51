"""``telegram.message``: the App's commands (``@app.command``), else answer ``/ping`` with ``pong``
and ``/chatid`` with the chat's id; log the rest.

``/chatid`` is how an operator finds the id to put in TELEGRAM_ALERT_CHAT_ID: add the
bot to the chat (a group has a negative id) and send it there.
Rerun-safe: answering twice would send two answers, which is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from autom.errors import PermanentError

if TYPE_CHECKING:
    from autom.handlers import HandlerContext
    from autom.handlers.spec import Handler
    from autom.jobs.models import Job

log = logging.getLogger("autom.handlers.telegram")


def _command(text: str) -> str:
    """``/ping@MyBot args`` → ``/ping``."""
    first = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    return first.split("@", 1)[0].lower()


def chatid_text(chat_id: object) -> str:
    """The answer to ``/chatid``."""
    return f"This chat's id is {chat_id} (TELEGRAM_ALERT_CHAT_ID={chat_id} sends autom's alerts here)"


def routed(commands: Mapping[str, Handler]) -> Handler:
    """The ``telegram.message`` handler of an App with ``commands`` (name without "/" → handler):
    ``/name`` and ``/name@bot`` go to the command's handler, the rest to ``handle``."""
    table = dict(commands)

    async def route(ctx: HandlerContext, job: Job) -> None:
        """Run the command's handler for ``/name`` (or ``/name@bot``), else the built-in answers."""
        text = job.payload.get("text")
        fn = table.get(_command(text)[1:]) if isinstance(text, str) and text.startswith("/") else None
        if fn is None:
            await handle(ctx, job)
        else:
            await fn(ctx, job)

    return route


async def handle(ctx: HandlerContext, job: Job) -> None:
    """Reply ``pong`` to ``/ping`` and the chat's id to ``/chatid``."""
    chat_id = job.payload.get("chat_id")
    text = job.payload.get("text") or ""
    if chat_id is None:
        raise PermanentError("telegram.message payload has no chat_id")
    command = _command(str(text))
    if command == "/ping":
        await ctx.telegram.send_message(chat_id, "pong")
        log.info("answered /ping", extra={"job_id": job.id, "kind": job.kind, "recipient": str(chat_id)})
    elif command == "/chatid":
        await ctx.telegram.send_message(chat_id, chatid_text(chat_id))
        log.info("answered /chatid", extra={"job_id": job.id, "kind": job.kind, "recipient": str(chat_id)})
    else:
        log.info("message received", extra={"job_id": job.id, "kind": job.kind, "recipient": str(chat_id)})
