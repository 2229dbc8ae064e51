"""JSON answers: every route and every error handler of autom answers through these.

Bodies are built with ``json.dumps`` directly (compact, UTF-8) rather than
Quart's ``jsonify``: the intake answers thousands of times a second and needs
no app-context lookup for a two-key object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from quart import Response

from autom.checks import one_line

JSON = "application/json"


def json_response(status: int, data: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Response:
    """``data`` as a compact JSON body with ``status``."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)
    response = Response(body.encode("utf-8"), status=status, content_type=JSON)
    if headers:
        response.headers.update(headers)
    return response


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """``{"error": message}`` with ``status``; the message is cut to one line (``autom.checks.one_line``:
    whitespace folded, at most 200 characters, anything shaped like a URL or a bot token redacted)."""
    return json_response(status, {"error": one_line(message)}, headers)
