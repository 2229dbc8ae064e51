"""``autom init DIR``: a new project of the user's own that already runs and tests.

It writes an app module (one source, two handlers, one cron schedule, one
migration of the user's own), its tests on ``autom.testing``, ``.env.example``
and a ``.env`` with a fresh secret, a Dockerfile and compose file for the user's
image built on autom's, and a README whose two commands run it (``autom dev``)
and pass its tests. Nothing is overwritten: the directory must be empty or not exist.
"""

from __future__ import annotations

import re
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path

import autom
from autom.errors import AutomError


class InitError(AutomError):
    """``autom init`` cannot write the project (the message says why, in one line)."""


@dataclass(frozen=True)
class Project:
    """What ``autom init`` made: the directory, its module name and the files written."""

    folder: Path
    module: str
    files: tuple[Path, ...]


def module_name(folder: Path) -> str:
    """The app module's name for ``folder``: ``shop`` → ``shop_automations`` (a Python identifier)."""
    stem = re.sub(r"[^a-z0-9]+", "_", folder.name.lower()).strip("_") or "my"
    if stem[0].isdigit():
        stem = f"p{stem}"
    return f"{stem}_automations"


def autom_checkout() -> Path | None:
    """The source checkout this autom runs from, if it is one (then the README installs autom from it)."""
    root = Path(autom.__file__).resolve().parent.parent
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return root if data.get("project", {}).get("name") == "autom" else None


def create_project(folder: Path, *, secret: str | None = None, autom_source: Path | None = None) -> Project:
    """Write a new project into ``folder`` (created; it must be empty if it exists).

    ``secret``: the form source's secret written to ``.env`` (default: a fresh random
    one). ``autom_source``: where the README installs autom from (default: this
    checkout if autom runs from one, else the package index).
    """
    folder = folder.absolute()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise InitError(f"{folder} exists and is not an empty directory: autom init writes a new project")
    module = module_name(folder)
    source = autom_source if autom_source is not None else autom_checkout()
    install = f'pip install "{source}" -e ".[test]"' if source is not None else 'pip install -e ".[test]"'
    values = {
        "name": re.sub(r"[^a-z0-9]+", "-", folder.name.lower()).strip("-") or "my-automations",
        "module": module,
        "install": install,
        "secret": secret or secrets.token_urlsafe(24),
    }
    files = {
        "pyproject.toml": PYPROJECT,
        f"{module}.py": MODULE,
        "migrations/0001_submissions.sql": MIGRATION,
        "tests/conftest.py": CONFTEST,
        f"tests/test_{module}.py": TESTS,
        ".env.example": ENV_EXAMPLE,
        ".env": ENV,
        ".gitignore": GITIGNORE,
        "Dockerfile": DOCKERFILE,
        ".dockerignore": DOCKERIGNORE,
        "compose.yml": COMPOSE,
        "README.md": README,
    }
    written = []
    for name, template in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**values), encoding="utf-8")
        written.append(path)
    return Project(folder=folder, module=module, files=tuple(written))


# --- the templates (str.format: literal braces are doubled) ---------------------------

PYPROJECT = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["autom"]

[project.optional-dependencies]
# pytest, pytest-trio and an embedded PostgreSQL for autom.testing (and for autom dev)
test = ["autom[testing]"]

[tool.setuptools]
py-modules = ["{module}"]

[tool.pytest.ini_options]
trio_mode = true
testpaths = ["tests"]
pythonpath = ["."]
addopts = "-ra"
"""

MODULE = '''\
"""{name}: your automations, served by autom.

- ``POST /hooks/form``: your site posts a form (an HTML form or a JSON object),
  signed ``X-Signature: sha256=<hex HMAC-SHA256 of the raw body>`` with
  FORM_WEBHOOK_SECRET; one ``form.received`` job each (a resent ``id`` counts once).
- ``form.received``: records the submission in your table ``submissions`` once,
  then tells NOTIFY_CHAT_ID on Telegram.
