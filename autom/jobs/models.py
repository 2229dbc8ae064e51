"""Job models: ``NewJob`` is what producers enqueue, ``Job`` what a claim returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

DEFAULT_MAX_ATTEMPTS = 8


def lease_generation(lease: int) -> int:
    """The claim count a lease value carries (as SQL's ``autom_lease_generation`` reads it):
    the high bits; the low 32 are random, so a lease value is never handed out twice."""
    return lease if lease < 1 << 32 else lease >> 32


def is_max_attempts(value: object) -> bool:
    """Whether ``value`` can be a job's ``max_attempts``: a whole number ≥ 1 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue.

    ``key``: a job of this kind with the same key is created once (``None`` = always create).
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
    #: the W3C traceparent its attempts' spans continue (autom/tracing.py); None: untraced
    trace: str | None = None


@dataclass(frozen=True)
class Job:
    """A claimed job as a worker sees it.

    ``lease`` is this claim's lease value: every write after the claim (its outcome,
    renewals, ``complete_in``, ``ctx.once``) matches it, so a worker whose lease ran out and
    whose job was claimed again changes nothing. No two claims of a job get the same
    value (``lease_generation``); ``generation`` is the claim count it carries.
    """

    # NewJob's fields again, alike in shape: here a claimed row's columns, filled in (max_attempts
    # resolved, the claim's lease), where an enqueue leaves them open
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
    #: when the job's event arrived (``events.received_at``); None for a job without an event
    received_at: datetime | None = None
    #: the W3C traceparent stored with the job (autom/tracing.py), None when untraced
    trace: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], **changes: Any) -> Job:
        """The job of a ``jobs`` row (a mapping with at least Job's required fields; other keys are
        ignored, missing optional ones None), with ``changes`` applied. The claim has a faster
        road for its many rows (``autom.jobs.store``: the row dict becomes the object's ``__dict__``)."""
        values = {name: row[name] for name in _FIELDS if name in row}
        return cls(**{**values, **changes})

    @property
    def generation(self) -> int:
        """This claim's number among the job's claims (1 = its first)."""
        return lease_generation(self.lease)


_FIELDS = tuple(f.name for f in fields(Job))
