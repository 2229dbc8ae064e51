"""The job queue: models, the one outcome type, the store (enqueue, claim, write outcomes, renew), the retry policy."""
