"""The guarded listener (proxy/connections.py) in front of a small aiohttp app: heads over
the limits are answered while they arrive, legitimate framing passes, and past
`max_connections` the connection waiting longest is closed."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import cast

import pytest
from aiohttp import web

from core.records import Refusal
from proxy.connections import HEAD_LIMITS, LINGER_BYTES, ConnectionGuard
from proxy.metrics import Metrics
from proxy.problems import refusal_response
from proxy.requests import CREDENTIAL_VERIFIED, SHED_DETAIL, lease_before_body, read_body
from store import Store

WITHIN_S = 5.0


class SlowStore:
    """Answers a token's lookup (never issued) once `answer` is set."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def lease_of_token(self, token_hash: str) -> None:
        self.asked.set()
        await self.answer.wait()


SLOW_STORE = SlowStore()


@dataclass
class Listener:
    port: int
    guard: ConnectionGuard
    metrics: Metrics
    handled: list[str]
    release: asyncio.Event  # /block waits for it
    refusals: list[str]  # the codes read_body refused with on /body and /credentialed


async def start_listener(
    max_connections: int, max_unverified_waits: int | None = None
) -> tuple[Listener, web.AppRunner, asyncio.Server]:
    handled: list[str] = []
    release = asyncio.Event()

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        handled.append(request.path)
        return web.Response(text=f"{request.path} {len(body)}")

    async def block(request: web.Request) -> web.Response:
        handled.append(request.path)
        await release.wait()
        return web.Response(text="released")

    refusals: list[str] = []

    async def body(request: web.Request) -> web.Response:
        """The proxy's own body read; /credentialed as after a verified credential."""
        handled.append(request.path)
        if request.path == "/credentialed":
            request[CREDENTIAL_VERIFIED] = True
        try:
            data = await read_body(request, 1024)
        except Refusal as exc:
            refusals.append(exc.code)
            return refusal_response(exc)
        return web.Response(text=f"{request.path} {len(data)}")

    async def lookup(request: web.Request) -> web.Response:
        """A renew's first step: its token looked up, on a store that waits."""
        handled.append(request.path)
        try:
            await lease_before_body(request, "fpt_" + "A" * 43, cast(Store, SLOW_STORE))
        except Refusal as exc:
            refusals.append(exc.code)
            return refusal_response(exc)
        return web.Response(text="issued")

    metrics = Metrics()
    guard = ConnectionGuard(max_connections, metrics, max_unverified_waits)
    app = web.Application(middlewares=[guard.middleware])
    app.router.add_route("*", "/block", block)
    app.router.add_post("/body", body)
    app.router.add_post("/credentialed", body)
    app.router.add_post("/lookup", lookup)
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    assert runner.server is not None
    server = await asyncio.get_running_loop().create_server(
        guard.protocol_factory(runner.server), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    return Listener(port, guard, metrics, handled, release, refusals), runner, server


@contextlib.asynccontextmanager
async def listening(
    max_connections: int = 100, max_unverified_waits: int | None = None
) -> AsyncIterator[Listener]:
    started, runner, server = await start_listener(max_connections, max_unverified_waits)
    try:
        yield started
    finally:
        started.release.set()
        server.close()
        await runner.cleanup()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Bounded polling, for what the server does on its own time."""
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def connect(listener: Listener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", listener.port)


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One answer with a Content-Length body: (status, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WITHIN_S)
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    body = await asyncio.wait_for(reader.readexactly(length), WITHIN_S)
    return int(lines[0].split()[1]), body


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), WITHIN_S)


def shed(metrics: Metrics, how: str) -> float:
    value = metrics.registry.get_sample_value("fenceproxy_connections_shed_total", {"how": how})
    assert value is not None
    return value


def open_connections(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("fenceproxy_open_connections")
    assert value is not None
    return value


# --- heads refused while they arrive -----------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_repeated_once_only_field_is_a_problem_and_a_head_gets_no_body(
    method: str,
) -> None:
    async with listening() as listener:
        reader, writer = await connect(listener)
        writer.write(
            f"{method} /p HTTP/1.1\r\nHost: p\r\nUser-Agent: a\r\nuser-agent: b\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WITHIN_S)
        rest = await closed_by_server(reader)
        writer.close()
        assert head.startswith(b"HTTP/1.1 400 ")
        assert b"Content-Type: application/problem+json" in head
        if method == "HEAD":
            assert rest == b""  # RFC 9110: an answer to HEAD carries no content
        else:
            assert json.loads(rest)["code"] == "invalid_request"
        assert listener.handled == []


# --- heads over the limits --------------------------------------------------------------


async def test_a_header_block_that_never_ends_is_answered_431_as_it_passes_the_limit() -> None:
    async with listening() as listener:
        reader, writer = await connect(listener)
        writer.write(b"GET /flood HTTP/1.1\r\nHost: p\r\n")
        # Past the limit by one header line, and never a blank line.
        for number in range(HEAD_LIMITS.header_bytes // 8000 + 1):
            writer.write(b"X-Flood-%d: %s\r\n" % (number, b"a" * 8000))
        status, body = await answer(reader)
        assert status == 431
        assert json.loads(body)["code"] == "headers_too_large"
        assert await closed_by_server(reader) == b""
        writer.close()
        assert listener.handled == []
        refusals = listener.metrics.registry.get_sample_value(
            "fenceproxy_refusals_total", {"code": "headers_too_large"}
        )
        assert refusals == 1


async def test_a_client_that_keeps_sending_after_a_refusal_is_cut_off() -> None:
    async with listening() as listener:
        reader, writer = await connect(listener)
        writer.write(b"GET /" + b"a" * HEAD_LIMITS.request_line)
        assert (await answer(reader))[0] == 414
        sent = 0
        with pytest.raises(ConnectionError):
            # The proxy drops LINGER_BYTES and closes; the rest is what the kernels
            # buffer. Dropping all it gets for LINGER_S would take gigabytes.
            while sent < 100 * LINGER_BYTES:
                writer.write(b"x" * 65536)
                await writer.drain()
                sent += 65536
        writer.close()


async def test_a_request_line_over_the_limit_is_answered_414() -> None:
    async with listening() as listener:
        reader, writer = await connect(listener)
        writer.write(b"GET /" + b"a" * HEAD_LIMITS.request_line)
        status, body = await answer(reader)
        assert status == 414
        assert json.loads(body)["code"] == "uri_too_long"
        writer.close()


async def test_bodies_and_pipelined_requests_pass_through_the_counter() -> None:
    # Each body is larger than the header limit: were it counted as a head, it would be refused.
    big = b"\r\n" * HEAD_LIMITS.header_bytes
    chunked = b"".join(b"2\r\n\r\n\r\n" for _ in range(HEAD_LIMITS.header_bytes))
    async with listening() as listener:
        reader, writer = await connect(listener)
        writer.write(
            b"POST /one HTTP/1.1\r\nHost: p\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)
            + b"POST /two HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked
            + b"0\r\n\r\n"
            + b"GET /three HTTP/1.1\r\nHost: p\r\n\r\n"
        )
        answers = [await answer(reader) for _ in range(3)]
        writer.close()
    assert answers == [
        (200, b"/one %d" % len(big)),
        (200, b"/two %d" % (2 * HEAD_LIMITS.header_bytes)),
        (200, b"/three 0"),
    ]


# --- max_connections --------------------------------------------------------------------


async def test_past_the_cap_the_connection_waiting_longest_is_closed() -> None:
    async with listening(max_connections=3) as listener:
        idle = [await connect(listener) for _ in range(3)]
        idle[0][1].write(b"GET /never-finished HTTP/1.1\r\n")
        await until(lambda: open_connections(listener.metrics) == 3, "3 connections open")
        reader, writer = await connect(listener)
        writer.write(b"GET /served HTTP/1.1\r\nHost: p\r\n\r\n")
        assert await answer(reader) == (200, b"/served 0")
        assert await closed_by_server(idle[0][0]) == b""
        assert shed(listener.metrics, "evicted") == 1
        assert open_connections(listener.metrics) == 3
        for _, idle_writer in [*idle, (reader, writer)]:
            idle_writer.close()


async def test_a_connection_with_a_request_being_handled_is_not_evicted() -> None:
    async with listening(max_connections=2) as listener:
        busy_reader, busy_writer = await connect(listener)
        busy_writer.write(b"GET /block HTTP/1.1\r\nHost: p\r\n\r\n")
        await until(lambda: listener.handled == ["/block"], "the blocking request")
        idle_reader, idle_writer = await connect(listener)
        await until(lambda: open_connections(listener.metrics) == 2, "2 connections open")
        reader, writer = await connect(listener)
        assert await closed_by_server(idle_reader) == b""
        writer.write(b"GET /served HTTP/1.1\r\nHost: p\r\n\r\n")
        assert await answer(reader) == (200, b"/served 0")
        listener.release.set()
        assert await answer(busy_reader) == (200, b"released")
        for stream_writer in (busy_writer, idle_writer, writer):
            stream_writer.close()


async def test_when_every_connection_has_a_request_being_handled_a_new_one_gets_503() -> None:
    async with listening(max_connections=1) as listener:
        busy_reader, busy_writer = await connect(listener)
        busy_writer.write(b"GET /block HTTP/1.1\r\nHost: p\r\n\r\n")
        await until(lambda: listener.handled == ["/block"], "the blocking request")
        reader, writer = await connect(listener)
        status, body = await answer(reader)
        assert status == 503
        assert json.loads(body)["code"] == "overloaded"
        assert shed(listener.metrics, "refused") == 1
        listener.release.set()
        assert await answer(busy_reader) == (200, b"released")
        busy_writer.close()
        writer.close()


# --- bodies awaited without a verified credential --------------------------------------

PENDING_BODY = b"Host: p\r\nContent-Length: 10\r\n\r\n{"  # 10 bytes promised, 1 sent


async def test_past_the_cap_an_uncredentialed_body_wait_is_shed_and_a_verified_one_kept() -> None:
    async with listening(max_connections=2) as listener:
        anonymous_reader, anonymous_writer = await connect(listener)
        anonymous_writer.write(b"POST /body HTTP/1.1\r\n" + PENDING_BODY)
        await until(lambda: listener.handled == ["/body"], "the anonymous body wait")
        verified_reader, verified_writer = await connect(listener)
        verified_writer.write(b"POST /credentialed HTTP/1.1\r\n" + PENDING_BODY)
        await until(lambda: len(listener.handled) == 2, "the verified body wait")
        reader, writer = await connect(listener)
        writer.write(b"GET /served HTTP/1.1\r\nHost: p\r\n\r\n")
        assert await answer(reader) == (200, b"/served 0")
        status, body = await answer(anonymous_reader)
        assert (status, json.loads(body)["code"]) == (503, "overloaded")
        assert json.loads(body)["detail"] == SHED_DETAIL.format(what="its body")
        assert await closed_by_server(anonymous_reader) == b""
        # read_body learns why its connection went: counted as shed, not as a failure.
        await until(lambda: listener.refusals == ["overloaded"], "the shed body read")
        assert shed(listener.metrics, "unverified") == 1
        assert shed(listener.metrics, "evicted") == 0
        verified_writer.write(b"123456789")
        assert await answer(verified_reader) == (200, b"/credentialed 10")
        for stream_writer in (anonymous_writer, verified_writer, writer):
            stream_writer.close()


async def test_the_longest_wait_goes_first_whether_idle_or_for_an_uncredentialed_body() -> None:
    """An idle connection is not preferred: during a flood of bodies that never come,
    a worker's new connection is idle until its head is read, the only one."""
    async with listening(max_connections=3) as listener:
        idle_reader, idle_writer = await connect(listener)
        await until(lambda: open_connections(listener.metrics) == 1, "the idle connection")
        waiting_reader, waiting_writer = await connect(listener)
        waiting_writer.write(b"POST /body HTTP/1.1\r\n" + PENDING_BODY)
        await until(lambda: listener.handled == ["/body"], "the body wait")
        newest_reader, newest_writer = await connect(listener)
        await until(lambda: open_connections(listener.metrics) == 3, "3 connections open")
        _, writer = await connect(listener)
        assert await closed_by_server(idle_reader) == b""
        assert (shed(listener.metrics, "evicted"), shed(listener.metrics, "unverified")) == (1, 0)
        _, other_writer = await connect(listener)
        status, body = await answer(waiting_reader)
        assert (status, json.loads(body)["code"]) == (503, "overloaded")
        assert (shed(listener.metrics, "evicted"), shed(listener.metrics, "unverified")) == (1, 1)
        # The newest of them, idle all along, is still open.
        newest_writer.write(b"GET /served HTTP/1.1\r\nHost: p\r\n\r\n")
        assert await answer(newest_reader) == (200, b"/served 0")
        for stream_writer in (idle_writer, waiting_writer, newest_writer, writer, other_writer):
            stream_writer.close()


async def test_when_every_body_wait_is_credentialed_a_new_connection_gets_503() -> None:
    async with listening(max_connections=1) as listener:
        verified_reader, verified_writer = await connect(listener)
        verified_writer.write(b"POST /credentialed HTTP/1.1\r\n" + PENDING_BODY)
        await until(lambda: listener.handled == ["/credentialed"], "the verified body wait")
        reader, writer = await connect(listener)
        status, body = await answer(reader)
        assert (status, json.loads(body)["code"]) == (503, "overloaded")
        assert shed(listener.metrics, "refused") == 1
        verified_writer.write(b"123456789")
        assert await answer(verified_reader) == (200, b"/credentialed 10")
        verified_writer.close()
        writer.close()


async def handled(listener: Listener, count: int) -> None:
    await until(lambda: len(listener.handled) == count, f"{count} requests handled")


async def test_past_max_unverified_waits_the_one_waiting_longest_is_shed() -> None:
    """Far below max_connections: the cap of their own holds however many come, and a
    verified body wait is not counted."""
    async with listening(max_unverified_waits=2) as listener:
        verified_reader, verified_writer = await connect(listener)
        verified_writer.write(b"POST /credentialed HTTP/1.1\r\n" + PENDING_BODY)
        await until(lambda: listener.handled == ["/credentialed"], "the verified body wait")
        anonymous = []
        for number in range(3):
            reader, writer = await connect(listener)
            writer.write(b"POST /body HTTP/1.1\r\n" + PENDING_BODY)
            anonymous.append((reader, writer))
            await handled(listener, 2 + number)
        status, body = await answer(anonymous[0][0])
        assert (status, json.loads(body)["code"]) == (503, "overloaded")
        assert shed(listener.metrics, "unverified") == 1
        for reader, writer in anonymous[1:]:
            writer.write(b"123456789")
            assert await answer(reader) == (200, b"/body 10")
        verified_writer.write(b"123456789")
        assert await answer(verified_reader) == (200, b"/credentialed 10")
        for stream_writer in (verified_writer, *(writer for _, writer in anonymous)):
            stream_writer.close()


async def test_a_request_whose_token_is_being_looked_up_may_be_shed() -> None:
    """Nothing is done before the lookup answers: a flood of made-up tokens waiting on
    a slow store holds no connection a worker needs."""
    store = SLOW_STORE
    store.asked.clear()
    store.answer.clear()
    async with listening(max_connections=1) as listener:
        looking_reader, looking_writer = await connect(listener)
        looking_writer.write(b"POST /lookup HTTP/1.1\r\n" + PENDING_BODY)
        await asyncio.wait_for(store.asked.wait(), WITHIN_S)
        reader, writer = await connect(listener)
        status, body = await answer(looking_reader)
        assert (status, json.loads(body)["detail"]) == (
            503,
            SHED_DETAIL.format(what="its token's lookup"),
        )
        writer.write(b"GET /served HTTP/1.1\r\nHost: p\r\n\r\n")
        assert await answer(reader) == (200, b"/served 0")
        store.answer.set()
        # The lookup's answer comes to a request that was shed: it goes no further.
        await until(lambda: listener.refusals == ["overloaded"], "the shed lookup")
        for stream_writer in (looking_writer, writer):
            stream_writer.close()


async def test_a_client_gone_before_its_body_is_a_refusal_not_a_failure() -> None:
    async with listening() as listener:
        _, writer = await connect(listener)
        writer.write(b"POST /body HTTP/1.1\r\n" + PENDING_BODY)
        await until(lambda: listener.handled == ["/body"], "the body wait")
        writer.close()
        await until(lambda: listener.refusals == ["invalid_request"], "the cut body read")
