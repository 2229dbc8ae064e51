"""``telegram.callback``: a button pressed; routed to the App's ``@app.callback(prefix)`` handlers.

Data ``prefix`` or ``prefix:...`` goes to ``prefix``'s handler. A press no route takes
is answered empty, and so is one whose handler returned without answering: the user's
client stops its spinner either way. Rerun-safe: a second answer to one press is
refused by Telegram and ignored (``TelegramClient.answer_callback``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autom.context import HandlerContext
    from autom.handlers.spec import Handler
    from autom.jobs.models import Job


def prefix_of(data: object) -> str | None:
    """The route a button's data names: ``"take:42"`` → ``"take"``; None for no data."""
    return data.split(":", 1)[0] if isinstance(data, str) else None


def routed(callbacks: Mapping[str, Handler]) -> Handler:
    """The ``telegram.callback`` handler of an App with ``callbacks`` (prefix → handler)."""
    table = dict(callbacks)

    async def route(ctx: HandlerContext, job: Job) -> None:
        """Run the prefix's handler; answer the press empty if nothing answered it."""
        fn = table.get(prefix_of(job.payload.get("data")) or "")
        if fn is not None:
            await fn(ctx, job)
        else:
            ctx.log.info("button press with no route (data %r)", job.payload.get("data"),
                         extra={"recipient": job.recipient})
        query_id = job.payload.get("id")
        if isinstance(query_id, str) and not ctx.telegram.answered(query_id):
            await ctx.telegram.answer_callback(query_id)

    return route


#: the built-in handler: no routes, every press answered empty
handle = routed({})
