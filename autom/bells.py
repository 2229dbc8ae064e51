"""Wake-up primitives: the ground floor, imported by every room and importing none of autom.

``Doorbell``: a wake-up that cannot be lost between looking and waiting (new
jobs, finished jobs, room for more). ``AlertBell``: how a worker tells its
process's alert sender that it recorded an alert; a field of ``Deps``.
"""

from __future__ import annotations

import trio


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


class AlertBell:
    """How a worker tells its process's alert sender "I recorded an alert for job N".

    The alert itself is already in the database; the bell only makes the sender look
    now instead of at its next poll, and lets it take this process's own alerts first.
    """

    #: ids kept between two looks; past that the sender's poll finds the rest anyway
    MAX_IDS = 10_000

    def __init__(self) -> None:
        self.doorbell = Doorbell()
        self._job_ids: set[int] = set()

    def ring(self, job_id: int) -> None:
        """An alert for ``job_id`` was recorded by this process."""
        if len(self._job_ids) < self.MAX_IDS:
            self._job_ids.add(job_id)
        self.doorbell.set()

    def take(self) -> list[int]:
        """The job ids rung since the last ``take``."""
        ids, self._job_ids = sorted(self._job_ids), set()
        return ids
