"""``create_app(deps)``: the quart-trio application, assembled from blueprints.

Every answer is JSON (``{"error": "<one line>"}`` for every error status, Quart's own
included), except the console's HTML pages under ``/ui/``.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, InternalServerError, RequestEntityTooLarge

from autom.admission import Admission
from autom.deps import Deps
from autom.web.admin import admin_blueprint
from autom.web.console import console_blueprint, error_page
from autom.web.door import Door
from autom.web.health import health_blueprint
from autom.web.intake import Intake, intake_blueprint
from autom.web.metrics_route import metrics_blueprint
from autom.web.openapi import openapi_blueprint
from autom.web.params import NameConverter
from autom.web.responses import JSON, error_response

log = logging.getLogger("autom.web")

#: Longest a client may take to send a request body. Webhook bodies are small and
#: senders are servers on good networks; a trickling body only ties up a connection.
BODY_TIMEOUT_SECONDS = 10
#: Longest sending a response may take (our answers are a few dozen bytes).
RESPONSE_TIMEOUT_SECONDS = 10


def create_app(deps: Deps) -> QuartTrio:
    """The HTTP application of one process, bound to ``deps`` (no globals).

    Blueprints: ``health`` (``GET /health``), ``metrics`` (``GET /metrics``), and, unless
    the process runs as ROLE=worker, ``intake`` (``POST /hooks/<source>``, behind the
    ``Door``), ``admin`` (``/admin/...``), the OpenAPI description and the console
    (``/ui/``). Every error status, including Quart's own (404 for an unknown route, 405
    for a wrong method, 413, 408, 500), is answered as ``{"error": "<one line>"}``: a
    webhook sender or an operator's script never sees an HTML page, and a 500 never
    carries a traceback (the log does). The console answers a 404/405 under ``/ui/``
    with a page.
    """
    app = QuartTrio("autom")
    app.config.update(
        MAX_CONTENT_LENGTH=deps.settings.max_body_bytes,
        BODY_TIMEOUT=BODY_TIMEOUT_SECONDS,
        RESPONSE_TIMEOUT=RESPONSE_TIMEOUT_SECONDS,
        # never re-raise into hypercorn (it would answer a bare 500), never a debug page
        PROPAGATE_EXCEPTIONS=False,
        DEBUG=False,
    )
    # "//hooks/x" would otherwise answer a 308 redirect with an HTML body
    app.url_map.merge_slashes = False
    # a recipient's id may hold "/" (routes take it as <name:recipient>)
    app.url_map.converters["name"] = NameConverter
    app.extensions["autom.deps"] = deps

    app.register_blueprint(health_blueprint(deps))
    app.register_blueprint(metrics_blueprint(deps))
    # A worker-only replica (ROLE=worker) serves its health and metrics and nothing
    # else: every other path is 404, so no webhook, admin or console call can land on it.
    if deps.settings.role != "worker":
        admission = Admission(deps)
        app.extensions["autom.admission"] = admission  # serve_http runs its refresh beside hypercorn
        intake = Intake(deps, admission)
        # the door sits in front of Quart's own ASGI handling: it runs before the body is read,
        # and hands a delivery to a known source to the intake itself (Quart never sees it)
        app.asgi_app = cast(Any, Door(cast(Any, app.asgi_app), admission, intake))  # type: ignore[method-assign]
        app.register_blueprint(intake_blueprint(intake))
        app.register_blueprint(admin_blueprint(deps))
        app.register_blueprint(openapi_blueprint())
        app.register_blueprint(console_blueprint(deps))

    _register_error_handlers(app, deps.settings.max_body_bytes)
    return app


def _register_error_handlers(app: QuartTrio, max_body_bytes: int) -> None:
    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        if isinstance(error, RequestEntityTooLarge):
            message = f"body larger than {max_body_bytes} bytes"
        elif error.description and error.description != type(error).description:
            message = error.description  # raised with a message of our own
        else:
            message = (error.name or "error").lower()
        # keep the headers HTTP requires (Allow on 405, Retry-After, ...), not the HTML type
        extra = {k: v for k, v in error.get_headers() if k.lower() != "content-type"}
        if request.path.startswith("/ui/") and status in (404, 405):
            # a person's browser on the console: a page, not JSON
            page = await error_page(status, "There is no such console page." if status == 404 else message)
            page.headers.update(extra)
            return page
        return error_response(status, message, extra)

    @app.errorhandler(InternalServerError)
    async def internal_error(error: InternalServerError) -> Response:
        # Quart has logged the exception with its traceback already (handle_exception)
        return error_response(500, "internal error")

    @app.after_request
    async def json_errors_only(response: Response) -> Response:
        # A safety net: an error answer that slipped past the handlers above (a future
        # route returning a werkzeug response, say) is replaced rather than sent as HTML.
        # the console (/ui/) answers its errors as HTML pages of its own, for people
        if response.status_code >= 400 and response.mimetype != JSON and not request.path.startswith("/ui/"):
            log.warning("non-JSON error answer replaced (status %d)", response.status_code)
            return error_response(response.status_code, f"http {response.status_code}")
        return response
