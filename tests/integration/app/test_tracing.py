"""Spans and JSON log lines of the real app, collected with the OpenTelemetry SDK's
in-memory exporter: the span tree of a fenced write (the request, its admission, the
upstream call and the receipt), the worker's `traceparent` continued to the upstream
through the proxy's own span, a probe's span, and the lines of one effect. SQLite only:
what is traced does not depend on the store."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pytest_aiohttp import AiohttpServer

from core import telemetry
from demo.upstream import make_app as make_upstream_app
from proxy.telemetry import JsonLines
from proxy.tracing import OtelSpans
from tests.integration.app.conftest import PROBE_BY_KEY, FenceFactory, poll_until

# A worker's own trace: its id and the worker's span the request is sent from.
WORKER_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
WORKER_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{WORKER_TRACE_ID}-{WORKER_SPAN_ID}-01"


@pytest.fixture
def backend() -> str:
    return "sqlite"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on, as `serve --tracing` turns it on, with every span kept in memory."""
    collected = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(collected))
    telemetry.install(OtelSpans(provider), log_fields=True)
    try:
        yield collected
    finally:
        telemetry.install(None, log_fields=False)
        provider.shutdown()


class Lines(logging.Handler):
    """The proxy's log lines as `serve --log-format json` writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonLines())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def parsed(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]


@pytest.fixture
def log_lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("fenceproxy")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@dataclass
class RecordingUpstream:
    """The demo upstream, with every request's method, path and headers kept in `seen`
    (its own record keeps only writes' headers, and not a probe's)."""

    url: str
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def headers_of(self, method: str, path: str | None = None) -> list[dict[str, str]]:
        """The headers of each request with this method (and path), in order."""
        return [
            headers
            for seen_method, seen_path, headers in self.seen
            if seen_method == method and path in (None, seen_path)
        ]


@pytest.fixture
async def recording_upstream(aiohttp_server: AiohttpServer, tmp_path: Path) -> RecordingUpstream:
    recording = RecordingUpstream("")

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        recording.seen.append((request.method, request.path, dict(request.headers)))
        response: web.StreamResponse = await handler(request)
        return response

    app = make_upstream_app(str(tmp_path / "upstream.db"))
    app.middlewares.insert(0, record)
    server = await aiohttp_server(app, host="127.0.0.1")
    recording.url = f"http://127.0.0.1:{server.port}"
    return recording


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    found: int = span.context.span_id
    return found


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    found: int = span.context.trace_id
    return found


async def test_a_fenced_write_is_a_request_span_with_admission_upstream_and_receipt(
    make_fence: FenceFactory,
    exporter: InMemorySpanExporter,
    recording_upstream: RecordingUpstream,
) -> None:
    fence = await make_fence(upstream_url=recording_upstream.url)
    lease = await fence.acquire("supplier:sku-1")
    exporter.clear()
    response = await fence.order(
        "sku-1", lease["token"], "key-1", headers={"traceparent": TRACEPARENT}
    )
    assert response.status == 201, await response.text()
    effect_id = response.headers["Fence-Effect-Id"]

    spans = exporter.get_finished_spans()
    (request,) = by_name(spans, "POST place-order")
    (admission,) = by_name(spans, "admission")
    (upstream,) = by_name(spans, "upstream")
    (receipt,) = by_name(spans, "receipt")
    # The request continues the worker's trace; the steps are its children.
    assert request.kind is SpanKind.SERVER
    assert format(trace_id(request), "032x") == WORKER_TRACE_ID
    assert format(parent_id(request) or 0, "016x") == WORKER_SPAN_ID
    for step in (admission, upstream, receipt):
        assert parent_id(step) == span_id(request), step.name
        assert trace_id(step) == trace_id(request)
    # In order, each within the request.
    assert request.start_time is not None and request.end_time is not None
    assert admission.end_time is not None and upstream.start_time is not None
    assert upstream.end_time is not None and receipt.start_time is not None
    assert request.start_time <= admission.start_time  # type: ignore[operator]
    assert admission.end_time <= upstream.start_time
    assert upstream.end_time <= receipt.start_time
    assert receipt.end_time <= request.end_time  # type: ignore[operator]
    assert (
        dict(request.attributes or {}).items()
        >= {
            "fenceproxy.route": "place-order",
            "fenceproxy.resource": "supplier:sku-1",
            "fenceproxy.epoch": lease["epoch"],
            "fenceproxy.effect_id": effect_id,
            "fenceproxy.outcome": "committed",
            "http.request.method": "POST",
            "url.path": "/orders/sku-1",
            "http.response.status_code": 201,
        }.items()
    )
    assert upstream.kind is SpanKind.CLIENT
    assert dict(upstream.attributes or {}) == {"http.response.status_code": 201}

    # The upstream was sent the proxy's upstream span as its parent, in the worker's trace.
    (write,) = recording_upstream.headers_of("POST")
    assert write["traceparent"] == (f"00-{WORKER_TRACE_ID}-{format(span_id(upstream), '016x')}-01")


async def test_a_refusal_is_a_request_span_with_its_code_and_no_secret(
    make_fence: FenceFactory, exporter: InMemorySpanExporter
) -> None:
    fence = await make_fence()
    lease = await fence.acquire("supplier:sku-2")
    await fence.revoke("supplier:sku-2")
    exporter.clear()
    response = await fence.order("sku-2", lease["token"], "key-stale-2", body={"secret": "b0dy"})
    assert response.status == 409, await response.text()
    spans = exporter.get_finished_spans()
    (request,) = by_name(spans, "POST place-order")
    attributes = dict(request.attributes or {})
    assert attributes["fenceproxy.outcome"] == "refused"
    assert attributes["fenceproxy.refusal"] == "stale_epoch"
    assert request.status.status_code is not StatusCode.ERROR  # a refusal is no failure
    # The request's secrets are in no span: neither the token, nor the key, nor the body.
    for span in spans:
        text = json.dumps({**dict(span.attributes or {}), "name": span.name})
        for secret in (lease["token"], "key-stale-2", "b0dy"):
            assert secret not in text, (span.name, secret)


async def test_a_probe_is_a_span_of_its_own_whose_upstream_call_carries_it(
    make_fence: FenceFactory,
    exporter: InMemorySpanExporter,
    log_lines: Lines,
    recording_upstream: RecordingUpstream,
) -> None:
    fence = await make_fence(upstream_url=recording_upstream.url, reconcile=PROBE_BY_KEY)
    lease = await fence.acquire("supplier:sku-3")
    response = await fence.order(
        "sku-3", lease["token"], "key-3", headers={"Demo-Drop-Response": "1"}
    )
    assert response.status == 504, await response.text()
    effect_id = response.headers["Fence-Effect-Id"]
    fence.clock.advance(3)  # past settle_s: the probe's answer is believed

    async def settled() -> bool:
        state: str = (await fence.effect(effect_id))["state"]
        return state == "COMMITTED"

    await poll_until(settled, "the probe settling the effect")
    spans = exporter.get_finished_spans()
    (request,) = by_name(spans, "POST place-order")
    assert dict(request.attributes or {})["fenceproxy.outcome"] == "unknown"
    probes = [
        span
        for span in by_name(spans, "probe")
        if dict(span.attributes or {}).get("fenceproxy.conclusion") == "committed"
    ]
    (probe,) = probes
    assert (
        dict(probe.attributes or {}).items()
        >= {
            "fenceproxy.route": "place-order",
            "fenceproxy.resource": "supplier:sku-3",
            "fenceproxy.effect_id": effect_id,
            "fenceproxy.epoch": lease["epoch"],
            "fenceproxy.upstream_status": 200,
        }.items()
    )
    # The background's probe starts a trace of its own; its upstream call is its child,
    # and the upstream was sent that call's span as its parent.
    assert probe.parent is None
    (asked,) = [span for span in by_name(spans, "upstream") if parent_id(span) == span_id(probe)]
    probe_requests = recording_upstream.headers_of("GET", "/orders/by-key/key-3")
    assert asked.context is not None
    flags = format(asked.context.trace_flags, "02x")
    assert probe_requests[-1]["traceparent"] == (
        f"00-{format(trace_id(probe), '032x')}-{format(span_id(asked), '016x')}-{flags}"
    )

    # The lines about this effect carry its id and resource: the request's (outcome
    # unknown) with the request's id, the probe's without one.
    about_it = [line for line in log_lines.parsed() if line.get("effect_id") == effect_id]
    assert {line["logger"] for line in about_it} >= {"fenceproxy", "fenceproxy.reconcile"}
    for line in about_it:
        assert line["resource"] == "supplier:sku-3"
        assert {"time", "level", "message"} <= line.keys()
        assert "trace_id" in line
    (unknown,) = [line for line in about_it if line["logger"] == "fenceproxy"]
    assert unknown["request_id"] and unknown["route"] == "place-order"
    assert unknown["trace_id"] == format(trace_id(request), "032x")
    assert all("key-3" not in line for line in log_lines.lines)


async def test_a_request_the_worker_did_not_sample_records_nothing_and_says_so_upstream(
    make_fence: FenceFactory,
    exporter: InMemorySpanExporter,
    recording_upstream: RecordingUpstream,
) -> None:
    fence = await make_fence(upstream_url=recording_upstream.url)
    lease = await fence.acquire("supplier:sku-4")
    exporter.clear()
    unsampled = f"00-{WORKER_TRACE_ID}-{WORKER_SPAN_ID}-00"
    response = await fence.order(
        "sku-4", lease["token"], "key-4", headers={"traceparent": unsampled}
    )
    assert response.status == 201, await response.text()
    assert exporter.get_finished_spans() == ()
    (write,) = recording_upstream.headers_of("POST")
    version, trace, parent, flags = write["traceparent"].split("-")
    assert (version, trace, flags) == ("00", WORKER_TRACE_ID, "00")
    assert parent != WORKER_SPAN_ID  # the proxy's request, in the worker's trace


async def test_a_raised_redirect_is_an_answer_not_an_error(
    make_fence: FenceFactory, exporter: InMemorySpanExporter
) -> None:
    fence = await make_fence()
    exporter.clear()
    response = await fence.client.get("/_fence/ui", allow_redirects=False)
    assert response.status == 302
    spans = exporter.get_finished_spans()
    found = [s for s in spans if s.name == "GET /_fence/ui"]
    assert len(found) == 1, [(s.name, s.attributes) for s in spans]
    span = found[0]
    assert dict(span.attributes or {})["http.response.status_code"] == 302
    assert span.status.status_code is not StatusCode.ERROR
    assert not span.events  # no exception recorded
