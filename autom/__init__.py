"""autom: webhooks in, reliable work out.

One trio process serves the webhook intake, a pool of workers over a PostgreSQL
job queue, and a schedule ticker. README.md says what it does and what a user,
an operator and a webhook sender can rely on (commands, settings, routes, queue
semantics).

The public API (README, "Write your first automation" and "API reference")::

    from autom import App, HandlerContext, Job, NewJob, Parsed, PermanentError, Retry, VerificationError
"""

from autom.app import App, AppError, HandlerSpec, Router
from autom.context import HandlerContext
from autom.errors import PermanentError, Retry, TransientError, VerificationError
from autom.jobs.models import Job, NewJob
from autom.jobs.retry import RetryPolicy
from autom.producer import enqueue, enqueue_sync
from autom.sources.base import Headers, Parsed, ParseError, Source

__version__ = "0.1.0"

__all__ = [
    "App",
    "AppError",
    "HandlerContext",
    "HandlerSpec",
    "Headers",
    "Job",
    "NewJob",
    "ParseError",
    "Parsed",
    "PermanentError",
    "Retry",
    "RetryPolicy",
    "Router",
    "Source",
    "TransientError",
    "VerificationError",
    "__version__",
    "enqueue",
    "enqueue_sync",
]
