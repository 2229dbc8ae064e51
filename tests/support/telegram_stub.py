"""The Telegram Bot API stub now ships as ``autom.testing.telegram_stub`` (users' tests use it too).

This module keeps the old import path, and ``python -m tests.support.telegram_stub``.
"""

from autom.testing.telegram_stub import (
    Receive,
    Reply,
    Scope,
    Send,
    TelegramStub,
    _lifespan,
    _read_body,
    _send_bytes,
    main,
    running_stub,
    serving,
    stub_config,
)

__all__ = ["Receive", "Reply", "Scope", "Send", "TelegramStub", "_lifespan", "_read_body", "_send_bytes", "main",
           "running_stub", "serving", "stub_config"]

if __name__ == "__main__":
    main()