- ``digest``: every day at 09:00 (TZ), the last day's count to NOTIFY_CHAT_ID.

Run it with ``autom dev`` (``.env`` names AUTOM_APP={module}:app); test it with
``python -m pytest``.
"""

from __future__ import annotations

import os
from typing import Any

from autom import App, HandlerContext, Job, NewJob, Parsed
from autom.sources.base import Headers, id_field, load_object, verify_sha256_header
from autom.sources.site import is_form, load_form
from dotenv import dotenv_values

SETTINGS = {{**dotenv_values(".env"), **os.environ}}


def setting(name: str) -> str:
    """A setting of yours from the environment or ``.env``; a missing one stops the start, naming it."""
    value = SETTINGS.get(name)
    if not value:
        raise RuntimeError(f"{{name}} is not set (see .env.example)")
    return value


CHAT = setting("NOTIFY_CHAT_ID")

app = App(migrations="migrations")  # your own tables: migrations/0001_submissions.sql, ...


class FormSource:
    """Your site's forms at ``POST /hooks/form``."""

    name = "form"
    secret_headers = frozenset({{"x-signature"}})

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode("utf-8")

    def verify(self, headers: Headers, body: bytes, now: float) -> None:
        """Accept iff ``X-Signature`` is ``sha256=`` + the HMAC of the raw body."""
        verify_sha256_header(headers, body, self._secret, "x-signature", "form")

    def dedup_key(self, headers: Headers, body: bytes) -> str | None:
        """The submission's ``id``, if it has one: a resend is stored once."""
        try:
            return id_field(self._load(headers, body.decode("utf-8")))
        except ValueError:  # not UTF-8, not a form: parse() says so
            return None

    def parse(self, headers: Headers, text: str) -> Parsed:
        """One ``form.received`` job with the form as its payload."""
        form = self._load(headers, text)
        key = id_field(form)
        return Parsed(key, [NewJob("form.received", form, key=None if key is None else f"form:{{key}}")])

    @staticmethod
    def _load(headers: Headers, text: str) -> dict[str, Any]:
        return load_form(text) if is_form(headers) else load_object(text)


@app.handler("form.received", max_attempts=5)
async def form_received(ctx: HandlerContext, job: Job) -> None:
    """Record the submission once (also across retries), then announce it."""
    email = str(job.payload.get("email") or "someone")
    async with ctx.once(f"submission:{{job.key or job.id}}") as todo:
        if todo:
            async with ctx.transaction() as tx:
                await tx.execute("insert into submissions (job_id, email) values (%s, %s)", [job.id, email])
    # sent by autom's telegram.send job, committed with this job's completion
    await ctx.enqueue("telegram.send", {{"chat_id": CHAT, "text": f"New form from {{email}}"}}, recipient=CHAT)


@app.handler("digest")
async def digest(ctx: HandlerContext, job: Job) -> None:
    """The last day's count of submissions to NOTIFY_CHAT_ID."""
    async with ctx.transaction() as tx:
        count = await tx.fetch_val("select count(*) from submissions where received_at > now() - interval '1 day'")
    await ctx.enqueue("telegram.send", {{"chat_id": CHAT, "text": f"{{count}} form(s) in the last day"}},
                      recipient=CHAT)


app.source(FormSource(setting("FORM_WEBHOOK_SECRET")))
app.schedule("digest", cron="0 9 * * *")  # five cron fields in TZ; the job's payload has its "slot"
'''

MIGRATION = """\
-- Your own tables. autom run, autom dev, autom migrate and the tests apply the numbered
-- files of this folder after autom's own, once each; never edit one that was applied:
-- put a change in the next number (0002_...).
create table submissions (
    id          bigserial primary key,
    job_id      bigint not null,
    email       text not null,
    received_at timestamptz not null default now()
);
"""

CONFTEST = '''\
"""The tests' settings, set before {module} is imported."""

import os

