"""Settings: built once from the environment (and ``.env`` in the working directory).

``Settings`` is frozen and validated; secrets are excluded from ``repr`` so a
settings object can be logged. The names and defaults are the README's settings
table (a test holds the two together).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from autom.errors import ConfigError

#: Telegram's rule for a webhook's secret_token (setWebhook refuses anything else)
TELEGRAM_SECRET_RULE = re.compile(r"^[A-Za-z0-9_-]{1,256}$")

#: Settings that ``autom run`` cannot start without, in the order they are reported.
REQUIRED_FOR_RUN = (
    "DATABASE_URL",
    "TELEGRAM_BOT_TOKEN",
    "TELEGRAM_ALERT_CHAT_ID",
    "TELEGRAM_WEBHOOK_SECRET",
    "SITE_WEBHOOK_SECRET",
    "ADMIN_TOKEN",
)


#: The shortest ADMIN_TOKEN accepted: a token guessed at the lockout's pace (20 tries per
#: client per minute) must stay out of reach, from however many clients.
MIN_ADMIN_TOKEN = 24

#: What ROLE (``--role``) may say: which parts of the service one process runs.
ROLES = ("all", "intake", "worker")


@dataclass(frozen=True)
class Settings:
    """Every setting of the contract; attribute names are the lower-cased variable names."""

    database_url: str | None = field(default=None, repr=False)
    telegram_bot_token: str | None = field(default=None, repr=False)
    telegram_alert_chat_id: str | None = None
    telegram_webhook_secret: str | None = field(default=None, repr=False)
    site_webhook_secret: str | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)
    github_webhook_secret: str | None = field(default=None, repr=False)
    stripe_webhook_secret: str | None = field(default=None, repr=False)
    standard_webhook_secret: str | None = field(default=None, repr=False)
    telegram_api: str = "https://api.telegram.org"
    host: str = "0.0.0.0"  # noqa: S104 - the container listens on all interfaces
    port: int = 8000
    workers: int = 8
    job_lease_seconds: float = 60.0
    retry_base_seconds: float = 10.0
    retry_max_seconds: float = 3600.0
    # a job whose sends Telegram keeps refusing (429) fails for good after this long (autom.errors.Defer)
    max_defer_seconds: float = 3600.0
    http_timeout_seconds: float = 10.0
    shutdown_grace_seconds: float = 50.0
    max_body_bytes: int = 1048576
    queue_lag_alert_seconds: float = 300.0
    log_format: str = "json"
    log_level: str = "info"
    retain_done_days: float = 7.0
    retain_events_days: float = 30.0
    tz: str | None = None
    # the console (/ui/)
    console_session_hours: float = 12.0
    # production: which parts this process runs, and the dead-man's switch
    #: all (intake and workers), intake (HTTP only) or worker (workers, schedule, alerts; /health and /metrics)
    role: str = "all"
    #: fetched with GET by each heartbeat job; a healthchecks.io-style URL holds its secret in the path
    heartbeat_url: str | None = field(default=None, repr=False)
    # -- admission and Telegram's limits --
    client_rate: float = 500.0
    trusted_proxies: str | None = None
    max_pending_jobs: int = 100000
    max_pending_per_recipient: int = 1000
    telegram_max_connections: int = 40
    telegram_chat_rate: float = 1.0
    telegram_global_rate: float = 30.0
    # the public API: module:attr of the user's App (autom run/dev --app overrides it)
    autom_app: str | None = None

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        env_file: str | Path | None = ".env",
        require: Iterable[str] = (),
        defaults: Mapping[str, Any] | None = None,
    ) -> Settings:
        """Build settings from ``environ`` (default ``os.environ``) over an optional ``.env`` file.

        The environment wins over the file. ``require`` names settings that must be set
        (non-empty). Every missing or malformed setting is reported in one ``ConfigError``,
        one line each naming the setting. ``defaults`` overrides the contract defaults
        (``autom dev`` uses it for LOG_FORMAT=text).
        """
        values: dict[str, str] = {}
        if env_file is not None and Path(env_file).is_file():
            values.update({k: v for k, v in dotenv_values(env_file).items() if v is not None})
        values.update(os.environ if environ is None else environ)

        kwargs: dict[str, Any] = dict(defaults or {})
        problems: list[str] = []
        for f in dataclasses.fields(cls):
            name = f.name.upper()
            raw = values.get(name)
            if raw is None or raw.strip() == "":
                continue
            try:
                kwargs[f.name] = _parse(name, raw.strip(), f.type)
            except ConfigError as exc:
                problems.append(str(exc))
        problems += [f"missing required setting {name}" for name in require
                     if kwargs.get(name.lower()) in (None, "")]
        settings = cls(**kwargs)  # a setting that did not parse keeps its default here
        problems += settings.problems()
        if problems:
            # every problem at once, one line each: not one per restart
            raise ConfigError("\n".join(problems))
        return settings

    def problems(self) -> list[str]:
        """Every malformed value, one line each naming its setting (empty: all is well)."""
        problems: list[str] = []
        positive = {
            "WORKERS": self.workers, "JOB_LEASE_SECONDS": self.job_lease_seconds,
            "RETRY_BASE_SECONDS": self.retry_base_seconds, "RETRY_MAX_SECONDS": self.retry_max_seconds,
            "MAX_DEFER_SECONDS": self.max_defer_seconds,
            "HTTP_TIMEOUT_SECONDS": self.http_timeout_seconds, "MAX_BODY_BYTES": self.max_body_bytes,
            "QUEUE_LAG_ALERT_SECONDS": self.queue_lag_alert_seconds,
            "CONSOLE_SESSION_HOURS": self.console_session_hours,
            "CLIENT_RATE": self.client_rate, "MAX_PENDING_JOBS": self.max_pending_jobs,
            "MAX_PENDING_PER_RECIPIENT": self.max_pending_per_recipient,
            "TELEGRAM_CHAT_RATE": self.telegram_chat_rate, "TELEGRAM_GLOBAL_RATE": self.telegram_global_rate,
        }
        problems += [f"{name} must be greater than 0" for name, value in positive.items() if value <= 0]
        problems += [f"{name} must not be negative" for name, value in {
            "SHUTDOWN_GRACE_SECONDS": self.shutdown_grace_seconds,
            "RETAIN_DONE_DAYS": self.retain_done_days,
            "RETAIN_EVENTS_DAYS": self.retain_events_days,
        }.items() if value < 0]
        if not 0 <= self.port <= 65535:  # 0 = any free port (tests)
            problems.append("PORT must be between 0 and 65535")
        if self.log_format not in ("json", "text"):
            problems.append("LOG_FORMAT must be json or text")
        if self.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            problems.append("LOG_LEVEL must be one of debug, info, warning, error, critical")
        if not re.match(r"^https?://", self.telegram_api):
            problems.append("TELEGRAM_API must be an http(s) URL")
        if self.telegram_webhook_secret is not None and not TELEGRAM_SECRET_RULE.match(self.telegram_webhook_secret):
            # Telegram refuses any other secret_token at setWebhook; better now than at deploy time
            problems.append("TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Z a-z 0-9 _ - "
                            "(Telegram's rule); generate one with: openssl rand -hex 32")
        if self.admin_token is not None and len(self.admin_token) < MIN_ADMIN_TOKEN:
            problems.append(f"ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN} characters; "
                            "generate one with: openssl rand -hex 32")
        if self.role not in ROLES:
            problems.append(f"ROLE must be one of {', '.join(ROLES)}, got {self.role[:40]!r}")
        if self.heartbeat_url is not None and not re.match(r"^https?://[^/\s]+", self.heartbeat_url):
            problems.append("HEARTBEAT_URL must be an http(s) URL")  # not echoed: it may hold a secret
        if not 1 <= self.telegram_max_connections <= 100:  # Telegram's own range
            problems.append("TELEGRAM_MAX_CONNECTIONS must be between 1 and 100")
        try:
            self.trusted_networks()
        except ConfigError as exc:  # names TRUSTED_PROXIES and the item
            problems.append(str(exc))
        if self.tz is not None:
            from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

            try:
                ZoneInfo(self.tz)
            except (ZoneInfoNotFoundError, ValueError):
                problems.append(f"TZ is not a known time zone: {self.tz!r}")
        return problems

    def trusted_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """TRUSTED_PROXIES as networks (comma- or space-separated addresses and CIDRs)."""
        networks = []
        for item in re.split(r"[\s,]+", self.trusted_proxies or ""):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ConfigError(f"TRUSTED_PROXIES: not an address or CIDR: {item[:60]!r}") from None
        return tuple(networks)

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (tests, ``autom dev``)."""
        return dataclasses.replace(self, **changes)


def _parse(name: str, raw: str, typ: Any) -> Any:
    kind = str(typ)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            value = float(raw)
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(raw)
            return value
    except ValueError:
        expected = "a whole number" if kind == "int" else "a number"
        raise ConfigError(f"{name} must be {expected}, got {raw[:40]!r}") from None
    return raw


def setting_names() -> list[str]:
    """Every environment variable autom reads, upper-case (for .env.example checks)."""
    return [f.name.upper() for f in dataclasses.fields(Settings)]
