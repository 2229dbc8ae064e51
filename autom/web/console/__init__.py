"""``/ui/``: the console, HTML pages for the person on call (README, Operations: the console).

``views`` holds the routes (``console_blueprint``), ``pages`` how an answer is made
(templates, security headers, links, notices), ``auth`` the session and CSRF token,
``present`` what the templates show, computed in Python. No script, nothing loaded
from elsewhere, every answer under a strict CSP; without a session everything
redirects to the login. Pages, rules and the error mapping: docs/design/console.md.
"""

from __future__ import annotations

from autom.web.console.pages import error_page
from autom.web.console.views import console_blueprint

__all__ = ["console_blueprint", "error_page"]
