"""autom: webhooks in, reliable work out.

One trio process serves the webhook intake, a pool of workers over a PostgreSQL
job queue, and a schedule ticker. README.md says what it does and what a user,
an operator and a webhook sender can rely on (commands, settings, routes, queue
semantics).
"""

__version__ = "0.1.0"
