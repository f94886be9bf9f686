"""Tracing with OpenTelemetry (the `otel` extra): `serve --tracing otlp` imports this
module, and nothing else does, so a proxy without tracing never loads the SDK.

The spans (docs/how-to/tracing-and-logs.md): one per request, a child of the worker's
`traceparent` when it sent one, with the route, resource, epoch, effect id and outcome;
a child per step of a fenced write (`admission`, `upstream`, `receipt`); one per probe.
The upstream is sent the `traceparent` of the span that calls it (W3C trace context).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import TypeVar

from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from core.telemetry import Value

T = TypeVar("T")

# The instrumentation scope the spans are reported under.
TRACER_NAME = "fenceproxy"
# The protocols the `otel` extra brings exporters for (OTEL_EXPORTER_OTLP_PROTOCOL).
PROTOCOLS = ("http/protobuf", "grpc")
# An attribute named without a namespace is the proxy's own.
NAMESPACE = "fenceproxy."


def attribute(name: str) -> str:
    return name if "." in name else NAMESPACE + name


class RequestScope:
    """The span of an open scope (core/telemetry.py's `Scope`)."""

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def rename(self, name: str) -> None:
        self.span.update_name(name)

    def answered(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            # A server span's error is an answer of the server's own failing (5xx);
            # a refusal (4xx) is the proxy doing its job.
            self.span.set_status(Status(StatusCode.ERROR))


class OtelSpans:
    """core/telemetry.py's `Spans`, on a tracer of `provider`."""

    def __init__(self, provider: trace.TracerProvider, version: str | None = None) -> None:
        self._tracer = provider.get_tracer(TRACER_NAME, version)
        # W3C trace context only, whatever OTEL_PROPAGATORS says: `baggage` and any
        # other header pass to the upstream as the worker sent them.
        self._propagator = TraceContextTextMapPropagator()
        self._scope: contextvars.ContextVar[trace.Span | None] = contextvars.ContextVar(
            "scope_span", default=None
        )

    @contextlib.contextmanager
    def scope(
        self, name: str, fields: Mapping[str, Value], incoming: Mapping[str, str] | None
    ) -> Iterator[RequestScope]:
        if incoming is None:
            parent, kind = None, SpanKind.INTERNAL
        else:
            parent, kind = self._propagator.extract(incoming), SpanKind.SERVER
        with self._tracer.start_as_current_span(
            name,
            context=parent,
            kind=kind,
            attributes={attribute(key): value for key, value in fields.items()},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            token = self._scope.set(span)
            try:
                yield RequestScope(span)
            except web.HTTPException:
                # An answer raised (the status page's redirect): its status says it.
                raise
            except BaseException as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                self._scope.reset(token)

    def annotate(self, fields: Mapping[str, Value]) -> None:
        span = self._scope.get()
        if span is not None and span.is_recording():
            span.set_attributes({attribute(key): value for key, value in fields.items()})

    def step(
        self,
        name: str,
        work: Awaitable[T],
        carrier: MutableMapping[str, str] | None,
        then: Callable[[T], Mapping[str, Value]] | None,
    ) -> Awaitable[T]:
        if not trace.get_current_span().is_recording():
            # Not sampled: no span to time it in, but the upstream still learns the
            # trace and that it is not sampled, as the worker's own decision says.
            if carrier is not None:
                self._propagator.inject(carrier)
            return work
        return self._step(name, work, carrier, then)

    async def _step(
        self,
        name: str,
        work: Awaitable[T],
        carrier: MutableMapping[str, str] | None,
        then: Callable[[T], Mapping[str, Value]] | None,
    ) -> T:
        kind = SpanKind.INTERNAL if carrier is None else SpanKind.CLIENT
        with self._tracer.start_as_current_span(name, kind=kind) as span:
            if carrier is not None:
                # Replaces the worker's own: the upstream's parent is this call.
                self._propagator.inject(carrier)
            result = await work
            if then is not None:
                described = dict(then(result))
                error = described.pop("error", None)
                span.set_attributes({attribute(key): value for key, value in described.items()})
                if error is not None:
                    span.set_status(Status(StatusCode.ERROR, str(error)))
            return result

    def inject(self, carrier: MutableMapping[str, str]) -> None:
        self._propagator.inject(carrier)

    def ids(self) -> tuple[str, str] | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


def otlp_provider(instance_id: str, version: str) -> TracerProvider:
    """A provider that exports with OTLP as the standard variables say (the endpoint in
    OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, headers, the
    protocol, the sampler in OTEL_TRACES_SAMPLER); its spans go out in batches, from a
    thread of the SDK's, never from the event loop. Raises ValueError for a protocol
    the extra has no exporter for."""
    environ = os.environ
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or PROTOCOLS[0]
    )
    exporter: SpanExporter
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    elif protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )

        exporter = GrpcSpanExporter()
    else:
        raise ValueError(
            f"OTLP protocol {protocol!r} is not one fenceproxy exports with: "
            f"{' or '.join(PROTOCOLS)}"
        )
    ours: dict[str, str] = {SERVICE_INSTANCE_ID: instance_id, SERVICE_VERSION: version}
    named = "OTEL_SERVICE_NAME" in environ or f"{SERVICE_NAME}=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    if not named:
        ours[SERVICE_NAME] = "fenceproxy"
    provider = TracerProvider(resource=Resource.create(ours))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
