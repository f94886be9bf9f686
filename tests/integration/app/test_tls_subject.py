"""`client_subject`: the subject CN of the client certificate the listener verified, read
through aiohttp's public transport info, on a real TLS server built with the listener
context `serve` uses."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from policies import ListenTLS
from policies.tls import server_context
from proxy.tls import client_subject
from tests.certificates import Issued, TestCA


async def whoami(request: web.Request) -> web.Response:
    return web.json_response({"subject": client_subject(request)})


def subject_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/whoami", whoami)
    return app


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "tls", "test")


def client_context(ca: TestCA, certificate: Issued | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca.cert)
    if certificate is not None:
        context.load_cert_chain(certificate.cert, certificate.key)
    return context


async def subject_seen(url: str, tls: ssl.SSLContext | bool) -> object:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=tls) as response:
        assert response.status == 200
        body = await response.json()
        return body["subject"]


async def test_the_verified_client_certificate_names_its_subject(
    aiohttp_server: AiohttpServer, ca: TestCA
) -> None:
    server = ca.server("server")
    tls = ListenTLS(str(server.cert), str(server.key), str(ca.cert))
    running = await aiohttp_server(subject_app(), ssl=server_context(tls))

    seen = await subject_seen(
        str(running.make_url("/whoami")), client_context(ca, ca.client("worker-7"))
    )

    assert seen == "worker-7"


async def test_a_certificate_with_several_common_names_names_no_subject(
    aiohttp_server: AiohttpServer, ca: TestCA
) -> None:
    """Which CN is "the" name is a guess (the first? the last?): a certificate that names
    two is no identity at all, rather than the one a mapping happens to pick."""
    server = ca.server("server")
    tls = ListenTLS(str(server.cert), str(server.key), str(ca.cert))
    running = await aiohttp_server(subject_app(), ssl=server_context(tls))

    seen = await subject_seen(
        str(running.make_url("/whoami")), client_context(ca, ca.client("worker-7", "admin"))
    )

    assert seen is None


async def test_without_a_client_ca_no_certificate_is_asked_for_and_no_subject_is_named(
    aiohttp_server: AiohttpServer, ca: TestCA
) -> None:
    server = ca.server("server")
    running = await aiohttp_server(
        subject_app(), ssl=server_context(ListenTLS(str(server.cert), str(server.key)))
    )

    seen = await subject_seen(
        str(running.make_url("/whoami")), client_context(ca, ca.client("worker-7"))
    )

    assert seen is None


async def test_plain_http_names_no_subject(aiohttp_server: AiohttpServer) -> None:
    running = await aiohttp_server(subject_app())

    assert await subject_seen(str(running.make_url("/whoami")), True) is None
