"""The ``telegram_stub`` fixture: a Telegram Bot API stub serving on 127.0.0.1 for one test.

``tests/conftest.py`` imports it (``from tests.support.fixtures_telegram import
telegram_stub  # noqa: F401``); a test file may import it the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.telegram_stub import TelegramStub, running_stub


@pytest.fixture
async def telegram_stub() -> AsyncIterator[TelegramStub]:
    """A fresh stub per test; point TELEGRAM_API at ``telegram_stub.url``."""
    async with running_stub() as stub:
        yield stub
