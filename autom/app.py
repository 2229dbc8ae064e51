"""``App`` and ``Router``: the user's registry of handlers, sources and schedules (README, Handlers).

A user builds one ``App`` (``@app.handler(kind)``, ``app.source(...)``,
``app.schedule(...)``) and runs it with ``AUTOM_APP=module:attr autom run``; handler
modules register on a ``Router`` and the app does ``app.include(router)``. Invariants:
the built-ins are part of every App (a user handler or source of a built-in name
replaces it); one kind or source name registered twice in the user's code is an
``AppError`` at once; ``App.registry(settings)`` validates the whole App at start and
freezes it into the read-only ``Registry`` the service uses. Also ``load_app``.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from autom.errors import ConfigError
from autom.handlers.spec import Handler, HandlerSpec
from autom.jobs.models import DEFAULT_MAX_ATTEMPTS, NewJob, is_max_attempts
from autom.jobs.retry import RetryPolicy
from autom.schedule import BUILTIN_SCHEDULES, Schedule
from autom.sources.base import Source

if TYPE_CHECKING:
    from autom.config import Settings
    from autom.db.migrate import Migration

log = logging.getLogger("autom.app")

H = TypeVar("H", bound=Callable[..., Awaitable[Any]])
S = TypeVar("S")

#: what ``POST /hooks/{name}`` accepts as a source name (URL-safe, no escaping needed)
SOURCE_NAME = re.compile(r"[a-z0-9_-]+")
#: a job kind: printable, no spaces (it is a metrics label and a log field)
KIND = re.compile(r"[A-Za-z0-9_.:/-]{1,100}")
#: a Telegram bot command, without its "/" (Telegram's rule: 1-32 letters, digits, underscores)
COMMAND = re.compile(r"[A-Za-z0-9_]{1,32}")
#: a callback route: the part of a button's data before the first ":" (data is at most 64 bytes)
CALLBACK_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,63}")


class AppError(ConfigError):
    """The App is wrong (a kind registered twice, a schedule without a handler, a bad source
    name) or could not be loaded from AUTOM_APP: the message says what, in one line."""


def _check_kind(kind: object) -> str:
    if not isinstance(kind, str) or not KIND.fullmatch(kind):
        raise AppError(f"a job kind must be 1-100 characters of A-Z a-z 0-9 _ . : / -, got {kind!r}")
    return kind


def _describe_source(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def check_source(obj: object) -> Source:
    """``obj`` if it meets the ``Source`` protocol with a URL-safe name, else ``AppError``."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not SOURCE_NAME.fullmatch(name):
        raise AppError(f"source {_describe_source(obj)}: name must be [a-z0-9_-]+ (it is the URL "
                       f"/hooks/<name>), got {name!r}")
    for method in ("verify", "dedup_key", "parse"):
        if not callable(getattr(obj, method, None)):
            raise AppError(f"source {name!r}: has no {method}() method (see autom.Source)")
    secret_headers = getattr(obj, "secret_headers", None)
    if not isinstance(secret_headers, frozenset | set | tuple | list) or not all(
        isinstance(h, str) for h in secret_headers
    ):
        raise AppError(f"source {name!r}: secret_headers must be a set of header names (may be empty)")
    if any(h != h.lower() for h in secret_headers):
        raise AppError(f"source {name!r}: secret_headers must be lower-case header names")
    return obj  # type: ignore[return-value]


