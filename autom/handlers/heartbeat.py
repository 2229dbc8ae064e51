"""``heartbeat``: runs hourly from the schedule and records that the queue is alive.

The record (``service_state`` row ``heartbeat``) is what the watchdog reads to
alert when the heartbeat stops. Sends no message. Rerun-safe: an upsert.

With HEARTBEAT_URL set, each run then fetches that URL with GET: a dead-man's
switch (healthchecks.io, Cronitor, Uptime Kuma's push monitors) that alerts from
outside when the pings stop, which is exactly when the watchdog cannot: no
replica runs workers, or the database is down. A failed ping is logged and
never fails the job (the beat is recorded; the outside service notices the gap).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
import trio

from autom.db.queries import Q

if TYPE_CHECKING:
    from autom.handlers import HandlerContext
    from autom.jobs.models import Job

log = logging.getLogger("autom.handlers.heartbeat")


async def handle(ctx: HandlerContext, job: Job) -> None:
    """Record the beat with the job id and when it ran, then ping HEARTBEAT_URL if set."""
    await ctx.db.execute(Q.heartbeat_record, {"job_id": job.id})
    log.info("heartbeat", extra={"job_id": job.id, "kind": job.kind})
    if ctx.settings.heartbeat_url:
        await ping(ctx.settings.heartbeat_url, within=ctx.settings.http_timeout_seconds)


async def ping(url: str, *, within: float) -> bool:
    """GET ``url`` within ``within`` seconds in all; True on a 2xx answer. Never raises.

    The total bound is trio's, around the whole request: httpx's own timeouts are per
    socket operation, so a server trickling its answer would pass them. Only the
    scheme and host are logged: a ping URL carries its secret in the path.
    """
    where = public_part(url)
    try:
        with trio.fail_after(within):
            async with httpx.AsyncClient(timeout=httpx.Timeout(within), follow_redirects=True) as http:
                response = await http.get(url)
    except trio.TooSlowError:
        log.warning("heartbeat ping to %s got no answer within %gs", where, within)
        return False
    except Exception as exc:  # a ping never fails the heartbeat
        log.warning("heartbeat ping to %s failed: %s: %s", where, type(exc).__name__,
                    " ".join(str(exc).replace(url, where).split()) or "-")
        return False
    if not response.is_success:
        log.warning("heartbeat ping to %s answered HTTP %d", where, response.status_code)
        return False
    log.info("heartbeat ping to %s answered HTTP %d", where, response.status_code)
    return True


def public_part(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: what may be logged of it."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"  # user:password@ is a secret too
