"""The retry policy: exponential backoff with jitter, and what an error means for a job."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from autom.errors import PermanentError, Retry

JITTER = 0.2

#: A job's error as stored (``last_error``, an attempt's error): at most this many characters
#: and lines. A multi-line message (an API's answer, an SQL error with its DETAIL and caret,
#: a validation report) keeps its lines; lists show its first line, the job's page all of it.
MAX_ERROR = 8000
MAX_ERROR_LINES = 60

#: The longest a 429's ``Retry-After`` (or Telegram's ``retry_after``) may push a job back,
#: unless RETRY_MAX_SECONDS is longer: a sender asking for days (``Retry-After: 999999``)
#: gets an hour, so a job cannot sit invisibly for a week on one bad header.
RETRY_AFTER_CEILING = 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    """``base·2^(attempt-1)`` seconds, capped at ``cap``, ±20 % jitter (the result never exceeds ``cap``).

    A ``Retry(after=s)`` waits at least ``s``, but never longer than ``after_ceiling``
    (``RETRY_AFTER_CEILING``, or ``cap`` if that is longer).
    """

    base: float = 10.0
    cap: float = 3600.0
    after_ceiling: float = RETRY_AFTER_CEILING

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 = the first run)."""
        exponent = min(max(attempt, 1) - 1, 62)  # 2**62 s is beyond any cap; avoids overflow
        raw = min(self.cap, self.base * (2.0**exponent))
        jittered = raw * (1.0 - JITTER + 2.0 * JITTER * rand())
        return min(self.cap, jittered)

    def delay_for(self, error: BaseException, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The delay after ``error``: a ``Retry(after=s)`` (HTTP 429) waits at least ``s`` seconds.

        ``s`` is capped at ``max(cap, after_ceiling)``; a value that is no number of
        seconds (NaN) counts as 0, infinity as the ceiling.
        """
        delay = self.delay(attempt, rand)
        if isinstance(error, Retry):
            after = error.after if error.after == error.after else 0.0  # NaN: no floor
            delay = max(delay, min(max(after, 0.0), max(self.cap, self.after_ceiling)))
        return delay


def is_final(error: BaseException, attempts: int, max_attempts: int) -> bool:
    """Whether the job fails for good: a permanent error, or no attempt left."""
    return isinstance(error, PermanentError) or attempts >= max_attempts


def describe(error: BaseException | str, limit: int = 2000) -> str:
    """A one-line ``last_error`` for an exception (type and message), cut to ``limit`` characters."""
    if isinstance(error, str):
        text = error
    else:
        message = str(error)
        text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    # PostgreSQL text cannot hold NUL: an error message with one would make its write fail
    text = " ".join(text.replace("\x00", "\ufffd").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_text(error: BaseException | str, limit: int = MAX_ERROR, max_lines: int = MAX_ERROR_LINES) -> str:
    """The stored error of a run: type and message with its lines kept (unlike ``describe``).

    Line ends become ``\\n``; trailing whitespace and blank lines at either end are dropped, runs of
    blank lines become one; indentation stays (an SQL error's caret). At most ``max_lines`` lines
    (then a line saying how many more) and ``limit`` characters (cut with "…"). NUL, which
    PostgreSQL text cannot hold, becomes U+FFFD.
    """
    if isinstance(error, str):
        text = error
    else:
        message = str(error)
        text = f"{type(error).__name__}: {message}" if message.strip() else type(error).__name__
    lines: list[str] = []
    for line in text.replace("\x00", "\ufffd").splitlines():
        line = line.rstrip()
        if line or (lines and lines[-1]):
            lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], f"… ({len(lines) - max_lines + 1} more lines)"]
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit - 1] + "…"
