"""Job models: ``NewJob`` is what producers enqueue, ``Job`` what a claim returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

DEFAULT_MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue.

    ``key``: a job with the same key is created once (``None`` = always create).
    ``recipient``: jobs of one recipient run one at a time, in the order they were queued
    (``run_at``, then creation; a job waiting for its retry keeps its place and holds the
    later ones back), and recipients are served fairly (a Telegram chat id, for example).
    ``run_at``: ``None`` = now (the database's clock).
    ``max_attempts``: ``None`` = the kind's (its handler's ``max_attempts``, else 8).
    """

    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    recipient: str | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    event_id: int | None = None


@dataclass(frozen=True)
class Job:
    """A claimed job as a worker sees it.

    ``lease`` is the lease generation of this claim: every write after the claim
    (complete, fail, renew) matches it, so a worker whose lease ran out and whose
    job was claimed again changes nothing.
    """

    id: int
    kind: str
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    lease: int
    locked_until: datetime
    recipient: str | None = None
    key: str | None = None
    event_id: int | None = None
    run_at: datetime | None = None
