"""The retry policy: exponential backoff with jitter, and what an error means for a job."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from autom.errors import PermanentError, Retry

JITTER = 0.2


@dataclass(frozen=True)
class RetryPolicy:
    """``base·2^(attempt-1)`` seconds, capped at ``cap``, ±20 % jitter (the result never exceeds ``cap``)."""

    base: float = 10.0
    cap: float = 3600.0

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 = the first run)."""
        exponent = min(max(attempt, 1) - 1, 62)  # 2**62 s is beyond any cap; avoids overflow
        raw = min(self.cap, self.base * (2.0**exponent))
        jittered = raw * (1.0 - JITTER + 2.0 * JITTER * rand())
        return min(self.cap, jittered)

    def delay_for(self, error: BaseException, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The delay after ``error``: a ``Retry(after=s)`` (HTTP 429) waits at least ``s`` seconds."""
        delay = self.delay(attempt, rand)
        if isinstance(error, Retry):
            delay = max(delay, error.after)
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
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
