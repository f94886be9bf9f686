"""`fenceproxy serve` with `FENCEPROXY_TRACING=otlp` and `FENCEPROXY_LOG_FORMAT=json`, as
docs/how-to/tracing-and-logs.md configures it: its spans reach an OTLP/HTTP receiver
(a server of this test's) as the standard OTEL_EXPORTER_OTLP_ENDPOINT says, and its log
lines are JSON objects naming the effect, the resource and the request. Neither the
lines nor the spans ever hold the lease's token, the idempotency key, the admin token
or a body, whatever the request that carried them became: a write whose answer was
lost, a stale token's refusal, a request aiohttp cannot parse."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.integration.processes.conftest import (
    ReconcileBlock,
    Stack,
    StackOptions,
    _start_stack,
    http_call,
    wait_until,
)

KEY = "idem-key-7f3a9c-never-logged"
BODY_SECRET = "body-secret-5e1d08"


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP receiver: every export request's body, as sent and decoded."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Export)
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> list[dict[str, Any]]:
        """Each span received: its name, ids and attributes, and its service's name."""
        found = []
        with self.lock:
            bodies = list(self.bodies)
        for body in bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                service = {
                    kv.key: kv.value.string_value for kv in resource_spans.resource.attributes
                }
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        attributes = {}
                        for kv in span.attributes:
                            value = kv.value
                            attributes[kv.key] = (
                                value.int_value
                                if value.WhichOneof("value") == "int_value"
                                else value.string_value
                            )
                        found.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "attributes": attributes,
                                "service": service.get("service.name"),
                            }
                        )
        return found


class _Export(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            with self.server.lock:
                self.server.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def stack(tmp_path: Path, receiver: Receiver) -> Iterator[Stack]:
    env = (
        ("FENCEPROXY_TRACING", "otlp"),
        ("FENCEPROXY_LOG_FORMAT", "json"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),  # ms between exports: the test waits less
    )
    options = StackOptions(env=env, reconcile=ReconcileBlock(settle_s=0.5, attempts=5))
    yield from _start_stack(tmp_path, options)


def malformed_request(stack: Stack, token: str) -> None:
    """A request aiohttp's parser refuses, with the token in the line it quotes."""
    host, port = stack.proxy_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"POST /orders/x HTTP/1.1\r\nFence-Token {token}\r\n\r\n".encode())
        sock.recv(4096)


def test_spans_go_out_with_otlp_and_json_lines_name_the_effect_never_a_secret(
    stack: Stack, receiver: Receiver
) -> None:
    lease = stack.acquire_ok("supplier:sku-9", "worker-a", ttl_s=30)
    token = lease["token"]
    lost = http_call(
        stack.proxy_url,
        "POST",
        "/orders/sku-9",
        json_body={"qty": 1, "note": BODY_SECRET},
        headers={
            "Fence-Token": token,
            "Idempotency-Key": KEY,
            "Demo-Drop-Response": "1",
            "X-Request-Id": "req-lost-1",
        },
    )
    assert lost.status == 504, lost
    effect_id = lost.headers["fence-effect-id"]
    wait_until("the probe", lambda: stack.effect(effect_id)["state"] == "COMMITTED", 15)
    stack.revoke("supplier:sku-9", "the test's stale token")
    stale = http_call(
        stack.proxy_url,
        "POST",
        "/orders/sku-9",
        json_body={"note": BODY_SECRET},
        headers={"Fence-Token": token, "Idempotency-Key": KEY + "-2"},
    )
    assert stale.status == 409, stale
    malformed_request(stack, token)

    def exported() -> bool:
        names = {span["name"] for span in receiver.spans()}
        return {"POST place-order", "admission", "upstream", "receipt", "probe"} <= names

    wait_until("the spans at the OTLP receiver", exported, 15)
    spans = receiver.spans()
    (write,) = [
        span
        for span in spans
        if span["name"] == "POST place-order"
        and span["attributes"].get("fenceproxy.effect_id") == effect_id
    ]
    assert write["service"] == "fenceproxy"
    assert write["attributes"]["fenceproxy.outcome"] == "unknown"
    assert write["attributes"]["fenceproxy.resource"] == "supplier:sku-9"
    children = {span["name"] for span in spans if span["parent_span_id"] == write["span_id"]}
    assert children == {"admission", "upstream", "receipt"}

    stack.sigterm_proxy()
    assert stack.wait_proxy_exit(15) == 0
    lines = stack.proxy.log_path.read_text(encoding="utf-8").splitlines()
    logged = [json.loads(line) for line in lines if not line.startswith("fenceproxy on ")]
    assert all(isinstance(line, dict) and line.keys() >= {"time", "level"} for line in logged)
    about_effect = [line for line in logged if line.get("effect_id") == effect_id]
    (unknown,) = [line for line in about_effect if line.get("request_id") == "req-lost-1"]
    assert unknown["resource"] == "supplier:sku-9" and unknown["route"] == "place-order"
    assert unknown["trace_id"] == write["trace_id"]
    assert any(line["logger"] == "fenceproxy.reconcile" for line in about_effect)
    assert any("withheld" in line["message"] for line in logged)  # the malformed request

    text = "\n".join(lines)
    exported_bytes = b"".join(receiver.bodies)
    for secret in (token, KEY, BODY_SECRET, stack.admin_token):
        assert secret not in text, secret
        assert secret.encode() not in exported_bytes, secret
