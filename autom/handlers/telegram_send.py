"""``telegram.send``: send one Telegram message; payload ``{"chat_id": ..., "text": ...}``.

A handler that wants to tell someone something enqueues this kind instead of
sending inline (``await ctx.enqueue("telegram.send", {...}, recipient=str(chat_id))``):
the message is then retried on its own (a Telegram outage does not repeat the
handler's other work), waits its turn within Telegram's rate limits, and with
the chat as recipient arrives in order with the chat's other messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autom.errors import PermanentError

if TYPE_CHECKING:
    from autom.context import HandlerContext
    from autom.jobs.models import Job


async def handle(ctx: HandlerContext, job: Job) -> None:
    """Send ``payload.text`` to ``payload.chat_id``; a payload without them fails for good.

    Rerun-safe within the at-least-once promise: a crash between Telegram's answer and
    the job's completion sends the message again (Telegram has no idempotency key). A
    long text's parts are each sent once: a rerun resumes at the first part not sent
    (autom/telegram.py). A chat that blocked the bot ends the job cancelled, no alert.
    """
    chat_id = job.payload.get("chat_id")
    text = job.payload.get("text")
    if isinstance(chat_id, bool) or not isinstance(chat_id, int | str) or chat_id == "":
        raise PermanentError("telegram.send payload needs chat_id (a chat id or @channel name)")
    if not isinstance(text, str) or not text.strip():
        raise PermanentError("telegram.send payload needs a non-empty text")
    sent = await ctx.telegram.send_message(chat_id, text)
    ctx.log.info("telegram message sent", extra={"recipient": str(chat_id), "message_id": sent.get("message_id")})
