"""Prometheus metrics of one process, in its own registry (no globals: tests run many apps).

Counters and histograms move as work happens; the database-derived gauges (jobs
by status and kind, queue lag) are refreshed by ``/metrics`` from one cheap query.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    """Every metric autom exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter(
            "autom_events_total", "Webhook deliveries by source and outcome (accepted, duplicate, rejected)",
            ["source", "outcome"], registry=r,
        )
        self.intake_seconds = Histogram(
            "autom_intake_seconds", "Time to verify and store a webhook delivery", ["source"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1), registry=r,
        )
        self.job_seconds = Histogram(
            "autom_job_duration_seconds", "Handler run time by kind", ["kind"],
            buckets=_DURATION_BUCKETS, registry=r,
        )
        self.job_attempts = Counter(
            "autom_job_attempts_total", "Handler runs by kind and outcome (done, retry, failed, released)",
            ["kind", "outcome"], registry=r,
        )
        self.alerts = Counter(
            "autom_alerts_total", "Telegram alerts by outcome (sent, failed, suppressed)", ["outcome"],
            registry=r,
        )
        self.telegram_waits = Counter(
            "autom_telegram_waits_total",
            "Telegram sends deferred to a later slot by reason (chat, global, sends, pause, held, refused: a 429, "
            "database)",
            ["reason"], registry=r,
        )
        self.workers_busy = Gauge("autom_workers_busy", "Worker slots running a handler now", registry=r)
        self.workers = Gauge("autom_workers", "Worker slots in this process", registry=r)
        self.jobs = Gauge("autom_jobs", "Jobs by status and kind", ["status", "kind"], registry=r)
        self.queue_lag = Gauge(
            "autom_queue_lag_seconds", "How long the oldest due pending job has been waiting", registry=r,
        )
        # admission: what the door and the intake refused, and the backlog they judge by
        self.refusals = Counter(
            "autom_refusals_total",
            "Deliveries refused by reason (rate, failing_client, slow_body, backlog, recipient) and source",
            ["reason", "source"], registry=r,
        )
        self.backlog = Gauge(
            "autom_backlog_estimate", "Unfinished jobs (pending and running) as the intake's admission sees them",
            registry=r,
        )
        self.db_up = Gauge("autom_database_up", "1 when the last database query succeeded", registry=r)
        self.alerts_unsent = Gauge(
            "autom_alerts_unsent", "Alerts in the outbox not delivered yet (all replicas)", registry=r,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
