"""What a registered kind is: its handler and how its jobs run (``App.handler`` makes them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autom.jobs.models import DEFAULT_MAX_ATTEMPTS
from autom.jobs.retry import RetryPolicy

if TYPE_CHECKING:
    from autom.context import HandlerContext
    from autom.jobs.models import Job

Handler = Callable[["HandlerContext", "Job"], Awaitable[None]]
"""A job handler: ``async def handle(ctx: HandlerContext, job: Job) -> None``."""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One registered kind: its handler and how its jobs run.

    ``max_attempts``: stored in the rows of this kind at enqueue when the producer
    does not say. ``timeout``: seconds for one whole run (None: only the lease and the
    shutdown grace bound it); a run past it is cancelled and counts as a failed
    attempt ("timeout"), retried with backoff. ``retry``: this kind's backoff (None:
    RETRY_BASE_SECONDS / RETRY_MAX_SECONDS). ``at_most_once``: a job of this kind is
    never run twice: a run lost with its worker, cut short by a shutdown or ended by an
    error fails the job (README, Reliability).
    """

    kind: str
    fn: Handler
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    timeout: float | None = None
    retry: RetryPolicy | None = None
    builtin: bool = False
    at_most_once: bool = False


def handler_specs(handlers: Mapping[str, HandlerSpec | Handler]) -> dict[str, HandlerSpec]:
    """Kind → ``HandlerSpec``; a bare function gets the defaults (tests and benches pass those)."""
    return {kind: h if isinstance(h, HandlerSpec) else HandlerSpec(kind, h) for kind, h in handlers.items()}
