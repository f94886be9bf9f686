"""TLS on the listener and to the upstream, with real processes.

`fenceproxy serve` and the demo upstream run as OS processes on free ports of
127.0.0.1; the certificates are made by the test (tests/certificates.py): the
proxy's from one CA, the upstream's from another, client certificates from the
proxy's CA or from a stranger's. Judged by what clients see at the handshake,
what the proxy answers, and the upstream's own SQLite record of every mutation
that reached it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import sqlite3
import ssl
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from demo.upstream import demo_upstream_argv
from support.processes import ManagedProcess, free_port
from tests.certificates import Issued, TestCA
from tests.integration.processes.conftest import (
    PROJECT_ROOT,
    HttpResult,
    assert_refused,
    wait_until,
)

STARTUP_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 5.0
ADMIN_TOKEN_ENV = "FENCEPROXY_ADMIN_TOKEN"

POLICY = """\
version: 1
listen:
  host: 127.0.0.1
  port: {proxy_port}
{listen_tls}
store: sqlite:///{store_path}
admin_token_env: {admin_token_env}
leases: {{min_ttl_s: 0.5, max_ttl_s: 60, default_ttl_s: 30}}
upstreams:
  supplier:
    url: "{upstream_url}"
    timeout_s: 1
    connect_timeout_s: 0.5
{supplier_tls}
  supplier-untrusted:
    url: "{upstream_url}"
    timeout_s: 1
    connect_timeout_s: 0.5
