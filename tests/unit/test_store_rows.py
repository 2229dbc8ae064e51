"""The claim's rows → ``Job`` objects, and the array literals of the hot statements (autom/jobs/store.py)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from autom.jobs.models import Job
from autom.jobs.store import _int_array, _jobs


def _row(i: int) -> dict[str, object]:
    now = datetime.now(UTC)
    return {"id": i, "kind": "k", "payload": {"i": i}, "attempts": 1, "max_attempts": 8, "lease": 3,
            "locked_until": now, "recipient": None if i % 2 else f"r{i}", "key": None, "event_id": 7,
            "run_at": now, "received_at": now, "trace": None}


def test_claimed_rows_become_jobs_equal_to_the_constructor_s() -> None:
    rows = [_row(i) for i in range(3)]
    expected = [Job(**r) for r in rows]  # type: ignore[arg-type]
    jobs = _jobs([dict(r) for r in rows])
    assert jobs == expected
    assert [repr(j) for j in jobs] == [repr(j) for j in expected]
    assert dataclasses.replace(jobs[0], attempts=2) == dataclasses.replace(expected[0], attempts=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        jobs[0].attempts = 5  # type: ignore[misc]
    assert _jobs([]) == []


def test_rows_that_are_not_job_s_fields_are_refused() -> None:
    row = _row(1)
    row["extra"] = 1
    with pytest.raises(TypeError, match="not Job's fields"):
        _jobs([row])
    del row["extra"], row["run_at"]
    with pytest.raises(TypeError, match="not Job's fields"):
        _jobs([row])


def test_int_arrays_are_postgresql_array_literals() -> None:
    assert _int_array([]) == "{}"
    assert _int_array([5]) == "{5}"
    assert _int_array([1, 2, 3 << 40]) == f"{{1,2,{3 << 40}}}"
