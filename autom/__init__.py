"""autom: webhooks in, reliable work out.

One trio process serves the webhook intake, a pool of workers over a PostgreSQL
job queue, and a schedule ticker. See README.md for what it does and
../shared/CONTRACT.md for the outside contract.
"""

__version__ = "0.1.0"
