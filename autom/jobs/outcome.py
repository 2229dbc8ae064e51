"""``Outcome``: how one claim of a job ended, the one type every outcome writer takes.

Built by its named constructors (``done``, ``retry``, ``failed``, ``released``, ``deferred``,
``cancelled``) and recorded by ``JobStore.write``, fenced by the claim's lease: an outcome
of a claim that no longer holds its job changes nothing. ``Written`` is what a held
claim's job became. Design notes: docs/design/worker.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from autom.jobs.models import Job


@dataclass(slots=True)
class Outcome:
    """How one claim of ``job`` ended; build it with a constructor below, do not change it after.

    ``status`` says what it does to the job; the other fields are that status's details
    (``error``: the one-line ``last_error``; ``traceback`` and ``log``: kept with the attempt).
    """

    job: Job
    status: Literal["done", "retry", "failed", "released", "deferred", "cancelled"]
    error: str | None = None
    #: seconds until the job is due again (retry, deferred)
    delay: float = 0.0
    #: a deferral the remote service asked for (Telegram's 429): bounded by MAX_DEFER_SECONDS
    refused: bool = False
    #: a deferral the send limiter logged itself (``Defer.quiet``): the worker logs it at debug
    quiet: bool = False
    #: failed without running: the claim's attempt is given back (``attempts`` = runs started)
    unrun: bool = False
    #: the traceback of an unexpected exception (autom/worker/tracebacks.py)
    traceback: str | None = None
    #: the lines the handler logged through ``ctx.log``
    log: list[str] | None = None

    @classmethod
    def done(cls, job: Job, log: list[str] | None = None) -> Outcome:
        """The run succeeded: the job is done (``log``: the lines its handler logged)."""
        return cls(job, "done", log=log)

    @classmethod
    def retry(cls, job: Job, error: str, delay: float, *, traceback: str | None = None,
              log: list[str] | None = None) -> Outcome:
        """The run failed and may succeed later: pending again in ``delay`` seconds, the attempt
        counted, ``error`` recorded; it keeps its place in its recipient's line."""
        return cls(job, "retry", error, delay, traceback=traceback, log=log)

    @classmethod
    def failed(cls, job: Job, error: str, *, unrun: bool = False, traceback: str | None = None,
               log: list[str] | None = None) -> Outcome:
        """Failed for good: its alert is recorded with it. ``unrun``: failed without running
        (attempts exhausted, an at-most-once job lost), so the claim's attempt is given back."""
        return cls(job, "failed", error, unrun=unrun, traceback=traceback, log=log)

    @classmethod
    def released(cls, job: Job, reason: str | None = None) -> Outcome:
        """Given back unfinished (shutdown, a hand-off no runner took): pending at once, the
        attempt not counted; ``reason``, when given, becomes ``last_error``."""
        return cls(job, "released", reason)

    @classmethod
    def deferred(cls, job: Job, why: str, delay: float, *, refused: bool = False, quiet: bool = False) -> Outcome:
        """Asked to wait (``Defer``): pending again in ``delay`` seconds, the attempt not counted,
        no error recorded. ``refused``: the remote service refused it (Telegram's 429); refusals
        lasting MAX_DEFER_SECONDS in a row fail the job. ``quiet``: the limiter logged it already."""
        return cls(job, "deferred", why, delay, refused=refused, quiet=quiet)

    @classmethod
    def cancelled(cls, job: Job, error: str) -> Outcome:
        """Ended for good without an alert (``CancelJob``: a chat that blocked the bot); the
        attempt counted, ``error`` recorded."""
        return cls(job, "cancelled", error)


class Written(NamedTuple):
    """What a held claim's job became once its outcome was written: ``done``, ``pending``
    (``run_at``: when it is due again), ``failed`` (``error``: why; a refused deferral past
    MAX_DEFER_SECONDS fails too) or ``cancelled``."""

    status: str
    run_at: datetime | None = None
    error: str | None = None


#: what every held "done" became
DONE = Written("done")
