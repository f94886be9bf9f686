"""The client where `auth:` is on and the listener speaks TLS, against
real processes: `fenceproxy serve` and the demo upstream on free ports of 127.0.0.1.

A client key scoped to `supplier:*` leases and writes there, is refused outside its
globs, and never reaches the upstream; a listener with a private CA is trusted through
`verify=`; mutual TLS presents `cert=`, and a `cert_subject` client is named by it.
"""

from __future__ import annotations

import secrets
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fenceproxy_client import AsyncFenceClient, FenceClient, errors, new_key

from tests.integration.processes.conftest import Stack, StackOptions, _start_stack, http_call
from tests.integration.processes.test_tls import (
    CERT_CLIENTS,
    Certificates,
    TlsStack,
    make_certificates,
    start_mutual_tls,
    start_tls_listener,
)

KEY_ENV = "FENCEPROXY_KEY_SUPPLIER"
KEY = secrets.token_urlsafe(32)
AUTH = f"""\
auth:
  clients:
    - name: supplier-workers
      key_env: {KEY_ENV}
      resources: ["supplier:*"]
      may: [lease, read]
"""


@pytest.fixture
def auth_stack(tmp_path: Path) -> Iterator[Stack]:
    yield from _start_stack(tmp_path, StackOptions(top_level=AUTH, env=((KEY_ENV, KEY),)))


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    return make_certificates(tmp_path / "tls")


@pytest.fixture
def tls_listener(tmp_path: Path, certificates: Certificates) -> Iterator[TlsStack]:
    yield from start_tls_listener(tmp_path, certificates)


@pytest.fixture
def mutual_tls_clients(tmp_path: Path, certificates: Certificates) -> Iterator[TlsStack]:
    yield from start_mutual_tls(tmp_path, certificates, top_level=CERT_CLIENTS)


def upstream_saw(stack: Stack) -> dict[str, str]:
    """The headers of the last write that reached the upstream."""
    seen = http_call(stack.upstream_url, "GET", "/_demo/headers-seen")
    headers: dict[str, str] = seen.body["last_headers"]
    return headers


def test_a_scoped_key_leases_writes_and_reads_its_resources_only(auth_stack: Stack) -> None:
    with FenceClient(auth_stack.proxy_url, api_key=KEY, timeout_s=5.0) as client:
        with client.lease("supplier:widget", "worker-a", ttl_s=10, renew=True) as lease:
            placed = lease.request(
                "POST", "/orders/widget", json={"qty": 1}, idempotency_key=new_key()
            )
            assert placed.status_code == 201
        # A read with the key alone (no lease, no admin token): its `read` right.
        assert client.wait_settled(placed.headers["Fence-Effect-Id"], 5.0) == "COMMITTED"
        with pytest.raises(errors.ForbiddenResource):
            client.acquire("rule:r1", "worker-a")
    assert "authorization" not in upstream_saw(auth_stack)
    assert auth_stack.upstream_orders() == 1

    with FenceClient(auth_stack.proxy_url, timeout_s=5.0) as keyless:
        with pytest.raises(errors.Unauthorized):
            keyless.acquire("supplier:widget", "worker-b")
        with pytest.raises(ValueError, match="admin_token or api_key"):
            keyless.wait_settled(placed.headers["Fence-Effect-Id"], 1.0)


async def test_the_async_client_sends_its_key_too(auth_stack: Stack) -> None:
    async with AsyncFenceClient(auth_stack.proxy_url, api_key=KEY, timeout_s=5.0) as client:
        async with client.lease("supplier:gadget", "worker-a", ttl_s=10) as lease:
            placed = await lease.request(
                "POST", "/orders/gadget", json={"qty": 1}, idempotency_key=new_key()
            )
            assert placed.status_code == 201
        with pytest.raises(errors.ForbiddenResource):
            await client.acquire("rule:r1", "worker-a")
    assert "authorization" not in upstream_saw(auth_stack)


def test_a_listener_with_a_private_ca_is_trusted_through_verify(
    tls_listener: TlsStack, certificates: Certificates
) -> None:
    with (
        FenceClient(tls_listener.proxy_url, timeout_s=5.0) as untrusting,
        pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        untrusting.acquire("supplier:tls-a", "worker-a")
    for verify in (str(certificates.proxy_ca.cert), certificates.proxy_ca.cert):
        with (
            FenceClient(tls_listener.proxy_url, verify=verify, timeout_s=5.0) as client,
            client.lease("supplier:tls-a", "worker-a", ttl_s=10) as lease,
        ):
            placed = lease.request(
                "POST", "/orders/tls-a", json={"qty": 1}, idempotency_key=new_key()
            )
            assert placed.status_code == 201
    assert tls_listener.upstream_rows("orders") == 2


async def test_mutual_tls_names_a_cert_subject_client_by_the_clients_certificate(
    mutual_tls_clients: TlsStack, certificates: Certificates
) -> None:
    worker = certificates.worker
    cert = (str(worker.cert), str(worker.key))
    ca = str(certificates.proxy_ca.cert)
    with FenceClient(mutual_tls_clients.proxy_url, verify=ca, cert=cert, timeout_s=5.0) as client:
        with client.lease("supplier:mtls-a", "worker-7", ttl_s=10) as lease:
            placed = lease.request(
                "POST", "/orders/mtls-a", json={"qty": 1}, idempotency_key=new_key()
            )
            assert placed.status_code == 201
        with pytest.raises(errors.ForbiddenResource):
            client.acquire("rule:mtls-a", "worker-7")
    async with (
        AsyncFenceClient(
            mutual_tls_clients.proxy_url, verify=ca, cert=cert, timeout_s=5.0
        ) as async_client,
        async_client.lease("supplier:mtls-b", "worker-7", ttl_s=10),
    ):
        pass
    # Without the certificate the handshake is refused: nothing is answered over HTTP.
    with (
        FenceClient(mutual_tls_clients.proxy_url, verify=ca, timeout_s=5.0) as anonymous,
        pytest.raises(httpx.TransportError),
    ):
        anonymous.acquire("supplier:mtls-c", "worker-7")
    assert mutual_tls_clients.upstream_rows("orders") == 1


def test_cert_with_an_ssl_context_is_refused_rather_than_loaded_into_it() -> None:
    with pytest.raises(ValueError, match="load the client certificate into it"):
        FenceClient("https://127.0.0.1:1", verify=ssl.create_default_context(), cert="x.pem")
