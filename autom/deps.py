"""``Deps``: everything a part of the service needs, built once by ``service.py`` and passed explicitly."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio
import trio_util

from autom.config import Settings
from autom.metrics import Metrics

if TYPE_CHECKING:
    from autom.db.bridge import Database
    from autom.jobs.store import JobStore
    from autom.sources.base import Source
    from autom.telegram import TelegramClient


class Doorbell:
    """A wake-up that is never lost between looking and waiting.

    A waiter notes ``count`` before it looks for work and then calls
    ``wait_after(count)``, which returns at once if ``set()`` was called meanwhile.
    """

    __slots__ = ("_count", "_event", "_waiting")

    def __init__(self) -> None:
        self._count = 0
        self._event = trio.Event()
        self._waiting = 0

    @property
    def count(self) -> int:
        """How many times the bell was rung."""
        return self._count

    def set(self) -> None:
        """Ring: wake every waiter (safe to call often; cheap when nobody waits)."""
        self._count += 1
        if self._waiting:
            self._event.set()
            self._event = trio.Event()

    async def wait_after(self, seen: int) -> None:
        """Return once the bell was rung after the ring count ``seen``."""
        if self._count == seen:
            self._waiting += 1
            try:
                await self._event.wait()
            finally:
                self._waiting -= 1


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
    #: set on SIGTERM: stop taking new requests and jobs
    shutdown: trio_util.AsyncBool = field(default_factory=lambda: trio_util.AsyncBool(False))
    started_at: float = field(default_factory=time.time)
