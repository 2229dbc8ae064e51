"""The HTTP side of autom: ``create_app(deps)`` (quart-trio) and ``serve_http`` (hypercorn).

``app.create_app`` assembles the blueprints (``health``, ``intake``, ...);
``serve.serve_http`` runs it in the caller's nursery until ``deps.shutdown``.
"""

from autom.web.app import create_app
from autom.web.serve import ShieldFinalSend, serve_http

__all__ = ["ShieldFinalSend", "create_app", "serve_http"]