os.environ.setdefault("FORM_WEBHOOK_SECRET", "form-secret-of-the-tests")
os.environ.setdefault("NOTIFY_CHAT_ID", "-100123")
'''

TESTS = '''\
"""{module} on a real PostgreSQL (AUTOM_TEST_DATABASE_URL's server, else an embedded one)."""

from __future__ import annotations

import os
from datetime import UTC, datetime

from autom.testing import hmac_signature, open_testbed

from {module} import app

SECRET = os.environ["FORM_WEBHOOK_SECRET"]
FORM = "application/x-www-form-urlencoded"


async def test_a_signed_form_is_recorded_once_and_announced() -> None:
    body = b"id=42&email=ada%40example.com"
    headers = {{"content-type": FORM, "x-signature": hmac_signature(SECRET, body)}}
    async with open_testbed(app) as bed:
        delivery = await bed.post("form", body, headers)
        assert delivery.status == 202, delivery
        [job] = delivery.jobs
        run = await bed.run(job.id)
        assert run.status == "done", run.error
        assert run.once_keys == ["submission:form:42"]
        run.assert_enqueued("telegram.send", text="New form from ada@example.com")
        assert await bed.db.fetch_val("select count(*) from submissions") == 1
        resent = await bed.post("form", body, headers)
        assert resent.jobs == []  # the same id: no second job


async def test_a_wrong_signature_is_refused() -> None:
    body = b"id=43&email=eve%40example.com"
    async with open_testbed(app) as bed:
        delivery = await bed.post("form", body, {{"content-type": FORM, "x-signature": hmac_signature("wrong", body)}})
    assert delivery.status == 401


async def test_the_digest_counts_the_last_days_forms() -> None:
    async with open_testbed(app, settings={{"tz": "UTC"}}) as bed:
        run = await bed.run_schedule("digest", at=datetime(2026, 1, 5, 9, 0, 30, tzinfo=UTC))
    assert run.status == "done", run.error
    run.assert_enqueued("telegram.send", text="0 form(s) in the last day")
