"""The wire contract (docs/reference/wire.md), against a scripted upstream.

The upstream here is a raw HTTP/1.1 server in the test's event loop: it records every
request it gets as the bytes that arrived, and answers with bytes the test scripts
(any status line, duplicated headers, Content-Length or chunked framing, sent in
pieces with pauses, or cut short). Requests to the proxy that must be byte-exact are
sent on a raw socket too; aiohttp's own client would add and normalise headers.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import unquote

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from core.records import EffectRecord, EffectState
from proxy.runtime import RUNTIME
from reconcile.prober import ask_upstream
from tests.integration.app.conftest import (
    ADMIN_TOKEN,
    PROBE_BY_KEY,
    Fence,
    FenceFactory,
    assert_problem,
    closed_port,
    json_body,
)

RESOURCE = "supplier:widget"
MIB = 1_048_576
PAUSE_S = 0.02


@pytest.fixture
def backend() -> str:
    # About the bytes on the wire, not the store: one backend is enough.
    return "sqlite"


@dataclass
class Answer:
    """What the scripted upstream sends back: `head` (status line and headers, no
    final blank line) then `pieces`, each written on its own after a pause; with
    `cut`, the connection is closed after the last piece whatever the framing said."""

    head: bytes
    pieces: list[bytes] = field(default_factory=list)
    cut: bool = False
    # Read the request, then close the connection without a byte of answer.
    silent: bool = False


def answer(
    status: str,
    body: bytes,
    *,
    headers: list[tuple[str, str]] | None = None,
    chunked: bool = False,
    piece: int | None = None,
) -> Answer:
    """An answer with `body` framed by Content-Length or chunked, in pieces of `piece` bytes."""
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers or [])]
    size = piece or max(len(body), 1)
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        parts = [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n\r\n"]
    else:
        lines.append(f"Content-Length: {len(body)}")
    return Answer("\r\n".join(lines).encode() + b"\r\n\r\n", parts)


def plain(status: str = "201 Created", body: bytes = b'{"id": 1}') -> Answer:
    return answer(status, body, headers=[("Content-Type", "application/json")])


class ScriptedUpstream:
    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.answers: list[Answer] = []
        self.port = 0

    def will_answer(self, *answers: Answer) -> None:
        self.answers.extend(answers)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer each request on the connection (the proxy pools them) by the script."""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = b""
                for line in head.lower().split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        body = await reader.readexactly(int(line.split(b":", 1)[1]))
                self.received.append(head + body)
                script = self.answers.pop(0) if self.answers else plain()
                if script.silent:
                    return
                writer.write(script.head)
                for part in script.pieces:
                    await writer.drain()
                    await asyncio.sleep(PAUSE_S)
                    writer.write(part)
                await writer.drain()
                if script.cut:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def last_head(self) -> list[bytes]:
        """The last request's request line and header lines, as they arrived."""
        head = self.received[-1].split(b"\r\n\r\n", 1)[0]
        return head.split(b"\r\n")


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    scripted = ScriptedUpstream()
    server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
    scripted.port = server.sockets[0].getsockname()[1]
    async with server:
        yield scripted
        server.close()


@pytest.fixture
async def wired(make_fence: FenceFactory, upstream: ScriptedUpstream) -> Fence:
    return await make_fence(upstream_url=upstream.url, timeout_s=5)


async def raw_exchange(fence: Fence, request: bytes) -> bytes:
    """Send `request` as is (it should say Connection: close) and read to the end."""
    port = fence.client.server.port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


async def order(
    fence: Fence, token: str, key: str, body: bytes = b'{"qty": 1}', **headers: str
) -> aiohttp.ClientResponse:
    sent = {"Fence-Token": token, "Idempotency-Key": key, "Content-Type": "application/json"}
    sent.update({name.replace("_", "-"): value for name, value in headers.items()})
    return await fence.client.post("/orders/widget", data=body, headers=sent)


# -- 1. the whole body, however it arrives ----------------------------------------------


BODIES = {
    "two-pieces": answer("201 Created", b"a" * 100 + b"b" * 100, piece=100),
    "chunked": answer("201 Created", b"hello world, in chunks", chunked=True, piece=5),
    "300KB": answer("201 Created", bytes(range(256)) * 1200, piece=16384),
    "900KB-chunked": answer("201 Created", b"x" * 900_000, chunked=True, piece=60_000),
}


