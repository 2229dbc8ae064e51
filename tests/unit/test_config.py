"""Settings: defaults, parsing, validation, and the error a user sees."""

from __future__ import annotations

import pytest

from autom.config import REQUIRED_FOR_RUN, Settings, setting_names
from autom.errors import ConfigError

FULL = {
    "DATABASE_URL": "postgresql://u:dbpass@db/autom",
    "TELEGRAM_BOT_TOKEN": "123:bot-token-value",
    "TELEGRAM_ALERT_CHAT_ID": "-100",
    "TELEGRAM_WEBHOOK_SECRET": "tg-secret-value",
    "SITE_WEBHOOK_SECRET": "site-secret-value",
    "ADMIN_TOKEN": "admin-token-value-0123456789",
}


def test_defaults_are_the_contracts():
    s = Settings.from_env({}, env_file=None)
    assert (s.host, s.port, s.workers) == ("0.0.0.0", 8000, 8)
    assert (s.job_lease_seconds, s.retry_base_seconds, s.retry_max_seconds) == (60, 10, 3600)
    assert (s.http_timeout_seconds, s.shutdown_grace_seconds, s.max_body_bytes) == (10, 50, 1048576)
    assert (s.queue_lag_alert_seconds, s.log_format, s.log_level) == (300, "json", "info")
    assert (s.retain_done_days, s.retain_events_days) == (7, 30)
    assert s.telegram_api == "https://api.telegram.org"


def test_missing_required_setting_is_named():
    env = dict(FULL)
    del env["TELEGRAM_ALERT_CHAT_ID"]
    with pytest.raises(ConfigError, match=r"^missing required setting TELEGRAM_ALERT_CHAT_ID$"):
        Settings.from_env(env, env_file=None, require=REQUIRED_FOR_RUN)
    with pytest.raises(ConfigError, match="ADMIN_TOKEN"):
        Settings.from_env({**FULL, "ADMIN_TOKEN": "  "}, env_file=None, require=REQUIRED_FOR_RUN)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PORT", "eighty", "PORT must be a whole number"),
        ("PORT", "70000", "PORT must be between 0 and 65535"),
        ("WORKERS", "0", "WORKERS must be greater than 0"),
        ("WORKERS", "2.5", "WORKERS must be a whole number"),
        ("JOB_LEASE_SECONDS", "abc", "JOB_LEASE_SECONDS must be a number"),
        ("RETRY_BASE_SECONDS", "nan", "RETRY_BASE_SECONDS must be a number"),
        ("HTTP_TIMEOUT_SECONDS", "-1", "HTTP_TIMEOUT_SECONDS must be greater than 0"),
        ("LOG_FORMAT", "xml", "LOG_FORMAT must be json or text"),
        ("TZ", "Mars/Olympus", "TZ is not a known time zone"),
        ("TELEGRAM_API", "ftp://x", "TELEGRAM_API must be an http"),
    ],
)
def test_malformed_values_are_named(name, value, message):
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({name: value}, env_file=None)


def test_numbers_parse_and_env_wins_over_dotenv(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("PORT=9000\nWORKERS=3\n# comment\nexport LOG_LEVEL=debug\n"
                        "ADMIN_TOKEN='quoted value of 24 characters'\n")
    s = Settings.from_env({"PORT": "9100"}, env_file=env_file)
    assert (s.port, s.workers, s.log_level) == (9100, 3, "debug")
    assert s.admin_token == "quoted value of 24 characters"


def test_secrets_never_appear_in_repr():
    s = Settings.from_env(FULL, env_file=None)
    text = repr(s)
    for value in ("dbpass", "bot-token-value", "tg-secret-value", "site-secret-value", FULL["ADMIN_TOKEN"]):
        assert value not in text


def test_setting_names_cover_the_contract():
    names = set(setting_names())
    assert set(REQUIRED_FOR_RUN) <= names
    assert {"GITHUB_WEBHOOK_SECRET", "STRIPE_WEBHOOK_SECRET", "STANDARD_WEBHOOK_SECRET", "TZ",
            "RETAIN_EVENTS_DAYS", "QUEUE_LAG_ALERT_SECONDS"} <= names


def test_every_missing_and_malformed_setting_is_reported_at_once_one_line_each():
    env = {"DATABASE_URL": "postgresql://x/y", "PORT": "eighty", "WORKERS": "0", "LOG_FORMAT": "xml",
           "TELEGRAM_WEBHOOK_SECRET": "has spaces!"}
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env, env_file=None, require=REQUIRED_FOR_RUN)
    lines = str(caught.value).splitlines()
    assert lines == [
        "PORT must be a whole number, got 'eighty'",
        "missing required setting TELEGRAM_BOT_TOKEN",
        "missing required setting TELEGRAM_ALERT_CHAT_ID",
        "missing required setting SITE_WEBHOOK_SECRET",
        "missing required setting ADMIN_TOKEN",
        "WORKERS must be greater than 0",
        "LOG_FORMAT must be json or text",
        "TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Z a-z 0-9 _ - (Telegram's rule); "
        "generate one with: openssl rand -hex 32",
    ]
    assert "has spaces" not in str(caught.value)  # a secret's value is never echoed


@pytest.mark.parametrize("secret", ["has spaces", "ümlaut", "a" * 257, "semi;colon"])
def test_a_telegram_secret_telegram_would_refuse_is_refused_at_start(secret):
    with pytest.raises(ConfigError, match="TELEGRAM_WEBHOOK_SECRET must be 1-256 characters"):
        Settings.from_env({**FULL, "TELEGRAM_WEBHOOK_SECRET": secret}, env_file=None, require=REQUIRED_FOR_RUN)
    assert Settings.from_env({**FULL, "TELEGRAM_WEBHOOK_SECRET": "A-z_09" * 40}, env_file=None)


def test_an_admin_token_shorter_than_24_characters_is_a_settings_error_that_never_echoes_it():
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({**FULL, "ADMIN_TOKEN": "x" * 23}, env_file=None, require=REQUIRED_FOR_RUN)
    assert str(caught.value) == ("ADMIN_TOKEN must be at least 24 characters; generate one with: "
                                 "openssl rand -hex 32")
    assert Settings.from_env({**FULL, "ADMIN_TOKEN": "x" * 24}, env_file=None).admin_token == "x" * 24
