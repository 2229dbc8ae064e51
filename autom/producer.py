"""``autom.enqueue`` and ``autom.enqueue_sync``: hand work to autom from another program.

Both take a DSN (a short connection of their own, committed at once) or a psycopg 3
``Connection`` (the job commits or rolls back with the caller's own writes), e.g.
``autom.enqueue_sync(conn, "shop.order", {"id": 42}, key="order:42")`` inside the
caller's transaction. ``new_job`` is the one validation of a job to enqueue (also
``ctx.enqueue``'s). The SQL underneath, ``autom_enqueue``, is a function any language can
call, and it wakes the service (NOTIFY); README, "Enqueue from outside". A job of a kind
no handler serves fails permanently when a worker claims it, with an alert.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import anyio.to_thread

from autom.db.producer import insert_at, insert_on
from autom.jobs.models import NewJob, is_max_attempts
from autom.jobs.store import created_or_none, jobs_json
from autom.sources.base import key_text


def new_job(
    kind: str,
    payload: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    recipient: str | int | None = None,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
) -> NewJob:
    """A checked ``NewJob``, the one validation of a job to enqueue (``enqueue``, ``ctx.enqueue``).

    ``key`` and ``recipient`` become text. Raises ``ValueError`` for an empty kind, a
    naive ``run_at`` or a ``max_attempts`` that is not a whole number ≥ 1, ``TypeError``
    for a payload that is not a JSON object of JSON values (what the database would
    refuse later).
    """
    if not isinstance(kind, str) or not kind.strip():
        raise ValueError("a job needs a kind (a non-empty string)")
    payload = {} if payload is None else payload
    if not isinstance(payload, dict):
        raise TypeError(f"the payload must be a JSON object (a dict), got {type(payload).__name__}")
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the payload is not JSON-serialisable: {exc}") from None
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.tzinfo is None):
        raise ValueError("run_at must be a timezone-aware datetime")
    if max_attempts is not None and not is_max_attempts(max_attempts):
        raise ValueError("max_attempts must be a whole number ≥ 1")
    return NewJob(kind, payload, key=None if key is None else key_text(key),
                  recipient=None if recipient is None else str(recipient), run_at=run_at,
                  max_attempts=max_attempts)


def enqueue_sync(
    database: Any,
    kind: str,
    payload: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    recipient: str | int | None = None,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
) -> int | None:
    """Enqueue one job of ``kind`` from synchronous code.

    Returns its id, or None when a job of ``kind`` with ``key`` exists (nothing is
    created; one info line on logger ``autom.enqueue`` names it).

    ``database``: a DSN (committed at once) or a psycopg 3 ``Connection`` (the job
    commits with that connection's transaction). ``payload``: a JSON object (a dict).
    ``key``: the job is created once per kind and key. ``recipient``: its FIFO group (a
    chat id). ``run_at``: an aware datetime, None = now. ``max_attempts``: None = the
    kind's handler's, as the service last registered it, else 8.

    Raises ``ValueError``/``TypeError`` for a job the database would refuse (``new_job``)
    or a ``database`` that is neither, and psycopg's errors when the database does.
    """
    job = new_job(kind, payload, key=key, recipient=recipient, run_at=run_at, max_attempts=max_attempts)
    text = jobs_json([job])
    [job_id] = created_or_none([job], insert_at(database, text) if isinstance(database, str)
                               else insert_on(database, text))
    return job_id


async def enqueue(
    database: Any,
    kind: str,
    payload: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    recipient: str | int | None = None,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
) -> int | None:
    """``enqueue_sync`` for async code (trio or asyncio): the same arguments, returns and raises;
    the database call runs in a worker thread."""
    # enqueue_sync's signature and body again, on purpose: one public function each for sync
    # and async callers, the database call the only line that differs
    job = new_job(kind, payload, key=key, recipient=recipient, run_at=run_at, max_attempts=max_attempts)
    text = jobs_json([job])
    rows = await anyio.to_thread.run_sync(insert_at if isinstance(database, str) else insert_on, database, text)
    [job_id] = created_or_none([job], rows)
    return job_id