class Router:
    """Handlers, sources and schedules registered apart from the App; ``app.include(router)`` adds them.

    Every method of ``App`` that registers something is here: a handler module
    makes ``router = Router()`` and decorates with ``@router.handler(...)``.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, HandlerSpec] = {}
        self._sources: dict[str, Source] = {}
        self._schedules: list[Schedule] = []
        self._commands: dict[str, Handler] = {}
        self._callbacks: dict[str, Handler] = {}

    def handler(
        self,
        kind: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        at_most_once: bool = False,
    ) -> Callable[[H], H]:
        """Register the decorated ``async def f(ctx, job) -> None`` for ``kind``; returns ``f`` unchanged.

        ``max_attempts`` (≥ 1): the default stored in this kind's rows at enqueue.
        ``timeout`` (seconds > 0, or None): the longest one run may take.
        ``retry``: a ``RetryPolicy`` for this kind's backoff. ``at_most_once``: never run a
        job of this kind twice (a run lost with its worker, cut short by a shutdown or
        ended by an error fails it, with its alert). A kind registered twice (here or
        through ``include``) raises ``AppError``.
        """
        _check_kind(kind)
        if not is_max_attempts(max_attempts):
            raise AppError(f"handler {kind!r}: max_attempts must be a whole number ≥ 1, got {max_attempts!r}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf")
        ):
            raise AppError(f"handler {kind!r}: timeout must be a number of seconds > 0 or None, got {timeout!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise AppError(f"handler {kind!r}: retry must be an autom.RetryPolicy, got {type(retry).__name__}")

        def register(fn: H) -> H:
            if not _is_async(fn):
                raise AppError(f"handler {kind!r}: {getattr(fn, '__qualname__', fn)!r} must be an async def "
                               "taking (ctx, job)")
            self._add_handler(HandlerSpec(kind, fn, max_attempts, None if timeout is None else float(timeout),
                                          retry, at_most_once=bool(at_most_once)))
            return fn

        return register

    def command(self, name: str) -> Callable[[H], H]:
        """Handle the Telegram command ``/name`` (also ``/name@yourbot``) with the decorated
        ``async def f(ctx, job)``; ``job.payload`` is the ``telegram.message`` payload.

        ``name``: 1-32 letters, digits or underscores (a leading "/" is dropped), matched
        without regard to case. A user command ``ping`` or ``chatid`` replaces the built-in
        one. A name registered twice raises ``AppError``.
        """
        command = name[1:] if isinstance(name, str) and name.startswith("/") else name
        if not isinstance(command, str) or not COMMAND.fullmatch(command):
            raise AppError(f"command {name!r}: a Telegram command is 1-32 letters, digits or underscores")
        command = command.lower()

        def register(fn: H) -> H:
            self._add_route(self._commands, "command", command, fn)
            return fn

        return register

    def callback(self, prefix: str) -> Callable[[H], H]:
        """Handle button presses whose data is ``prefix`` or ``prefix:...`` with the decorated
        ``async def f(ctx, job)``; ``job.payload`` has ``id``, ``data``, ``chat_id``,
        ``message_id`` and ``from``.

        ``prefix``: 1-63 letters, digits, ``_ . -`` (no ":"). Answer the press with
        ``ctx.telegram.answer_callback(job.payload["id"], text)``; one the handler leaves
        unanswered is answered empty when it returns. A prefix registered twice raises ``AppError``.
        """
        if not isinstance(prefix, str) or not CALLBACK_PREFIX.fullmatch(prefix):
            raise AppError(f"callback {prefix!r}: a prefix is 1-63 characters of A-Z a-z 0-9 _ . - (the data "
                           "before the first ':')")

        def register(fn: H) -> H:
            self._add_route(self._callbacks, "callback", prefix, fn)
            return fn

        return register

    def source(self, obj: S) -> S:
        """Accept webhooks at ``POST /hooks/{obj.name}`` with ``obj`` (a ``Source``); returns ``obj``."""
        source = check_source(obj)
        if source.name in self._sources:
            raise AppError(f"source {source.name!r} is registered twice")
        self._sources[source.name] = source
        return obj

    def schedule(
        self,
        kind: str,
        *,
        every_minutes: int | None = None,
        daily_at: str | None = None,
        cron: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Schedule:
        """Enqueue ``kind`` every ``every_minutes`` (UTC slots), daily at ``daily_at`` ("HH:MM", TZ)
        or at each fire time of ``cron`` (five fields, "*/5 * * * *", in TZ).

        The job's payload is ``payload`` plus ``"slot"`` (the slot's key). Its handler
        may be registered before or after; a schedule whose kind has none fails at start.
        """
        _check_kind(kind)
        try:
            spec = Schedule(kind, every_minutes=every_minutes, daily_at=daily_at, cron=cron,
                            payload=dict(payload or {}))
        except ValueError as exc:
            raise AppError(str(exc)) from None
        if any(s.kind == kind and s.describe() == spec.describe() for s in self._schedules):
            raise AppError(f"schedule {kind!r} ({spec.describe()}) is registered twice")
        self._schedules.append(spec)
        return spec

    def include(self, router: Router) -> None:
        """Add everything ``router`` registered; a kind or source name both have raises ``AppError``."""
        if router is self:
            raise AppError("a router cannot include itself")
        for spec in router._handlers.values():
            self._add_handler(spec)
        for source in router._sources.values():
            self.source(source)
        for schedule in router._schedules:
            self.schedule(schedule.kind, every_minutes=schedule.every_minutes, daily_at=schedule.daily_at,
                          cron=schedule.cron, payload=schedule.payload)
        for command, fn in router._commands.items():
            self._add_route(self._commands, "command", command, fn)
        for prefix, fn in router._callbacks.items():
            self._add_route(self._callbacks, "callback", prefix, fn)

    def _add_route(self, routes: dict[str, Handler], what: str, name: str, fn: Handler) -> None:
        if not _is_async(fn):
            raise AppError(f"{what} {name!r}: {getattr(fn, '__qualname__', fn)!r} must be an async def "
                           "taking (ctx, job)")
        if name in routes:
            raise AppError(f"{what} {name!r} is registered twice ({_fn_name(routes[name])} and {_fn_name(fn)})")
        routes[name] = fn

    def _add_handler(self, spec: HandlerSpec) -> None:
        if spec.kind in self._handlers:
            first = self._handlers[spec.kind].fn
            raise AppError(f"handler kind {spec.kind!r} is registered twice ({_fn_name(first)} and "
                           f"{_fn_name(spec.fn)})")
        self._handlers[spec.kind] = spec


def _is_async(fn: object) -> bool:
    """Whether ``fn`` is an ``async def`` (a coroutine function, also through functools.wraps)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__wrapped__", None))


