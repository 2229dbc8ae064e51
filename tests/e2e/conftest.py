"""Fixtures of the tests that run the real ``autom run`` as child processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.processes import AutomProcesses, autom_processes
from tests.support.telegram_stub import TelegramStub, running_stub


@pytest.fixture
async def stub() -> AsyncIterator[TelegramStub]:
    """The Telegram API of every process of the test (listening on 127.0.0.1)."""
    async with running_stub() as telegram:
        yield telegram


@pytest.fixture
async def procs(tmp_path: Path, stub: TelegramStub) -> AsyncIterator[AutomProcesses]:
    """Starts ``autom run`` processes; kills what still runs after the test (before ``stub`` stops)."""
    async with autom_processes(tmp_path) as started:
        yield started
