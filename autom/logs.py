"""Log lines: one JSON object per line (LOG_FORMAT=json) or readable text (LOG_FORMAT=text).

Context goes in ``extra=``: ``log.info("job done", extra={"job_id": 5, "kind": "x"})``.
The fields listed in ``CONTEXT_FIELDS`` are emitted when present. Nothing here
knows secrets: callers never pass tokens, signatures or full bodies.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

CONTEXT_FIELDS = (
    "event_id", "job_id", "kind", "attempt", "duration_ms", "source", "status", "recipient",
    "outcome", "error", "delay_s", "slot", "count", "worker", "method", "path", "remote", "role",
    "traceback",
)


class JsonFormatter(logging.Formatter):
    """``{"ts","level","logger","msg", ...context}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as one JSON line."""
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level logger: message key=value ...`` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as one readable line."""
        ts = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        extras = " ".join(
            f"{name}={record.__dict__[name]}" for name in CONTEXT_FIELDS
            if name != "traceback" and record.__dict__.get(name) is not None
        )
        text = f"{ts} {record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if extras:
            text += "  " + extras
        if record.__dict__.get("traceback"):  # a failed run's, below its line (WorkerPool.written)
            text += "\n" + str(record.__dict__["traceback"]).rstrip("\n")
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure_logging(fmt: str = "json", level: str = "info") -> None:
    """Send every log record to stderr in ``fmt``; called once, by the CLI."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # hypercorn logs every request twice at info; we log requests ourselves where it matters
    logging.getLogger("hypercorn.access").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    # the pool warns on every failed reconnect; our own code logs outages once, with context
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