def _fn_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class App(Router):
    """The registry of one autom service: built-ins plus the user's handlers, sources and schedules.

    ``App()`` includes every built-in (README: Sources, Handlers, Schedule).
    ``App(builtins=False)`` starts empty (tests; a deployment that wants none).
    ``App(migrations="migrations")``: a directory of your numbered SQL files
    (``0001_orders.sql``), applied after autom's own; a relative path is taken from
    the directory of the module that makes the App.
    """

    def __init__(self, *, builtins: bool = True, migrations: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        self.builtins = builtins
        self.migrations: Path | None = None
        if migrations is not None:
            folder = Path(migrations)
            caller = sys._getframe(1).f_globals.get("__file__")
            if not folder.is_absolute() and caller:
                folder = Path(caller).resolve().parent / folder
            self.migrations = folder

    def user_migrations(self) -> list[Migration]:
        """The App's own migrations, read from ``migrations`` now (empty without); ``AppError`` if unreadable."""
        from autom.db.migrate import read_migrations

        if self.migrations is None:
            return []
        try:
            return read_migrations(self.migrations)
        except (OSError, ValueError) as exc:
            raise AppError(str(exc)) from None

    def registry(self, settings: Settings) -> Registry:
        """Validate the whole App and freeze it for a service with ``settings``.

        Raises ``AppError`` for a schedule whose kind has no handler. Built-in
        sources are those whose secret is set in ``settings``; a user source of the
        same name replaces one.
        """
        from autom.handlers import builtin_handlers
        from autom.sources import enabled_sources

        handlers: dict[str, HandlerSpec] = {}
        sources: dict[str, Source] = {}
        schedules: list[Schedule] = []
        if self.builtins:
            handlers.update(builtin_handlers())
            sources.update(enabled_sources(settings))
            schedules.extend(BUILTIN_SCHEDULES)
        handlers.update(self._handlers)
        handlers.update(self._telegram_routes(handlers))
        sources.update(self._sources)
        # a user schedule of a built-in kind replaces the built-in one (its slots stay unique by key)
        user_kinds = {s.kind for s in self._schedules}
        schedules = [s for s in schedules if s.kind not in user_kinds] + self._schedules
        missing = sorted({s.kind for s in schedules if s.kind not in handlers})
        if missing:
            raise AppError(f"schedule without a handler: {', '.join(map(repr, missing))} (register one with "
                           "@app.handler)")
        # the schedule's jobs carry the kind's max_attempts like every other enqueue
        schedules = [replace(s, max_attempts=handlers[s.kind].max_attempts) for s in schedules]
        self.user_migrations()  # a missing directory or a misnamed file stops the start
        return Registry(handlers=handlers, sources=sources, schedules=tuple(schedules))

    def _telegram_routes(self, handlers: Mapping[str, HandlerSpec]) -> dict[str, HandlerSpec]:
        """The ``telegram.message`` and ``telegram.callback`` handlers that route to this App's
        commands and callbacks; ``AppError`` if the user's own handler of the kind would hide them."""
        from autom.handlers import telegram_callback, telegram_message

        routed: dict[str, HandlerSpec] = {}
        for kind, routes, make in (("telegram.message", self._commands, telegram_message.routed),
                                   ("telegram.callback", self._callbacks, telegram_callback.routed)):
            if not routes:
                continue
            if kind in self._handlers:
                what = "commands" if kind == "telegram.message" else "callbacks"
                raise AppError(f"@app.handler({kind!r}) replaces the handler that runs the {what} "
                               f"({', '.join(map(repr, sorted(routes)))}): register one or the other")
            spec = handlers.get(kind) or HandlerSpec(kind, make({}), builtin=True)
            routed[kind] = replace(spec, fn=make(routes))
        return routed

    def validate(self, settings: Settings | None = None) -> None:
        """Raise ``AppError`` if this App cannot start (``registry`` without keeping the result)."""
        from autom.config import Settings

        self.registry(settings or Settings())


@dataclass(frozen=True)
class Registry:
    """A validated App, as the running service sees it (read-only)."""

    handlers: Mapping[str, HandlerSpec]
    sources: Mapping[str, Source]
    schedules: tuple[Schedule, ...] = ()
    _max_attempts: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_max_attempts", {k: s.max_attempts for k, s in self.handlers.items()})

    def with_defaults(self, jobs: Iterable[NewJob]) -> list[NewJob]:
        """``jobs`` with each one's ``max_attempts`` set from its kind where the producer left it None."""
        known = self._max_attempts
        return [job if job.max_attempts is not None or job.kind not in known
                else replace(job, max_attempts=known[job.kind]) for job in jobs]

    def replay_sources(self) -> dict[str, Source]:
        """Every source a stored event may come from, to parse it again: every built-in
        (enabled or not, no secret needed to parse) and this App's own."""
        from autom.sources import replay_sources

        return {**replay_sources(), **self.sources}

    def describe(self) -> str:
        """One log line: the registered kinds, sources and schedules."""
        kinds = ", ".join(sorted(self.handlers)) or "-"
        sources = ", ".join(sorted(self.sources)) or "-"
        schedules = ", ".join(f"{s.kind} ({s.describe()})" for s in self.schedules) or "-"
        return f"handlers: {kinds}; sources: {sources}; schedules: {schedules}"


# --- loading AUTOM_APP ---------------------------------------------------------------


def load_app(spec: str, *, setting: str = "AUTOM_APP") -> App:
    """Import ``module:attr`` and return the ``App`` it names.

    The working directory is put on ``sys.path`` (as ``python -m`` would), so a
    module beside the user's ``.env`` imports. Every failure is one ``AppError``
    line naming ``setting``, the module and the error; for an exception raised while
    importing the module, the file and line where it was raised.
    """
    module_name, sep, attr = spec.strip().partition(":")
    if not sep or not module_name or not attr or not all(part.isidentifier() for part in module_name.split(".")):
        raise AppError(f"{setting}={spec!r} must be module:attribute, for example shop_automations:app")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppError(f"{setting}={spec}: cannot import module {module_name!r}: {_where(exc)}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppError(f"{setting}={spec}: module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, App):
        raise AppError(f"{setting}={spec}: {module_name}.{attr} is a {type(obj).__name__}, not an autom.App")
    return obj


def _where(exc: BaseException) -> str:
    """``"ExcType: message (file.py, line N)"``: where the import failed, without a traceback."""
    message = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}, line {exc.lineno})"
    # the user's frames: not importlib's machinery, not this loader
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "importlib" not in f.filename and f.filename != __file__]
    if frames:
        last = frames[-1]
        text += f" ({last.filename}, line {last.lineno})"
    return text

