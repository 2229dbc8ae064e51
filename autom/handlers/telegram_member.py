"""``telegram.member``: the bot's status in a chat changed (a ``my_chat_member`` update); logged.

Storing the update already set or cleared the chat's blocked mark (the intake's statement:
"kicked" marks it, "left" leaves it, any other status clears it); this handler only
says so in the log. Register your own handler for the kind to act on it (forget a
chat's subscriptions, say). Rerun-safe: it writes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autom.context import HandlerContext
    from autom.jobs.models import Job


async def handle(ctx: HandlerContext, job: Job) -> None:
    """Log the chat's new status for the bot (``payload.status``)."""
    status = job.payload.get("status")
    what = {"kicked": "blocked the bot", "member": "took the bot (back)"}.get(str(status), f"made the bot {status}")
    ctx.log.info("telegram chat %s %s", job.payload.get("chat_id"), what,
                 extra={"recipient": job.recipient, "status": status})
