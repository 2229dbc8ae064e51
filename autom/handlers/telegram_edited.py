"""``telegram.edited``: a message was edited (an ``edited_message`` update); logged.

Answering an edit as if it were a new command is not what a chat user expects, so
the built-in handler only logs it; register your own handler for the kind to act on
edits (payload as ``telegram.message``'s). Rerun-safe: it writes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autom.context import HandlerContext
    from autom.jobs.models import Job


async def handle(ctx: HandlerContext, job: Job) -> None:
    """Log that the message ``payload.message_id`` was edited."""
    ctx.log.info("telegram message %s edited", job.payload.get("message_id"), extra={"recipient": job.recipient})
