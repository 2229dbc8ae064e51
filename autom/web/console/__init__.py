"""``/ui/``: the console, HTML pages for the person on call (README, Operations: the console).

Server-rendered (Jinja templates in ``templates/``, one stylesheet in ``static/``),
no build step, no script at all, nothing loaded from elsewhere: it works offline
and under the strict Content-Security-Policy every answer carries (``CSP``).

Pages (GET) and actions (POST, each a ``<form method="post">`` with the CSRF token
and a button named after the action)::

    /ui/login            form with one field, token (ADMIN_TOKEN)      POST: log in
    /ui/logout                                                         POST: log out
    /ui/                 overview: jobs by status and kind (capped counts), queue lag,
                         done/failed per minute over the last hour, unsent alerts,
                         last heartbeat, paused kinds (pause/resume forms)
    /ui/jobs             filters status, kind, recipient, event_id, since, until;
                         newest first, keyset pages (before=<last id>), limit ≤ 200
    /ui/jobs/{id}        payload, attempt history, its event      POST .../retry, .../cancel
    /ui/events           filters source, since, until; keyset pages
    /ui/events/{id}      headers, body as JSON and raw, its jobs  POST .../replay
    /ui/retry-failed     filters kind, recipient, since (failed at or after): confirm page
                         with a capped count                      POST: retry them
    /ui/kinds/pause, /ui/kinds/resume                             POST (field kind)

Without a valid session every page and action redirects to ``/ui/login``. With
one, a POST from another site (``Sec-Fetch-Site``/``Origin``) or without the right
CSRF token is 403. Console reads run with a short statement timeout
(``QUERY_SECONDS``): a filter that would scan too much says "narrow the filter",
and a count that timed out shows "—", never a made-up number. Counts stop at
``COUNT_CAP`` ("1,000+").
"""

from __future__ import annotations

from autom.web.console.views import console_blueprint, error_page

__all__ = ["console_blueprint", "error_page"]
