"""OpenTelemetry tracing: on with the ``otel`` extra and OpenTelemetry's own environment.

``setup()`` (once, at the service's start) turns it on when ``wanted`` says the
environment asks for traces and the SDK is installed; until then, and without either,
every hook here is a check of one module global and nothing of ``opentelemetry`` is
imported. Spans: ``POST /hooks/{source}`` per delivery (an incoming ``traceparent``
continued), ``job {kind}`` per attempt, a child of the context stored with the job
(``jobs.trace``, a W3C traceparent: the delivery's, or the job's that enqueued it),
and httpx's client spans for ``ctx.http`` and Telegram (``traceparent`` sent on).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from autom.jobs.models import Job, NewJob

log = logging.getLogger("autom.tracing")

#: the default service.name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one
SERVICE_NAME = "autom"
#: the exporter OTEL_TRACES_EXPORTER=otlp means here, by OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL
_OTLP = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc", "": "otlp_proto_http"}


class _Tracing:
    """What ``setup`` made: the tracer, the provider, the propagators."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("autom")
        self.trace = trace
        self.context = context
        self.propagate = propagate
        self.stored = TraceContextTextMapPropagator()  # jobs.trace is always a W3C traceparent


_on: _Tracing | None = None
_setup_done = False


def active() -> bool:
    """Whether this process records traces (``setup`` started them)."""
    return _on is not None


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether OpenTelemetry's environment in ``environ`` asks for traces: OTEL_TRACES_EXPORTER
    set and not ``none``, or (unset) an OTLP endpoint given; never with OTEL_SDK_DISABLED=true."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The ``opentelemetry_traces_exporter`` entry points OTEL_TRACES_EXPORTER names (default
    ``otlp``); ``otlp`` is OTLP over HTTP unless OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL is grpc."""
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", ""))
    return [_OTLP.get(protocol.strip().lower(), "otlp_proto_http") if n == "otlp" else n
            for n in names if n != "none"]


def setup(environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on if the environment asks for it and the ``otel`` extra is installed
    (a warning if it is not); whether it is on. Only the first call in a process decides."""
    global _on, _setup_done
    if _setup_done:
        return _on is not None
    _setup_done = True
    environ = os.environ if environ is None else environ
    if not wanted(environ):
        return False
    try:
        _on = _start(environ)
    except ImportError as exc:
        log.warning("OTEL_* asks for traces but the otel extra is not installed (pip install \"autom[otel]\"): "
                    "tracing is off (%s)", exc)
        return False
    except Exception as exc:  # a bad exporter name or setting must not stop the service
        log.warning("tracing is off: %s: %s", type(exc).__name__, exc)
        return False
    log.info("tracing on: exporter %s", ",".join(exporter_names(environ)))
    return True


def _start(environ: Mapping[str, str]) -> _Tracing:
    """The SDK's TracerProvider (its resource, sampler and batch settings from OTEL_*), one
    BatchSpanProcessor per exporter named, made the global provider."""
    from importlib.metadata import entry_points

    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = "OTEL_SERVICE_NAME" in environ or "service.name" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": SERVICE_NAME}))
    for name in exporter_names(environ):
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            raise ImportError(f"no span exporter {name!r} is installed")
        provider.add_span_processor(BatchSpanProcessor(found[0].load()()))
    trace.set_tracer_provider(provider)
    return _Tracing(provider)


def traceparent() -> str | None:
    """The current span's context as a W3C ``traceparent`` (to store with a job), or None."""
    if _on is None:
        return None
    carrier: dict[str, str] = {}
    _on.stored.inject(carrier)
    return carrier.get("traceparent")


def stamped(jobs: list[NewJob]) -> list[NewJob]:
    """``jobs``, each without a trace given the current span's (``traceparent``)."""
    if _on is None or not jobs:
        return jobs
    trace = traceparent()
    return [job if job.trace is not None else dataclasses.replace(job, trace=trace) for job in jobs]


class _Untraced:
    """The delivery span when tracing is off: does nothing."""

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def answered(self, status: int | None) -> None:
        """Nothing to record."""


_UNTRACED = _Untraced()


class _Delivery(_Untraced):
    """The server span of one delivery, current while it is open."""

    def __init__(self, on: _Tracing, source: str, headers: Mapping[str, str]) -> None:
        parent = on.propagate.extract(headers)
        self._on = on
        self._span = on.tracer.start_span(
            "POST /hooks/{source}", context=parent, kind=on.trace.SpanKind.SERVER,
            attributes={"http.request.method": "POST", "http.route": "/hooks/{source}",
                        "url.path": f"/hooks/{source}", "autom.source": source})
        self._token = on.context.attach(on.trace.set_span_in_context(self._span, parent))

    def __exit__(self, *exc: object) -> None:
        self._on.context.detach(self._token)
        if isinstance(exc[1], BaseException):
            self._span.record_exception(exc[1])
        self._span.end()

    def answered(self, status: int | None) -> None:
        """Record the answer's status (None: the sender left first); 5xx marks the span an error."""
        if status is None:
            self._span.set_attribute("autom.outcome", "sender gone")
            return
        self._span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self._span.set_status(self._on.trace.StatusCode.ERROR)


def delivery(source: str, headers: Mapping[str, str]) -> _Untraced:
    """A context manager: the server span of a delivery to ``source`` (lower-case ``headers``),
    continuing their ``traceparent``; ``.answered(status)`` records the answer."""
    if _on is None:
        return _UNTRACED
    return _Delivery(_on, source, headers)


def job_started(job: Job) -> Any:
    """Start the span of an attempt of ``job``, in the trace stored with it, current until
    ``job_ended``; None when tracing is off."""
    if _on is None:
        return None
    on = _on
    parent = on.stored.extract({"traceparent": job.trace}) if job.trace else on.context.Context()
    span = on.tracer.start_span(
        f"job {job.kind}", context=parent, kind=on.trace.SpanKind.CONSUMER,
        attributes={"autom.job.id": job.id, "autom.job.kind": job.kind, "autom.job.attempt": job.attempts})
    return span, on.context.attach(on.trace.set_span_in_context(span, parent))


def job_ended(started: Any, outcome: Any) -> None:
    """End ``job_started``'s span: ``outcome`` (an ``autom.jobs.outcome.Outcome``) None is done,
    else its ``status`` and its ``error`` are recorded (failed and retry: an error)."""
    if started is None or _on is None:
        return
    span, token = started
    _on.context.detach(token)
    if outcome is not None:
        span.set_attribute("autom.job.outcome", outcome.status)
        if outcome.status in ("failed", "retry"):
            error = getattr(outcome, "error", None)
            span.set_status(_on.trace.StatusCode.ERROR, error)
    span.end()


def instrument_http(client: httpx.AsyncClient, *, secret: str = "") -> None:
    """Client spans for ``client``'s requests, with ``traceparent`` sent on (httpx's instrumentation).

    ``secret`` (the Telegram token in its URLs) is replaced in the span's attributes, and
    its name says the method (``telegram sendMessage``).
    """
    if _on is None:
        return
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    async def hook(span: Any, request: Any) -> None:
        if not secret or not span.is_recording() or secret not in str(request.url):
            return
        for key, value in dict(span.attributes or {}).items():
            if isinstance(value, str) and secret in value:
                span.set_attribute(key, value.replace(secret, "REDACTED"))
        span.update_name(f"telegram {str(request.url).rstrip('/').rsplit('/', 1)[-1]}")

    HTTPXClientInstrumentor.instrument_client(client, tracer_provider=_on.provider, request_hook=hook)
