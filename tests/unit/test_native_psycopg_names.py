"""What autom.db.native takes from psycopg beyond its documented API, touched one by one.

psycopg is pinned to one minor version (pyproject.toml); an upgrade that renames or
reshapes any of these fails here first, before a query hangs or a cancel is lost.
"""

from __future__ import annotations

import inspect

import psycopg
import trio
from psycopg import errors, waiting
from psycopg.conninfo import conninfo_attempts, timeout_from_conninfo
from psycopg.pq import ConnStatus, PipelineStatus, TransactionStatus

from autom.db.native import TrioConnection


def test_the_pinned_psycopg_version() -> None:
    major, minor = psycopg.__version__.split(".")[:2]
    assert (major, minor) == ("3", "3"), "autom.db.native was written against psycopg 3.3: read it again"


def test_generator_entry_points_exist_with_their_shape() -> None:
    connect_gen = inspect.signature(psycopg.AsyncConnection._connect_gen)
    assert list(connect_gen.parameters) == ["conninfo"]  # a classmethod: cls is bound
    assert list(inspect.signature(psycopg.AsyncConnection._cancel_gen).parameters) == ["self"]
    assert list(inspect.signature(psycopg.AsyncConnection._should_cancel).parameters) == ["self"]


def test_wait_is_the_single_blocking_point_we_override() -> None:
    wait = inspect.signature(psycopg.AsyncConnection.wait)
    assert list(wait.parameters) == ["self", "gen", "interval", "timeout"]
    assert list(inspect.signature(TrioConnection.wait).parameters) == list(wait.parameters)
    # the cursor and the pipeline wait through conn.wait() under conn.lock
    for source in (
        inspect.getsource(psycopg.AsyncCursor.execute),
        inspect.getsource(psycopg.AsyncConnection.notifies),
        inspect.getsource(psycopg.AsyncPipeline.__aexit__),
    ):
        assert "self._conn.lock" in source or "self.lock" in source or "self._lock" in source
        assert "wait(" in source
    assert "self.lock" in inspect.getsource(psycopg.AsyncConnection.pipeline)


def test_the_lock_attribute_is_replaced() -> None:
    init = inspect.getsource(psycopg.AsyncConnection.__init__)
    assert "self.lock = " in init
    # taken in a finally block after a cancel (why autom's lock does not checkpoint when free)
    assert "async with self.lock" in inspect.getsource(psycopg.AsyncConnection.pipeline)


def test_the_pipeline_attribute() -> None:
    assert "_pipeline" in psycopg.AsyncConnection.__annotations__
    assert "self._pipeline = None" in inspect.getsource(psycopg.AsyncConnection.pipeline)


def test_wait_timeout_and_wait_states() -> None:
    assert issubclass(errors._WaitTimeout, psycopg.OperationalError)
    assert "_WaitTimeout" in inspect.getsource(psycopg.AsyncConnection.notifies)
    assert {waiting.Wait.R, waiting.Wait.W, waiting.Wait.RW} == set(waiting.Wait)
    assert waiting.Wait.RW == waiting.Wait.R | waiting.Wait.W
    assert {waiting.Ready.NONE, waiting.Ready.R, waiting.Ready.W} <= set(waiting.Ready)


def test_conninfo_helpers_and_enums() -> None:
    params = {"host": "127.0.0.1", "port": "5432", "connect_timeout": "3"}
    assert conninfo_attempts(params) == [{**params, "hostaddr": "127.0.0.1"}]
    assert timeout_from_conninfo(params) == 3
    assert {ConnStatus.OK, ConnStatus.BAD} <= set(ConnStatus)
    assert PipelineStatus.OFF in set(PipelineStatus)
    assert {TransactionStatus.IDLE, TransactionStatus.ACTIVE} <= set(TransactionStatus)


def test_trio_lowlevel_names() -> None:
    for name in ("wait_readable", "wait_writable", "notify_closing", "checkpoint_if_cancelled"):
        assert callable(getattr(trio.lowlevel, name))
