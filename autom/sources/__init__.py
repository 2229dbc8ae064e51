"""Webhook sources: who may post to ``POST /hooks/{name}`` and what their deliveries mean.

Each source (README, Sources) verifies a delivery as its sender documents
it, names the redelivery key, and turns a verified body into jobs. A source is
enabled when its secret is set; ``enabled_sources`` builds the enabled ones.
``replay_sources`` builds every known one without a secret, to parse stored
events again (``autom replay``).
"""

from __future__ import annotations

import base64
import secrets

from autom.config import Settings
from autom.sources.base import Headers, Parsed, ParseError, Source
from autom.sources.github import GitHubSource
from autom.sources.site import SiteSource
from autom.sources.standard import StandardSource
from autom.sources.stripe import StripeSource
from autom.sources.telegram import TelegramSource

__all__ = [
    "GitHubSource",
    "Headers",
    "ParseError",
    "Parsed",
    "SiteSource",
    "Source",
    "StandardSource",
    "StripeSource",
    "TelegramSource",
    "disabled_sources",
    "enabled_sources",
    "replay_sources",
]


#: Each built-in source's secret setting: the source is enabled when it is set.
SECRET_SETTINGS = {
    "telegram": "TELEGRAM_WEBHOOK_SECRET",
    "site": "SITE_WEBHOOK_SECRET",
    "github": "GITHUB_WEBHOOK_SECRET",
    "stripe": "STRIPE_WEBHOOK_SECRET",
    "standard": "STANDARD_WEBHOOK_SECRET",
}


def disabled_sources(settings: Settings) -> dict[str, str]:
    """The built-in sources whose secret is unset, each with the setting that would enable it."""
    return {name: setting for name, setting in SECRET_SETTINGS.items() if not getattr(settings, setting.lower())}


def enabled_sources(settings: Settings) -> dict[str, Source]:
    """The sources whose secret is set (non-empty), by name, in the contract's order.

    Raises ``ConfigError`` if STANDARD_WEBHOOK_SECRET is set but is not ``whsec_<base64>``,
    so a mistyped secret stops start-up instead of rejecting every delivery.
    """
    sources: list[Source] = []
    if settings.telegram_webhook_secret:
        sources.append(TelegramSource(settings.telegram_webhook_secret))
    if settings.site_webhook_secret:
        sources.append(SiteSource(settings.site_webhook_secret))
    if settings.github_webhook_secret:
        sources.append(GitHubSource(settings.github_webhook_secret))
    if settings.stripe_webhook_secret:
        sources.append(StripeSource(settings.stripe_webhook_secret))
    if settings.standard_webhook_secret:
        sources.append(StandardSource(settings.standard_webhook_secret))
    return {source.name: source for source in sources}


def replay_sources() -> dict[str, Source]:
    """Every known source by name, for parsing stored events again: no secret needed.

    ``parse`` and ``dedup_key`` never read the secret (``Source``), so these are built
    with a random throwaway one each: they parse like the enabled ones, and their
    ``verify`` accepts nothing anyone could have signed. Never used for intake.
    """
    def throwaway() -> str:
        return secrets.token_hex(32)

    standard = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
    sources: list[Source] = [
        TelegramSource(throwaway()),
        SiteSource(throwaway()),
        GitHubSource(throwaway()),
        StripeSource(throwaway()),
        StandardSource(standard),
    ]
    return {source.name: source for source in sources}
