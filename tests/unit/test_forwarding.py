"""Forwarding sends a request at most once, even where aiohttp would re-send it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict
from yarl import URL

from core.outcomes import Answered, Lost
from policies import Upstream
from proxy import forwarding


class DroppingUpstream:
    """A raw HTTP/1.1 server: answers the first request (keep-alive), then reads every
    later one and closes the connection without an answer, as an upstream that
    applied the write and died before replying would."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                self.received.append(head + await reader.readexactly(length))
                if len(self.received) > 1:
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[DroppingUpstream]:
    dropping = DroppingUpstream()
    server = await asyncio.start_server(dropping.handle, "127.0.0.1", 0)
    dropping.port = server.sockets[0].getsockname()[1]
    async with server:
        yield dropping


@pytest.mark.parametrize("pool", ["plain", "fenced", "pass_through"])
async def test_a_put_whose_connection_drops_is_sent_once_and_reported_lost(
    upstream: DroppingUpstream, pool: str
) -> None:
    """aiohttp re-sends an idempotent-method request (PUT included) once when its
    connection breaks; forwarding.new_client_session switches that off through a
    private attribute, which this test pins: the upstream must see the second PUT
    exactly once, and the proxy must learn that its outcome is unknown."""
    target = Upstream("dropping", f"http://127.0.0.1:{upstream.port}", 5, 1)
    url = URL(f"{target.url}/rules/r1")
    # The routes forward through UpstreamPools' sessions: they must forward once too.
    pools = forwarding.UpstreamPools([target])
    plain = forwarding.new_client_session()
    session = {"plain": plain, "fenced": pools.fenced(target)}.get(pool, pools.pass_through(target))
    try:
        first, _ = await forwarding.dispatch(session, target, "PUT", url, CIMultiDict(), b"{}")
        second, answer = await forwarding.dispatch(
            session, target, "PUT", url, CIMultiDict(), b'{"v": 2}'
        )
    finally:
        await pools.close()
        await plain.close()
    assert first == Answered(200)
    assert isinstance(second, Lost) and answer is None, second
    assert len(upstream.received) == 2, upstream.received
    assert upstream.received[1].endswith(b'{"v": 2}')


def test_forwarded_quotes_the_host_as_rfc_7239_asks() -> None:
    # A Host value with a quote or a backslash must not break out of its quoted-string
    # (and so add parameters of its own choosing to the Forwarded header).
    request = make_mocked_request("POST", "/orders/w", headers={"Host": 'evil";for=1.2.3.4;x="\\'})
    forwarded = forwarding.upstream_headers(request, None)["Forwarded"]
    assert forwarded.endswith(';host="evil\\";for=1.2.3.4;x=\\"\\\\";proto=http')
