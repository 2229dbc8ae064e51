"""The job queue: models, the store (enqueue/claim/complete/fail/renew) and the retry policy."""
