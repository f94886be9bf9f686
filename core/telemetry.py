"""What the work under way is about, for its log lines and, when tracing is on, its spans.

A request (proxy/telemetry.py's middleware) or a probe (reconcile/prober.py) opens a
scope. Code that learns what the work is about says so with `about(...)` (the route,
the resource, the effect id, the epoch, the outcome), and times its steps with
`step(...)`. The JSON log lines of `serve --log-format json` carry the scope's
identifiers; with `serve --tracing otlp` the scope is a span and each step a child span
(proxy/tracing.py, the only module that imports OpenTelemetry).

Both are off by default: no scope is opened for a request then, and `about` and `step`
cost one context variable read or one global read on the fenced request's path.
Nothing here takes a header, a token, an idempotency key or a body: what is said is
only ever these identifiers, which is what keeps those out of every line and span.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import Protocol, TypeVar

Value = str | int | float | bool
T = TypeVar("T")


class Scope(Protocol):
    """The span of a scope, while it is open."""

    def rename(self, name: str) -> None: ...

    def answered(self, status: int) -> None:
        """The HTTP status the scope's request was answered with (5xx is an error)."""


class Spans(Protocol):
    """Tracing, as proxy/tracing.py implements it with OpenTelemetry."""

    def scope(
        self, name: str, fields: Mapping[str, Value], incoming: Mapping[str, str] | None
    ) -> contextlib.AbstractContextManager[Scope]:
        """A span for the scope, a child of the current one or, with `incoming` (a
        request's headers), of the `traceparent` it carries."""

    def annotate(self, fields: Mapping[str, Value]) -> None:
        """Attributes of the innermost open scope's span."""

    def step(
        self,
        name: str,
        work: Awaitable[T],
        carrier: MutableMapping[str, str] | None,
        then: Callable[[T], Mapping[str, Value]] | None,
    ) -> Awaitable[T]: ...

    def inject(self, carrier: MutableMapping[str, str]) -> None: ...

    def ids(self) -> tuple[str, str] | None:
        """The current trace id and span id, in hex, if a span is recording."""


_spans: Spans | None = None
# Set by `serve --log-format json`: requests then open a scope for their log lines.
_log_fields = False
# The identifiers of the innermost open scope: a request's, or a probe's.
_FIELDS: contextvars.ContextVar[dict[str, Value] | None] = contextvars.ContextVar(
    "telemetry_fields", default=None
)


def install(spans: Spans | None, log_fields: bool) -> None:
    """For the process (`serve`, or a test that collects spans or log lines): `spans`
    None is tracing off; `log_fields` is whether log lines carry the scope's fields."""
    global _spans, _log_fields
    _spans = spans
    _log_fields = log_fields


def requests_scoped() -> bool:
    """Whether each request opens a scope: only when something reads it."""
    return _spans is not None or _log_fields


def fields() -> Mapping[str, Value]:
    """The identifiers of the innermost open scope (empty outside any)."""
    return _FIELDS.get() or {}


def ids() -> tuple[str, str] | None:
    return None if _spans is None else _spans.ids()


@contextlib.contextmanager
def scope(
    name: str, incoming: Mapping[str, str] | None = None, **fields: Value
) -> Iterator[Scope | None]:
    """Work about `fields` (a request, a probe) until the block ends: its log lines
    carry them, as they carry those of the scope it is opened in, and with tracing on it
    is a span, given to the block (None when off)."""
    opened = {**(_FIELDS.get() or {}), **fields}
    token = _FIELDS.set(opened)
    try:
        if _spans is None:
            yield None
        else:
            with _spans.scope(name, fields, incoming) as span:
                yield span
    finally:
        _FIELDS.reset(token)


def about(**fields: Value | None) -> None:
    """What the work under way turned out to be about (None: not known): said to its
    log lines from now on, and to its span."""
    current = _FIELDS.get()
    if current is None:
        return
    known = {name: value for name, value in fields.items() if value is not None}
    current.update(known)
    if _spans is not None:
        _spans.annotate(known)


def step(
    name: str,
    work: Awaitable[T],
    carrier: MutableMapping[str, str] | None = None,
    then: Callable[[T], Mapping[str, Value]] | None = None,
) -> Awaitable[T]:
    """`work`, timed as a child span of the scope when tracing is on (else `work` itself,
    untouched). `carrier`: the headers of the request `work` sends, given the step's
    `traceparent`; `then`: the attributes its result adds to the step's span."""
    if _spans is None:
        return work
    return _spans.step(name, work, carrier, then)


def inject(carrier: MutableMapping[str, str]) -> None:
    """Give the headers of a request about to be sent the current span's `traceparent`."""
    if _spans is not None:
        _spans.inject(carrier)
