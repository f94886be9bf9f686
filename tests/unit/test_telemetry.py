"""The telemetry seam (core/telemetry.py) on its own: what a scope's log lines carry,
and, with tracing on, what reaches the spans (proxy/tracing.py's, kept in memory by the
OpenTelemetry SDK). The app's span tree is tests/integration/app/test_tracing.py's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from core import telemetry
from proxy.tracing import OtelSpans


@pytest.fixture
def log_fields() -> Iterator[None]:
    """`serve --log-format json`, tracing off."""
    telemetry.install(None, log_fields=True)
    try:
        yield
    finally:
        telemetry.install(None, log_fields=False)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """`serve --tracing otlp`, every span kept in memory; log lines without fields."""
    collected = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(collected))
    telemetry.install(OtelSpans(provider), log_fields=False)
    try:
        yield collected
    finally:
        telemetry.install(None, log_fields=False)
        provider.shutdown()


def test_requests_open_a_scope_when_log_lines_or_spans_read_it(
    log_fields: None,
) -> None:
    assert telemetry.requests_scoped()
    telemetry.install(OtelSpans(TracerProvider()), log_fields=False)
    assert telemetry.requests_scoped()
    telemetry.install(None, log_fields=False)
    assert not telemetry.requests_scoped()


def test_a_scope_carries_its_fields_and_its_parents_until_it_ends(log_fields: None) -> None:
    assert telemetry.fields() == {}
    with telemetry.scope("probe", effect_id="eff_1") as outer:
        assert outer is None  # tracing off: no span
        assert telemetry.fields() == {"effect_id": "eff_1"}
        with telemetry.scope("request", route="orders"):
            assert telemetry.fields() == {"effect_id": "eff_1", "route": "orders"}
        assert telemetry.fields() == {"effect_id": "eff_1"}
    assert telemetry.fields() == {}


def test_what_the_work_turns_out_to_be_about_is_said_from_then_on(log_fields: None) -> None:
    telemetry.about(epoch=3)  # outside any scope: said to nothing, and no error
    assert telemetry.fields() == {}
    with telemetry.scope("request", route="orders"):
        telemetry.about(resource="order:1", epoch=None)
        assert telemetry.fields() == {"route": "orders", "resource": "order:1"}
    assert telemetry.fields() == {}


def test_tracing_on_a_scope_is_a_span_annotated_with_what_it_is_about(
    exporter: InMemorySpanExporter,
) -> None:
    assert telemetry.ids() is None  # no span open
    with telemetry.scope("request", route="orders") as span:
        assert span is not None
        telemetry.about(effect_id="eff_1", outcome=None)
        ids = telemetry.ids()
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "request"
    assert dict(finished.attributes or {}) == {
        "fenceproxy.route": "orders",
        "fenceproxy.effect_id": "eff_1",
    }
    context = finished.get_span_context()
    assert context is not None
    assert ids == (f"{context.trace_id:032x}", f"{context.span_id:016x}")


async def test_tracing_on_a_step_is_a_child_span_and_the_upstream_learns_it(
    exporter: InMemorySpanExporter,
) -> None:
    async def work() -> int:
        return 7

    headers: dict[str, str] = {}
    with telemetry.scope("request", route="orders"):
        assert await telemetry.step("admission", work()) == 7
        telemetry.inject(headers)
    admission, request = exporter.get_finished_spans()
    assert admission.name == "admission"
    assert admission.parent is not None
    context = request.get_span_context()
    assert context is not None
    assert admission.parent.span_id == context.span_id
    trace_id, span_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
    # The request's span (the step has ended), with whatever flags the SDK sets.
    assert list(headers) == ["traceparent"]
    assert headers["traceparent"].startswith(f"00-{trace_id}-{span_id}-")


def test_tracing_off_nothing_is_injected_nor_known() -> None:
    headers: dict[str, str] = {}
    telemetry.inject(headers)
    assert headers == {}
    assert telemetry.ids() is None
