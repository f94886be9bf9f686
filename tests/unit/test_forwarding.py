"""Forwarding sends a request at most once, even where aiohttp would re-send it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict, CIMultiDictProxy
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


def test_upstream_headers_add_nothing_and_keep_order_and_duplicates() -> None:
    # No Forwarded / X-Forwarded-* of the proxy's own (the wire contract: the only
    # headers added are the route's fence headers, Host and Content-Length framing).
    request = make_mocked_request(
        "POST",
        "/orders/w",
        headers=CIMultiDict(
            [
                ("Host", "proxy"),
                ("X-A", "1"),
                ("Forwarded", "for=1.2.3.4"),
                ("X-A", "2"),
                ("Fence-Custom", "x"),
                ("Connection", "X-Gone"),
                ("X-Gone", "g"),
                ("Trailers", "t"),
            ]
        ),
    )
    headers = forwarding.upstream_headers(request, {"Fence-Epoch": "3"})
    assert list(headers.items()) == [
        ("X-A", "1"),
        ("Forwarded", "for=1.2.3.4"),
        ("X-A", "2"),
        ("Trailers", "t"),
        ("Fence-Epoch", "3"),
    ]


def test_downstream_headers_drop_what_the_proxy_owns_and_replays_drop_cookies() -> None:
    upstream = CIMultiDictProxy(
        CIMultiDict(
            [
                ("Set-Cookie", "a=1"),
                ("Link", "<a>"),
                ("Idempotent-Replayed", "true"),
                ("Fence-Epoch", "9"),
                ("Link", "<b>"),
                ("Content-Length", "2"),
            ]
        )
    )
    passed = forwarding.downstream_headers(upstream)
    assert list(passed.items()) == [("Set-Cookie", "a=1"), ("Link", "<a>"), ("Link", "<b>")]
    assert forwarding.replayable(passed) == (("Link", "<a>"), ("Link", "<b>"))


@pytest.mark.parametrize(
    ("base", "target", "url"),
    [
        ("http://u:81", "/a?", "http://u:81/a?"),
        ("http://u:81/api", "/a/%2e%2E/b?x=%zz&&", "http://u:81/api/a/%2e%2E/b?x=%zz&&"),
        ("http://u:81", "/a/../b", "http://u:81/a/../b"),
    ],
)
def test_the_upstream_url_keeps_the_target_byte_for_byte(base: str, target: str, url: str) -> None:
    built = forwarding.upstream_url(Upstream("u", base, 5, 1), make_mocked_request("GET", target))
    assert str(built) == url
    # What aiohttp writes as the request target.
    assert built.raw_path_qs == base.removeprefix("http://u:81") + target
