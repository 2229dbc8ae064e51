"""``ctx.once`` under faults, with real ``autom run`` processes and a real PostgreSQL.

The scenarios (tests/support/once_faults.py) count, per key, the side effects that
reached the effect stub, the follow-up jobs the block enqueued and their runs;
``bench/faults.py`` repeats them for many rounds.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import once_faults
from tests.support.restartable_pg import restartable_pg


async def test_a_follow_up_enqueued_in_a_once_block_exists_when_the_handler_fails_later(
        dsn: str, tmp_path: Path) -> None:
    counts = await once_faults.follow_up(tmp_path, dsn)
    assert counts.ok(), counts.summary()
    assert counts.attempts == 2 * len(counts.keys)  # each failed once after its block, then was done


async def test_a_database_restart_during_the_effects_repeats_none_and_loses_no_follow_up(tmp_path: Path) -> None:
    with restartable_pg() as pg:
        counts = await once_faults.outage(tmp_path, pg, "restart", seconds=3)
    assert counts.ok(), counts.summary()


async def test_a_database_freeze_during_the_effects_repeats_none_and_loses_no_follow_up(tmp_path: Path) -> None:
    with restartable_pg() as pg:
        counts = await once_faults.outage(tmp_path, pg, "freeze", seconds=3)
    assert counts.ok(), counts.summary()


async def test_two_runs_sharing_a_key_on_two_replicas_do_the_effect_once(dsn: str, tmp_path: Path) -> None:
    counts = await once_faults.shared_keys(tmp_path, dsn)
    assert counts.ok(), counts.summary()
    assert counts.notes[0].endswith(": 1"), counts.notes  # never two effects of one key at once