routes:
  - name: place-order
    upstream: supplier
    match: {{methods: [POST], path: "/orders/{{sku}}"}}
    resource: "supplier:{{sku}}"
    idempotency: {{required: true, retain_s: 3600}}
    reconcile:
      probe: {{method: GET, path: "/orders/by-key/{{idempotency_key}}"}}
      committed: ["200"]
      not_committed: ["404"]
      settle_s: 1
      attempts: 5
  - name: read-orders
    upstream: supplier
    match: {{methods: [GET], path: "/orders/{{rest:.*}}"}}
    fence: none
  - name: put-rule
    upstream: supplier-untrusted
    match: {{methods: [PUT], path: "/rules/{{rule_id}}"}}
    resource: "rule:{{rule_id}}"
{top_level}"""


def client_context(ca: TestCA | None, certificate: Issued | None = None) -> ssl.SSLContext:
    """A client that trusts `ca` (None: only the system's trust store) and presents
    `certificate`, if any."""
    context = ssl.create_default_context(cafile=ca.cert if ca is not None else None)
    if certificate is not None:
        context.load_cert_chain(certificate.cert, certificate.key)
    return context


def call(
    base_url: str,
    method: str,
    path: str,
    *,
    tls: ssl.SSLContext | None = None,
    json_body: Any = None,
    headers: Mapping[str, str] | None = None,
) -> HttpResult:
    """One request on a fresh connection, https when `tls` is given."""
    host, _, port = base_url.partition("://")[2].partition(":")
    connection: http.client.HTTPConnection
    if tls is not None:
        connection = http.client.HTTPSConnection(
            host, int(port), timeout=HTTP_TIMEOUT_S, context=tls
        )
    else:
        connection = http.client.HTTPConnection(host, int(port), timeout=HTTP_TIMEOUT_S)
    sent = dict(headers or {})
    payload = None
    if json_body is not None:
        payload = json.dumps(json_body).encode()
        sent["Content-Type"] = "application/json"
    try:
        connection.request(method, path, body=payload, headers=sent)
        response = connection.getresponse()
        raw = response.read()
        received = {name.lower(): value for name, value in response.getheaders()}
    finally:
        connection.close()
    body = json.loads(raw) if raw else None
    return HttpResult(response.status, body, received)


@dataclass
class Certificates:
    proxy_ca: TestCA
    upstream_ca: TestCA
    stranger_ca: TestCA
    proxy_server: Issued
    upstream_server: Issued
    worker: Issued
    stranger: Issued


def make_certificates(folder: Path) -> Certificates:
    proxy_ca, upstream_ca, stranger_ca = (
        TestCA(folder, name) for name in ("proxy", "upstream", "stranger")
    )
    return Certificates(
        proxy_ca,
        upstream_ca,
        stranger_ca,
        proxy_ca.server("proxy-server"),
        upstream_ca.server("upstream-server"),
        proxy_ca.client("worker-7"),
        stranger_ca.client("intruder"),
    )


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    return make_certificates(tmp_path / "tls")


@dataclass
class TlsStack:
    """The proxy and the demo upstream; `tls` is what a client of the proxy uses."""

    proxy_url: str
    upstream_db: Path
    admin_token: str
    tls: ssl.SSLContext | None
    processes: list[ManagedProcess] = field(default_factory=list)

    def call(self, method: str, path: str, **kwargs: Any) -> HttpResult:
        kwargs.setdefault("tls", self.tls)
        return call(self.proxy_url, method, path, **kwargs)

    def acquire(self, resource: str, **kwargs: Any) -> HttpResult:
        body = {"resource": resource, "holder": "worker-7", "ttl_s": 30}
        return self.call("POST", "/_fence/v1/leases", json_body=body, **kwargs)

    def token(self, resource: str) -> str:
        granted = self.acquire(resource)
        assert granted.status == 201, granted
        token: str = granted.body["token"]
        return token

    def place_order(self, sku: str, token: str, **extra: str) -> HttpResult:
        headers = {"Fence-Token": token, "Idempotency-Key": f"k-{secrets.token_hex(6)}", **extra}
        return self.call("POST", f"/orders/{sku}", json_body={"qty": 1}, headers=headers)

    def lease(self, resource: str) -> dict[str, Any]:
        view = self.call("GET", f"/_fence/v1/leases?resource={resource}")
        assert view.status == 200, view
        found: dict[str, Any] = view.body
        return found

    def effect(self, effect_id: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        shown = self.call("GET", f"/_fence/v1/effects/{effect_id}", headers=headers)
        assert shown.status == 200, shown
        receipt: dict[str, Any] = shown.body
        return receipt

    def upstream_rows(self, table: str) -> int:
        """Rows of the upstream's own SQLite file: `mutation_headers` has one per
        mutation that reached it, `orders` one per order it committed."""
        with contextlib.closing(sqlite3.connect(self.upstream_db)) as db:
            (count,) = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
        rows: int = count
        return rows

    def log_tails(self) -> list[tuple[str, str]]:
        return [(f"{p.name} log", p.log_tail(60)) for p in self.processes]


def start_stack(
    tmp_path: Path,
    *,
    listen_tls: Mapping[str, str] | None,
    upstream_tls: Issued | None,
    supplier_ca_bundle: str | None,
    client_tls: ssl.SSLContext | None,
    upstream_ca: TestCA | None,
    top_level: str = "",
) -> Iterator[TlsStack]:
    """Start the upstream (https with `upstream_tls`) and the proxy (its listener's
    `tls:` keys from `listen_tls`; paths relative to the policy file, which is in
    tmp_path while the proxy runs in the project folder)."""
    upstream_port, proxy_port = free_port(), free_port()
    scheme = "https" if upstream_tls is not None else "http"
    upstream_url = f"{scheme}://127.0.0.1:{upstream_port}"
    proxy_url = f"{'https' if listen_tls else 'http'}://127.0.0.1:{proxy_port}"
    admin_token = secrets.token_urlsafe(24)
    config = tmp_path / "fenceproxy.yaml"
    config.write_text(
        POLICY.format(
            proxy_port=proxy_port,
            listen_tls="\n".join(
                ["  tls:", *(f"    {key}: {value}" for key, value in listen_tls.items())]
            )
            if listen_tls
            else "",
            store_path=tmp_path / "fence.db",
            admin_token_env=ADMIN_TOKEN_ENV,
            upstream_url=upstream_url,
            supplier_tls=f"    ca_bundle: {supplier_ca_bundle}" if supplier_ca_bundle else "",
            top_level=top_level,
        )
    )
    stack = TlsStack(proxy_url, tmp_path / "upstream.db", admin_token, client_tls)
    with contextlib.ExitStack() as processes:
        tls_files = (upstream_tls.cert, upstream_tls.key) if upstream_tls else None
        upstream = processes.enter_context(
            ManagedProcess(
                "demo upstream",
                demo_upstream_argv(upstream_port, stack.upstream_db, tls=tls_files),
                log_path=tmp_path / "upstream.log",
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        proxy = processes.enter_context(
            ManagedProcess(
                "fenceproxy",
                [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)],
                log_path=tmp_path / "proxy.log",
                env={**os.environ, ADMIN_TOKEN_ENV: admin_token},
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        stack.processes += [upstream, proxy]
        upstream_client = client_context(upstream_ca) if upstream_tls is not None else None
        upstream.wait_http_ok(f"{upstream_url}/_demo/healthz", STARTUP_TIMEOUT_S, upstream_client)
        proxy.wait_http_ok(f"{proxy_url}/_fence/healthz", STARTUP_TIMEOUT_S, client_tls)
        yield stack


# -- the listener ------------------------------------------------------------------------------


def start_tls_listener(tmp_path: Path, certificates: Certificates) -> Iterator[TlsStack]:
    """The proxy's listener on TLS with a certificate of the proxy's private CA."""
    yield from start_stack(
        tmp_path,
        listen_tls={"cert": "tls/proxy-server.pem", "key": "tls/proxy-server-key.pem"},
        upstream_tls=None,
        supplier_ca_bundle=None,
        client_tls=client_context(certificates.proxy_ca),
        upstream_ca=None,
    )


@pytest.fixture
def tls_listener(tmp_path: Path, certificates: Certificates) -> Iterator[TlsStack]:
    yield from start_tls_listener(tmp_path, certificates)


def test_a_client_trusting_the_proxys_ca_acquires_and_writes_over_tls(
    tls_listener: TlsStack,
) -> None:
    token = tls_listener.token("supplier:tls-a")

    placed = tls_listener.place_order("tls-a", token)

    assert placed.status == 201, placed
    assert tls_listener.upstream_rows("orders") == 1
    banner = tls_listener.processes[-1].log_tail().splitlines()[0]
    assert banner.startswith(f"fenceproxy on {tls_listener.proxy_url} ("), banner
    assert banner.endswith(", TLS)"), banner


def test_a_client_not_trusting_the_proxys_ca_fails_verification_and_changes_nothing(
    tls_listener: TlsStack, certificates: Certificates
) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_listener.acquire("supplier:tls-b", tls=client_context(None))
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_listener.acquire("supplier:tls-b", tls=client_context(certificates.stranger_ca))

    assert tls_listener.lease("supplier:tls-b")["live"] is False


def test_plain_http_to_a_tls_listener_gets_no_answer(tls_listener: TlsStack) -> None:
    with pytest.raises((http.client.HTTPException, OSError)):
        call(tls_listener.proxy_url.replace("https", "http"), "GET", "/_fence/healthz")


# -- mutual TLS --------------------------------------------------------------------------------


def start_mutual_tls(
    tmp_path: Path, certificates: Certificates, top_level: str = ""
) -> Iterator[TlsStack]:
    """A listener that requires a client certificate from the proxy's CA; the stack's
    client presents the worker's."""
    yield from start_stack(
        tmp_path,
        listen_tls={
            "cert": "tls/proxy-server.pem",
            "key": "tls/proxy-server-key.pem",
            "client_ca": "tls/proxy-ca.pem",
        },
        upstream_tls=None,
        supplier_ca_bundle=None,
        client_tls=client_context(certificates.proxy_ca, certificates.worker),
        upstream_ca=None,
        top_level=top_level,
    )


@pytest.fixture
def mutual_tls(tmp_path: Path, certificates: Certificates) -> Iterator[TlsStack]:
    yield from start_mutual_tls(tmp_path, certificates)


def test_mutual_tls_serves_a_client_whose_certificate_chains_to_the_client_ca(
    mutual_tls: TlsStack,
) -> None:
    token = mutual_tls.token("supplier:mtls-a")

    placed = mutual_tls.place_order("mtls-a", token)

    assert placed.status == 201, placed
    assert mutual_tls.upstream_rows("orders") == 1


@pytest.mark.parametrize("presented", ["none", "stranger"])
def test_mutual_tls_refuses_the_handshake_without_a_certificate_from_the_client_ca(
    mutual_tls: TlsStack, certificates: Certificates, presented: str
) -> None:
    certificate = certificates.stranger if presented == "stranger" else None
    # TLS 1.3 ends the client's side of the handshake before the server has checked
    # the certificate: the refusal arrives as an alert (or a reset) where the answer
    # would be. Either way no request is read.
    with pytest.raises(OSError):
        mutual_tls.acquire(
            "supplier:mtls-b", tls=client_context(certificates.proxy_ca, certificate)
        )

    assert mutual_tls.lease("supplier:mtls-b")["live"] is False
    assert mutual_tls.upstream_rows("mutation_headers") == 0


# -- a client certificate names an `auth:` client --------------------------------------------

CERT_CLIENTS = """\
auth:
  clients:
    - name: tls-workers
      cert_subject: worker-7
      resources: ["supplier:*"]
      may: [lease, read]
"""


@pytest.fixture
def mutual_tls_clients(tmp_path: Path, certificates: Certificates) -> Iterator[TlsStack]:
    yield from start_mutual_tls(tmp_path, certificates, top_level=CERT_CLIENTS)


def test_a_verified_certificates_subject_names_the_client_without_a_key(
    mutual_tls_clients: TlsStack, certificates: Certificates
) -> None:
    granted = mutual_tls_clients.acquire("supplier:cert-a")
    assert granted.status == 201, granted
    assert granted.body["client"] == "tls-workers"
    placed = mutual_tls_clients.place_order("cert-a", granted.body["token"])
    assert placed.status == 201, placed
    # Its scope holds as for a key: another resource is forbidden.
    outside = mutual_tls_clients.acquire("rule:cert-a")
    assert_refused(outside, 403, "forbidden_resource")

    # A certificate from the same CA whose subject names no client is no one.
    unnamed = client_context(certificates.proxy_ca, certificates.proxy_ca.client("worker-8"))
    assert_refused(mutual_tls_clients.acquire("supplier:cert-b", tls=unnamed), 401, "unauthorized")
    assert mutual_tls_clients.upstream_rows("orders") == 1


# -- an https upstream -------------------------------------------------------------------------


@pytest.fixture
def https_upstream(tmp_path: Path, certificates: Certificates) -> Iterator[TlsStack]:
    """The upstream serves https with a certificate from the upstream CA: `supplier` is
    told that CA (`ca_bundle`), `supplier-untrusted` (the same server) is not."""
    yield from start_stack(
        tmp_path,
        listen_tls=None,
        upstream_tls=certificates.upstream_server,
        supplier_ca_bundle="tls/upstream-ca.pem",
        client_tls=None,
        upstream_ca=certificates.upstream_ca,
    )


def test_an_https_upstream_verified_with_its_ca_bundle_gets_the_fenced_write_and_reads(
    https_upstream: TlsStack,
) -> None:
    token = https_upstream.token("supplier:up-a")

    placed = https_upstream.place_order("up-a", token)
    read = https_upstream.call("GET", "/orders/up-a")

    assert placed.status == 201, placed
    assert (read.status, len(read.body["orders"])) == (200, 1), read
    assert https_upstream.upstream_rows("orders") == 1


def test_an_upstream_certificate_that_does_not_verify_means_nothing_was_sent(
    https_upstream: TlsStack,
) -> None:
    granted = https_upstream.acquire("rule:up-b")
    assert granted.status == 201, granted

    refused = https_upstream.call(
        "PUT",
        "/rules/up-b",
        json_body={"limit": 1},
        headers={"Fence-Token": granted.body["token"]},
    )

    problem = assert_refused(refused, 502, "upstream_unreachable")
    assert "CERTIFICATE_VERIFY_FAILED" in problem["detail"], problem
    assert "nothing was sent" in problem["detail"], problem
    receipt = https_upstream.effect(problem["effect_id"])
    assert receipt["state"] == "NOT_SENT", receipt
    assert https_upstream.lease("rule:up-b")["blocked"] is False
    assert https_upstream.upstream_rows("mutation_headers") == 0


def test_a_probe_of_an_https_upstream_is_verified_with_its_ca_bundle(
    https_upstream: TlsStack,
) -> None:
    """The upstream commits and drops the connection: the outcome is unknown until the
    reconciler's probe (its own session, shared by every upstream) reaches the upstream
    over https with `supplier`'s CA bundle and finds the order."""
    token = https_upstream.token("supplier:up-c")

    lost = https_upstream.place_order("up-c", token, **{"Demo-Drop-Response": "1"})

    problem = assert_refused(lost, 504, "outcome_unknown")
    receipts: list[dict[str, Any]] = []

    def settled() -> bool:
        receipts.append(https_upstream.effect(problem["effect_id"]))
        return bool(receipts[-1]["state"] == "COMMITTED")

    wait_until("the probe to settle the order COMMITTED", settled, 15.0)
    assert receipts[-1]["settled_by"] == "probe", receipts[-1]
    assert https_upstream.upstream_rows("orders") == 1
