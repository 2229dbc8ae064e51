"""The intake while PostgreSQL is frozen (SIGSTOP of the server and all its processes).

A frozen server keeps its connections open and answers nothing: a statement on its
way or running has an unknown fate until the server resumes. Eight senders keep
delivering Telegram updates while a server of the test's own (``restartable_pg``)
is frozen for longer than a delivery's deadline, or for a few seconds around the
commits; ``tests/support/intake_freeze.py`` runs the round and reads the outcome
before and after the senders retry what got 503. The README's promises
(Reliability): every 202 stored exactly once; a 503 stored only if its statement
had started before the server stopped (and the server stayed stopped past the
deadline); every answer by the documented deadline (10 s; asserted with 2 s to spare,
a correctness bound, not a speed figure); and after the retries every update
stored exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.intake_freeze import DEADLINE, freeze_round
from tests.support.restartable_pg import RestartablePg, restartable_pg


@pytest.fixture
def pg() -> Iterator[RestartablePg]:
    """A migrated PostgreSQL of this test's own, which it may freeze."""
    with restartable_pg() as server:
        yield server


async def test_a_freeze_longer_than_the_deadline_answers_503_by_the_deadline_for_what_was_not_stored(
    pg: RestartablePg,
) -> None:
    result = await freeze_round(pg, DEADLINE + 5.0)
    assert result.problems == [], (result.counts(), result.problems[:10])
    assert result.refused > 0 and result.accepted > 0, result.counts()  # the freeze did refuse, and the rest got in
    assert result.max_seconds <= DEADLINE + 2.0, result.counts()


async def test_a_freeze_of_seconds_around_the_commits_answers_what_was_stored_with_202(pg: RestartablePg) -> None:
    result = await freeze_round(pg, 4.0)
    assert result.problems == [], (result.counts(), result.problems[:10])
    assert result.accepted > 0, result.counts()
    assert result.max_seconds <= DEADLINE + 2.0, result.counts()
