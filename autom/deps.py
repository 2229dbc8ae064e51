"""``Deps``: everything a part of the service needs, built once by ``service.py`` and passed explicitly."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio_util

from autom.bells import AlertBell, Doorbell
from autom.config import Settings
from autom.metrics import Metrics

if TYPE_CHECKING:
    import httpx

    from autom.app import Registry
    from autom.db.bridge import Database
    from autom.events.handoff import HandOff
    from autom.jobs.store import JobStore
    from autom.sources.base import Source
    from autom.telegram import TelegramClient


@dataclass
class Deps:
    """The service's shared parts. No globals: tests build as many as they like."""

    settings: Settings
    db: Database
    store: JobStore
    sources: Mapping[str, Source]
    telegram: TelegramClient
    metrics: Metrics = field(default_factory=Metrics)
    #: rung when this process enqueues due jobs, a NOTIFY arrives, or a job finishes
    doorbell: Doorbell = field(default_factory=Doorbell)
    #: rung by a worker that recorded a job-failure alert (the outbox): the alert sender looks now
    alert_bell: AlertBell = field(default_factory=AlertBell)
    #: set on SIGTERM: stop taking new requests and jobs
    shutdown: trio_util.AsyncBool = field(default_factory=lambda: trio_util.AsyncBool(False))
    started_at: float = field(default_factory=time.time)
    # the public API: the validated App, and the HTTP client handlers get as ctx.http
    registry: Registry | None = None
    http: httpx.AsyncClient | None = None
    #: the worker pool of this process when it also runs the intake (ROLE=all): a lone
    #: delivery's job may be stored claimed and handed to it (autom.events.HandOff)
    handoff: HandOff | None = None