@pytest.mark.parametrize("script", BODIES.values(), ids=BODIES.keys())
async def test_a_fenced_answer_reaches_the_worker_whole_and_replays_whole(
    wired: Fence, upstream: ScriptedUpstream, script: Answer
) -> None:
    expected = b"".join(script.pieces)
    if b"Transfer-Encoding: chunked" in script.head:
        expected = b"".join(
            part.split(b"\r\n", 1)[1][:-2] for part in script.pieces if not part.startswith(b"0\r")
        )
    upstream.will_answer(script)
    lease = await wired.acquire(RESOURCE)

    first = await order(wired, lease["token"], "k-whole")
    assert first.status == 201
    assert await first.read() == expected
    replay = await order(wired, lease["token"], "k-whole")
    assert replay.status == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert await replay.read() == expected
    assert len(upstream.received) == 1


async def test_an_answer_over_the_replay_limit_is_passed_whole_and_replayed_as_not_kept(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    body = b"y" * (MIB + 1)
    upstream.will_answer(answer("201 Created", body, chunked=True, piece=256 * 1024))
    lease = await wired.acquire(RESOURCE)

    first = await order(wired, lease["token"], "k-big")
    assert first.status == 201
    assert await first.read() == body

    replay = await order(wired, lease["token"], "k-big")
    statement = await json_body(replay)
    # Never a truncated (or empty) body presented as the answer: a statement saying so.
    assert replay.status == 200, statement
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert statement["replayed"] is True
    assert statement["answer_kept"] is False
    assert statement["upstream_status"] == 201
    assert statement["effect_id"] == first.headers["Fence-Effect-Id"]
    assert "not kept" in statement["detail"]


async def test_an_answer_over_16_mib_after_a_committed_write_says_the_write_was_applied(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    upstream.will_answer(answer("201 Created", b"z" * (16 * MIB + 1), chunked=True, piece=MIB))
    lease = await wired.acquire(RESOURCE)

    first = await order(wired, lease["token"], "k-huge")
    problem = await assert_problem(first, 502, "upstream_answer_too_large")
    assert problem["upstream_status"] == 201
    assert "applied" in problem["detail"]
    effect = await wired.effect(first.headers["Fence-Effect-Id"])
    assert effect["state"] == EffectState.COMMITTED.value
    assert effect["upstream_status"] == 201

    replay = await order(wired, lease["token"], "k-huge")
    statement = await json_body(replay)
    assert statement["answer_kept"] is False and statement["upstream_status"] == 201
    assert len(upstream.received) == 1


async def test_an_answer_over_16_mib_with_a_status_of_unknown_outcome_is_outcome_unknown(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    upstream.will_answer(answer("503 Busy", b"z" * (16 * MIB + 1), chunked=True, piece=MIB))
    lease = await wired.acquire(RESOURCE)

    first = await order(wired, lease["token"], "k-huge-5xx")
    await assert_problem(first, 504, "outcome_unknown")


async def test_an_answer_over_16_mib_with_a_not_committed_status_says_so(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    upstream.will_answer(answer("422 No", b"z" * (16 * MIB + 1), chunked=True, piece=MIB))
    lease = await wired.acquire(RESOURCE)

    first = await order(wired, lease["token"], "k-huge-4xx")
    problem = await assert_problem(first, 502, "upstream_answer_too_large")
    assert (problem["state"], problem["upstream_status"]) == ("NOT_COMMITTED", 422)
    assert "applied" not in problem["detail"]


# -- 2. Idempotency-Key ------------------------------------------------------------------


@pytest.mark.parametrize("key", [".", "..", "a/b", "a b", "a%2E", "é"])
async def test_keys_a_url_layer_could_rewrite_are_refused(
    wired: Fence, upstream: ScriptedUpstream, key: str
) -> None:
    lease = await wired.acquire(RESOURCE)
    raw = await raw_exchange(
        wired,
        b"POST /orders/widget HTTP/1.1\r\nHost: p\r\nConnection: close\r\n"
        b"Fence-Token: " + lease["token"].encode() + b"\r\n"
        b"Idempotency-Key: " + key.encode() + b"\r\nContent-Length: 2\r\n\r\n{}",
    )
    assert status_of(raw) == 400, raw
    assert b'"code": "invalid_request"' in raw
    assert upstream.received == []


ALL_KEY_CHARACTERS = "AZaz09-._~:@" + "..."


async def test_the_probe_for_a_key_of_every_allowed_character_decodes_back_to_it(
    make_fence: FenceFactory, upstream: ScriptedUpstream
) -> None:
    fence = await make_fence(upstream_url=upstream.url, reconcile=PROBE_BY_KEY)
    route = fence.policy.route_named("place-order")
    assert route is not None
    for key in (ALL_KEY_CHARACTERS, "..a", "a..", ".~", "@:", "A" * 255):
        effect = _effect(key)
        upstream.will_answer(answer("404 Not Found", b""))
        async with aiohttp.ClientSession() as session:
            status, error = await ask_upstream(session, route, effect)
        assert (status, error) == (404, None)
        target = upstream.last_head()[0].split(b" ")[1].decode()
        prefix = "/orders/by-key/"
        assert target.startswith(prefix), target
        assert unquote(target.removeprefix(prefix)) == key


def _effect(key: str) -> EffectRecord:
    return EffectRecord(
        id="eff_probe",
        route="place-order",
        resource=RESOURCE,
        holder="worker-a",
        epoch=1,
        idempotency_key=key,
        fingerprint="f",
        method="POST",
        path="/orders/widget",
        state=EffectState.UNKNOWN,
        instance_id="i",
        created_at=0.0,
        deadline=0.0,
        finished_at=None,
        upstream_status=None,
        reason=None,
    )


# -- 3. headers the proxy owns in its answers ---------------------------------------------


async def test_the_upstreams_own_fence_and_replayed_headers_never_reach_the_worker(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    owned = [
        ("Idempotent-Replayed", "true"),
        ("Fence-Epoch", "999"),
        ("Fence-Resource", "other:thing"),
        ("Fence-Anything", "x"),
    ]
    upstream.will_answer(answer("201 Created", b"{}", headers=owned))
    lease = await wired.acquire(RESOURCE)

    first = await order(wired, lease["token"], "k-owned")
    assert first.status == 201
    assert "Idempotent-Replayed" not in first.headers
    assert "Fence-Anything" not in first.headers
    assert first.headers.getall("Fence-Epoch") == ["1"]
    assert first.headers.getall("Fence-Resource") == [RESOURCE]

    replay = await order(wired, lease["token"], "k-owned")
    assert replay.headers.getall("Idempotent-Replayed") == ["true"]
    assert "Fence-Anything" not in replay.headers
    assert replay.headers.getall("Fence-Epoch") == ["1"]


# -- 8. the proxy's own credentials ---------------------------------------------------------

WORKER_KEY = "worker-key-for-the-wire-tests-0123456789"
AUTH = f"""\
auth:
  clients:
    - name: supplier-workers
      key_sha256: "{hashlib.sha256(WORKER_KEY.encode()).hexdigest()}"
      resources: ["supplier:*"]
      may: [lease, read]
"""


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {WORKER_KEY}", f"bearer  {WORKER_KEY} ", f"Bearer {ADMIN_TOKEN}", WORKER_KEY],
    ids=["client-key", "client-key-spaced", "admin-token", "bare-key"],
)
async def test_a_credential_of_the_proxy_never_reaches_the_upstream(
    make_fence: FenceFactory, upstream: ScriptedUpstream, authorization: str
) -> None:
    fence = await make_fence(upstream_url=upstream.url, top_level=AUTH)
    lease_answer = await fence.client.post(
        "/_fence/v1/leases",
        json={"resource": RESOURCE, "holder": "worker-a"},
        headers={"Authorization": f"Bearer {WORKER_KEY}"},
    )
    lease = await json_body(lease_answer)
    assert lease_answer.status == 201, lease

    written = await order(fence, lease["token"], "k-cred", Authorization=authorization)
    assert written.status == 201
    read = await fence.client.get("/orders/widget", headers={"Authorization": authorization})
    assert read.status == 201
    for request in upstream.received:
        assert b"authorization" not in request.lower(), request
        assert WORKER_KEY.encode() not in request and ADMIN_TOKEN.encode() not in request


async def test_a_workers_own_upstream_credential_passes(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    read = await wired.client.get("/orders/widget", headers={"Authorization": "Bearer upstream-1"})
    assert read.status == 201
    assert b"Authorization: Bearer upstream-1" in upstream.last_head()


# -- the rest of the contract: worker -> upstream ----------------------------------------


async def test_a_bodiless_get_reaches_the_upstream_with_only_what_the_worker_sent(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    raw = await raw_exchange(
        wired,
        b"GET /orders/widget HTTP/1.1\r\nHost: proxy.example\r\nX-D: 1\r\nX-E: e\r\n"
        b"X-D: 2\r\nTrailers: kept\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    )
    assert status_of(raw) == 201, raw
    line, *headers = upstream.last_head()
    assert line == b"GET /orders/widget HTTP/1.1"
    # Host is the upstream's; nothing added (no User-Agent, Accept, Content-Length,
    # Content-Type, X-Forwarded-*); duplicates kept in order; `Trailers` is no hop-by-hop
    # header (RFC 9110 names `Trailer`), `TE` is.
    assert headers == [
        f"Host: 127.0.0.1:{upstream.port}".encode(),
        b"X-D: 1",
        b"X-E: e",
        b"X-D: 2",
        b"Trailers: kept",
    ]


@pytest.mark.parametrize(
    "target",
    [b"/orders/widget?", b"/orders/a%2Fb/x?q=%zz&&=&", b"/orders/%7e~?x=%2F", b"/orders/w?a"],
)
async def test_the_request_target_reaches_the_upstream_byte_for_byte(
    wired: Fence, upstream: ScriptedUpstream, target: bytes
) -> None:
    raw = await raw_exchange(
        wired, b"GET " + target + b" HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n"
    )
    assert status_of(raw) == 201, raw
    assert upstream.last_head()[0] == b"GET " + target + b" HTTP/1.1"


async def test_a_fenced_body_reaches_the_upstream_byte_for_byte_with_its_length(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    lease = await wired.acquire(RESOURCE)
    body = bytes(range(256)) * 3
    raw = await raw_exchange(
        wired,
        b"POST /orders/widget?x= HTTP/1.1\r\nHost: p\r\nConnection: close\r\n"
        b"Fence-Token: " + lease["token"].encode() + b"\r\nIdempotency-Key: k-body\r\n"
        b"Fence-Custom: mine\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"100\r\n" + body[:256] + b"\r\n200\r\n" + body[256:] + b"\r\n0\r\n\r\n",
    )
    assert status_of(raw) == 201, raw
    line, *headers = upstream.last_head()
    assert line == b"POST /orders/widget?x= HTTP/1.1"
    assert headers == [
        f"Host: 127.0.0.1:{upstream.port}".encode(),
        b"Idempotency-Key: k-body",
        b"Content-Length: 768",
    ]
    assert upstream.received[-1].endswith(b"\r\n\r\n" + body)


async def test_a_bodiless_put_gets_no_framing_header_it_did_not_have(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    lease = await wired.acquire("rules:r1")
    raw = await raw_exchange(
        wired,
        b"PUT /rules/r1 HTTP/1.1\r\nHost: p\r\nFence-Token: "
        + lease["token"].encode()
        + b"\r\nConnection: close\r\n\r\n",
    )
    assert status_of(raw) == 201, raw
    assert upstream.last_head() == [
        b"PUT /rules/r1 HTTP/1.1",
        f"Host: 127.0.0.1:{upstream.port}".encode(),
    ]


async def test_cookies_an_upstream_sets_for_one_worker_never_go_up_for_another(
    make_fence: FenceFactory, upstream: ScriptedUpstream
) -> None:
    # By name: aiohttp's cookie jar keeps no cookie from an IP address.
    fence = await make_fence(upstream_url=f"http://localhost:{upstream.port}", timeout_s=5)
    upstream.will_answer(
        answer("200 OK", b"a", headers=[("Set-Cookie", "session=worker-a-secret; Path=/")])
    )
    first = await raw_exchange(
        fence, b"GET /orders/a HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n"
    )
    assert b"Set-Cookie: session=worker-a-secret; Path=/" in first
    await raw_exchange(fence, b"GET /orders/b HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n")
    assert len(upstream.received) == 2
    assert b"worker-a-secret" not in upstream.received[-1]


async def test_a_header_value_that_is_not_utf8_is_refused_and_nothing_forwarded(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    raw = await raw_exchange(
        wired, b"GET /orders/a HTTP/1.1\r\nHost: p\r\nX-Name: caf\xe9\r\nConnection: close\r\n\r\n"
    )
    assert status_of(raw) == 400, raw
    assert b'"code": "invalid_request"' in raw
    assert upstream.received == []


async def test_a_utf8_header_value_reaches_the_upstream_as_its_bytes(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    raw = await raw_exchange(
        wired,
        b"GET /orders/a HTTP/1.1\r\nHost: p\r\nX-Name: caf\xc3\xa9\r\nConnection: close\r\n\r\n",
    )
    assert status_of(raw) == 201, raw
    assert b"X-Name: caf\xc3\xa9" in upstream.last_head()


# -- upstream -> worker ---------------------------------------------------------------------

END_TO_END = [
    ("Content-Type", "application/json"),
    ("Link", "</a>; rel=a"),
    ("X-Multi", "1"),
    ("Link", "</b>; rel=b"),
    ("Set-Cookie", "s=1"),
    ("X-Multi", "2"),
]


async def test_a_fenced_answer_and_its_replay_keep_reason_and_every_end_to_end_header(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    upstream.will_answer(
        answer(
            "201 Made It",
            b"{}",
            headers=[*END_TO_END, ("Connection", "close, X-Hop"), ("X-Hop", "h")],
        )
    )
    lease = await wired.acquire(RESOURCE)

    first = await order(wired, lease["token"], "k-headers")
    assert (first.status, first.reason) == (201, "Made It")
    assert _end_to_end(first.headers) == END_TO_END
    assert "X-Hop" not in first.headers

    replay = await order(wired, lease["token"], "k-headers")
    assert (replay.status, replay.reason) == (201, "Made It")
    assert _end_to_end(replay.headers) == [h for h in END_TO_END if h[0] != "Set-Cookie"]
    assert await replay.read() == b"{}"


def _end_to_end(headers: CIMultiDictProxy[str]) -> list[tuple[str, str]]:
    ours = {"content-length", "date", "server", "connection", "idempotent-replayed"}
    return [
        (k, v)
        for k, v in headers.items()
        if k.lower() not in ours and not k.lower().startswith("fence-")
    ]


async def test_a_pass_through_answer_cut_mid_body_cuts_the_workers_connection(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    whole = answer("200 OK", b"q" * 1000, piece=300)
    upstream.will_answer(Answer(whole.head, whole.pieces[:2], cut=True))

    response = await wired.client.get("/orders/widget")
    assert response.status == 200
    # Bounded: a proxy that neither finishes nor cuts the answer must fail, not hang.
    with pytest.raises(aiohttp.ClientPayloadError):
        async with asyncio.timeout(5):
            await response.read()
    metrics = wired.app[RUNTIME].metrics.registry
    sample = {"route": "read-orders", "outcome": "cut"}
    assert metrics.get_sample_value("fenceproxy_requests_total", sample) == 1


async def test_a_pass_through_request_that_left_and_got_no_answer_is_not_called_unsent(
    wired: Fence, upstream: ScriptedUpstream
) -> None:
    upstream.will_answer(Answer(b"", silent=True))

    response = await wired.client.get("/orders/widget")
    problem = await assert_problem(response, 504, "outcome_unknown")
    assert "nothing was sent" not in problem["detail"]
    assert len(upstream.received) == 1


async def test_a_pass_through_request_that_could_not_connect_says_nothing_was_sent(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence(upstream_url=f"http://127.0.0.1:{closed_port()}")

    response = await fence.client.get("/orders/widget")
    problem = await assert_problem(response, 502, "upstream_unreachable")
    assert "nothing was sent" in problem["detail"]
