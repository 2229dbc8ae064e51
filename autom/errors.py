"""The one error module of autom.

Third-party errors are translated at the boundary (``raise ... from exc``), so
code above the boundary only ever sees these::

    AutomError
    ├── ConfigError              a setting is missing or malformed (exit 1, one line)
    │   └── AddressInUse         HOST:PORT is taken by another process
    ├── MigrationChanged         an applied migration's file was edited since (run/migrate stop)
    ├── DatabaseUnavailable      PostgreSQL cannot be reached / the connection broke
    ├── QueryError               PostgreSQL refused or aborted a statement (sqlstate, transient)
    ├── NotFound                 an operator asked for a job or event that does not exist
    ├── Conflict                 the operation does not fit the row's state (retry a running job)
    ├── VerificationError        a webhook failed its sender's verification (401)
    ├── ParseError               a verified webhook body is not what its sender sends (a ValueError too)
    ├── BadRequest               an admin request's parameter is malformed (400)
    └── JobError                 raised by handlers to steer the queue
        ├── PermanentError       do not retry: the job fails for good (4xx but 429)
        │   └── CancelJob        do not retry, no alert: the job ends cancelled
        │       └── ChatBlocked  the Telegram chat blocked the bot (403), or is marked so
        ├── TransientError       retry with backoff (5xx, network, timeouts)
        │   └── Retry            retry no sooner than ``after`` seconds (429 retry_after)
        ├── Defer                not now: run again after ``after`` seconds, the attempt not counted
        └── LeaseLost            this run no longer holds its claim: its writes must not commit

The database bridge (``autom.db.bridge``) is the one place psycopg's errors are
translated: a lost connection becomes ``DatabaseUnavailable``, every other
database error a ``QueryError`` (the psycopg error is its ``__cause__``).

Any other ``Exception`` escaping a handler counts as transient. ``BaseException``
(``trio.Cancelled``, ``KeyboardInterrupt``) is never caught by autom.
"""

from __future__ import annotations


class AutomError(Exception):
    """Base of every error autom raises on purpose."""


class ConfigError(AutomError):
    """A setting is missing or malformed; the message names it and never its value."""


class AddressInUse(ConfigError):
    """The HTTP server could not listen: another process holds HOST:PORT (raised by ``autom.web.serve``)."""


class MigrationChanged(AutomError):
    """A migration file no longer matches what was applied to the database (its checksum).

    The message names the file; ``autom run`` and ``autom migrate`` stop with it.
    """


class DatabaseUnavailable(AutomError):
    """PostgreSQL could not be reached, or the connection broke mid-statement.

    ``maybe_applied``: the statement had been sent when the connection broke, so the
    server may have run (and committed) it; False when no connection was had at all.
    """

    def __init__(self, message: str = "", *, maybe_applied: bool = False) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied


class QueryError(AutomError):
    """PostgreSQL refused or aborted a statement (a constraint, a lock or statement timeout, a deadlock...).

    ``sqlstate`` is PostgreSQL's five-character code (``None`` when psycopg had
    none); ``transient`` is true when the same statement may well work if simply
    run again: lock_not_available (55P03), query_canceled (57014: the statement
    timeout), serialization_failure (40001), deadlock_detected (40P01). The
    message may quote the server's, which can hold row data: show operators
    ``sqlstate``, not the message.
    """

    def __init__(self, message: str, *, sqlstate: str | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.transient = transient


class NotFound(AutomError):
    """No job or event has the id an operator asked for."""


class Conflict(AutomError):
    """The row is in a state that does not allow the operation."""


class VerificationError(AutomError):
    """A webhook failed verification; the message is safe to log (no secrets)."""


class ParseError(AutomError, ValueError):
    """A verified body is not what its sender sends; the event is stored without jobs (replayable)."""


class BadRequest(AutomError):
    """A request parameter is malformed; the message is the 400 answer's one line."""


class JobError(AutomError):
    """Raised by handlers (and the clients they use) to tell the queue what to do."""


class PermanentError(JobError):
    """Retrying cannot help (a 4xx other than 429, bad payload): fail the job now."""


class CancelJob(PermanentError):
    """The job's work has no one to go to any more: it ends ``cancelled``, not retried, no alert.

    A ``PermanentError`` too, so code that catches those (a handler that goes on
    after a failed send) catches this as well.
    """


class ChatBlocked(CancelJob):
    """The Telegram chat ``chat_id`` blocked the bot (or the user is deactivated, or the bot
    was kicked): Telegram answered 403, or the chat is marked blocked and nothing was sent."""

    def __init__(self, message: str, *, chat_id: int | str | None = None) -> None:
        super().__init__(message)
        self.chat_id = chat_id


class TransientError(JobError):
    """The world is flaky (5xx, network error, timeout): retry with backoff."""


class Retry(TransientError):
    """Retry, but not sooner than ``after`` seconds from now (HTTP 429 Retry-After)."""

    def __init__(self, message: str, *, after: float) -> None:
        super().__init__(message)
        self.after = max(0.0, float(after))


class Defer(JobError):
    """Not now: run the job again after ``after`` seconds; this attempt does not count.

    The job goes back to pending at now + ``after`` with its attempt given back; no
    error is recorded as a failure and no alert is sent (a send limiter that is out
    of tokens raises it). It keeps its place in its recipient's order.

    ``refused`` (set by the Telegram client when Telegram answered 429, not part of
    the constructor): the remote service refused the work itself. Such deferrals are
    bounded: a job still refused MAX_DEFER_SECONDS after the first of them (waits in
    between do not reset the count; a retry or completion does) fails for good with
    the usual alert, instead of deferring for ever.

    ``quiet`` (set by the send limiter, autom/limits.py): the wait is counted and logged
    there (once a minute), so the worker logs it at debug level only.
    """

    refused = False
    quiet = False

    def __init__(self, message: str = "deferred", *, after: float) -> None:
        super().__init__(message)
        after = float(after)
        self.after = after if after == after and after > 0.0 else 0.0  # NaN and negatives: at once


class LeaseLost(JobError):
    """The run no longer holds its claim (its lease ran out and the job may be another's).

    Raised by a fenced write inside a handler's transaction, so that transaction
    rolls back instead of committing work a newer claim will do again.
    """
