"""The operator's side of the event store: read a stored event, replay it (``autom.ops`` calls these)."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Mapping

from autom.checks import one_line
from autom.db.bridge import Database, Row
from autom.db.queries import Q
from autom.errors import Conflict, NotFound
from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from autom.sources.base import ParseError, Source

#: fills in what a producer left open in new jobs (``Registry.with_defaults``: each kind's max_attempts)
JobDefaults = Callable[[list[NewJob]], list[NewJob]]


async def fetch_event(db: Database, event_id: int) -> Row:
    """One stored event (``ops_get_event``: its row and the ids of its jobs); ``NotFound`` if there is none."""
    row = await db.fetch_one(Q.ops_get_event, {"id": event_id})
    if row is None:
        raise NotFound(f"no event with id {event_id}")
    return row


async def replay_event(store: JobStore, sources: Mapping[str, Source], event_id: int, *,
                       defaults: JobDefaults | None = None) -> list[int]:
    """Parse stored event ``event_id`` again with its source, create its jobs in ``store``; the ids created.

    Always new jobs, linked to the same event, also when jobs of the event exist or
    are done: a replay is an operator saying "run this again" (README, Operations). A
    replayed job with a key gets the key plus ``:replay:<random>``, distinct from the
    original (and from other replays) while still saying where it came from.
    ``NotFound`` for an unknown id; ``Conflict`` when the event's source is not in
    ``sources`` (a row written by something else, or by a newer version) or its body
    still does not parse. ``defaults`` fills in what the source left open, as the
    intake does (the kind's ``max_attempts`` from the App's handler).
    """
    event = await fetch_event(store.db, event_id)
    source = sources.get(event["source"])
    if source is None:
        known = ", ".join(sorted(sources))
        raise Conflict(f"event {event_id} came from source {one_line(str(event['source']), 80)!r}, "
                       f"which autom does not know (known: {known})")
    try:
        parsed = source.parse(event["headers"] or {}, event["body"])
    except ParseError as exc:
        raise Conflict(f"event {event_id} does not parse: {exc}") from exc
    tag = secrets.token_hex(6)
    jobs = [
        dataclasses.replace(job, event_id=event_id, key=None if job.key is None else f"{job.key}:replay:{tag}")
        for job in parsed.jobs
    ]
    return await store.enqueue_many(jobs if defaults is None else defaults(jobs))