'''

ENV_EXAMPLE = """\
# Your settings; autom dev and autom run read them from the environment or from .env.
AUTOM_APP={module}:app
# the HMAC secret your site signs each form with (X-Signature: sha256=<hex>)
FORM_WEBHOOK_SECRET=change-me
# the Telegram chat that hears of each form and gets the digest
NOTIFY_CHAT_ID=-100123
# autom's own settings (README of autom, Configuration). autom dev needs none of them:
# no DATABASE_URL starts an embedded PostgreSQL, missing secrets are generated, and
# Telegram messages go to the log until TELEGRAM_BOT_TOKEN is set.
# DATABASE_URL=postgresql://user@host/db
# TELEGRAM_BOT_TOKEN=
# TZ=Europe/Berlin
"""

ENV = """\
# Made by autom init (not committed: .gitignore); .env.example lists every setting.
AUTOM_APP={module}:app
FORM_WEBHOOK_SECRET={secret}
NOTIFY_CHAT_ID=-100123
"""

GITIGNORE = """\
.env
.autom/
.venv/
__pycache__/
*.egg-info/
"""

DOCKERFILE = """\
# Your automations in autom's image. Build autom's image first, in autom's checkout:
#     docker build -t autom:local .
# then here: docker build -t {name} .   (or docker compose up -d, compose.yml)
ARG AUTOM_IMAGE=autom:local
FROM ${{AUTOM_IMAGE}}

# autom's image runs `autom run` in /app as user 10001: it imports AUTOM_APP from here,
# applies autom's migrations and then yours (App(migrations="migrations")), and serves
WORKDIR /app
COPY --chown=10001:10001 {module}.py ./
COPY --chown=10001:10001 migrations/ migrations/
ENV AUTOM_APP={module}:app
"""

DOCKERIGNORE = """\
# only the app module and migrations/ go into the image; never .env (secrets)
*
!{module}.py
!migrations/
"""

COMPOSE = """\
# Your automations and their PostgreSQL: docker compose up -d (autom's image autom:local
# built first, see Dockerfile). .env needs autom's settings for `autom run` (autom's
# README, Configuration: TELEGRAM_BOT_TOKEN, TELEGRAM_ALERT_CHAT_ID, ...), yours, and
# POSTGRES_PASSWORD.
services:
  app:
    build: .
    image: {name}:local
    env_file: .env
    environment:
      # wins over a DATABASE_URL in .env: inside compose the database is the db service
      DATABASE_URL: postgresql://autom:${{POSTGRES_PASSWORD:?set POSTGRES_PASSWORD in .env}}@db:5432/autom
      SHUTDOWN_GRACE_SECONDS: "50"
    # SIGTERM drains: running jobs get SHUTDOWN_GRACE_SECONDS, then Docker kills at this
    stop_grace_period: 60s
    ports:
      - "127.0.0.1:8000:8000"
    depends_on:
      db:
        condition: service_healthy
    restart: unless-stopped

  db:
    image: postgres:17.6
    environment:
      POSTGRES_USER: autom
      POSTGRES_PASSWORD: ${{POSTGRES_PASSWORD:?set POSTGRES_PASSWORD in .env}}
      POSTGRES_DB: autom
    volumes:
      - pgdata:/var/lib/postgresql/data
    healthcheck:
      test: ["CMD", "pg_isready", "--host=127.0.0.1", "--username=autom", "--dbname=autom"]
      interval: 5s
      timeout: 5s
      retries: 12
      start_period: 30s
    restart: unless-stopped

volumes:
  pgdata:
"""

README = """\
# {name}

Your automations on autom, in `{module}.py`: your site's signed forms at
`POST /hooks/form`, each recorded once in your own table and announced on
Telegram, and a daily digest at 09:00. In a virtualenv (`python3 -m venv .venv &&
. .venv/bin/activate`):

```sh
{install} && autom dev    # run it on http://127.0.0.1:8000
python -m pytest    # test it
```

`autom dev` reads `.env` (written by `autom init` with a fresh FORM_WEBHOOK_SECRET;
`.env.example` lists every setting), starts an embedded PostgreSQL in `.autom/`
unless DATABASE_URL is set, applies autom's migrations and yours (`migrations/`),
and writes Telegram messages to its log until TELEGRAM_BOT_TOKEN is set. Send it a
signed form from another terminal:

```sh
set -a; . ./.env; set +a
body='id=1&email=ada@example.com'
sig=$(printf '%s' "$body" | openssl dgst -sha256 -hmac "$FORM_WEBHOOK_SECRET" | sed 's/^.* //')
curl -sS -X POST http://127.0.0.1:8000/hooks/form -H "X-Signature: sha256=$sig" \\
  -H 'Content-Type: application/x-www-form-urlencoded' --data-binary "$body"
```

The tests run your handlers through autom's real intake and worker on a throwaway
PostgreSQL: AUTOM_TEST_DATABASE_URL's server if you set it (a server they may
create databases on), else an embedded one.

| file | is |
| --- | --- |
| `{module}.py` | the App: the `form` source, the `form.received` and `digest` handlers, the schedule |
| `migrations/` | your tables, numbered SQL files applied once each after autom's |
| `tests/` | the tests, on `autom.testing` |
| `.env.example` | every setting; `.env` holds yours and is not committed |
| `Dockerfile`, `compose.yml` | your image on autom's, and it with its PostgreSQL |

In production: `autom run` with DATABASE_URL and autom's other settings (autom's
README, Configuration) beside yours; it migrates, then serves. As an image: the
`Dockerfile` puts `{module}.py` and `migrations/` into autom's image (build autom's
first: `docker build -t autom:local .` in autom's checkout), and `compose.yml` runs
it with its PostgreSQL (`docker compose up -d`; `.env` then also needs autom's
settings and POSTGRES_PASSWORD).
"""
