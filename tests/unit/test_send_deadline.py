"""The send deadline (core/send_deadline.py): checked on the admitting process's own
clock, once the upstream connection is had and before the first byte; past it nothing
is written. Clocks are injected: nothing here waits for wall-clock time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from multidict import CIMultiDict
from yarl import URL

from core.outcomes import Answered, NotSent, TooLateToSend
from core.send_deadline import SendDeadline, in_flight_until, sent_by
from policies import Upstream
from proxy import forwarding


@dataclass
class FakeClock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_runs_from_its_start_on_its_own_clock() -> None:
    clock = FakeClock()
    deadline = SendDeadline.start(1.5, clock)
    clock.now += 1.5
    assert deadline.overdue_s() == 0 and not deadline.passed()  # the last moment still sends
    clock.now += 0.25
    assert deadline.overdue_s() == 0.25 and deadline.passed()


def test_the_stored_deadline_covers_the_window_and_the_timeout() -> None:
    assert in_flight_until(1000.0, 2.0, 10.0) == 1012.0
    # A probe's settle window counts from the latest send, never before the admission.
    assert sent_by(1000.0, 1012.0, 10.0, None) == 1002.0
    assert sent_by(1000.0, 1005.0, 10.0, None) == 1000.0
    # Its own replica's receipt (a lost answer) came after the send.
    assert sent_by(1000.0, 1012.0, 10.0, 1000.5) == 1000.5
    assert sent_by(1000.0, 1012.0, 10.0, 1011.0) == 1002.0


@dataclass
class CountingUpstream:
    """A raw HTTP/1.1 server that records each connection's bytes, and moves the
    proxy's clock by `jump_on_connect_s` as it accepts one, before reading from it."""

    clock: FakeClock
    jump_on_connect_s: float = 0.0
    received: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        # The proxy's clock moves on while its connection is being set up.
        self.clock.now += self.jump_on_connect_s
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.received.append(head + await reader.readexactly(2))
            writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        except asyncio.IncompleteReadError as exc:
            self.received.append(exc.partial)
        finally:
            writer.close()
            self.closed.set()


@pytest.fixture
async def upstream() -> AsyncIterator[CountingUpstream]:
    counting = CountingUpstream(FakeClock())
    server = await asyncio.start_server(counting.handle, "127.0.0.1", 0)
    counting.port = server.sockets[0].getsockname()[1]
    async with server:
        yield counting


async def send(upstream: CountingUpstream, deadline: SendDeadline) -> object:
    target = Upstream("counting", f"http://127.0.0.1:{upstream.port}", 5, 1, send_window_s=1)
    pools = forwarding.UpstreamPools([target])
    try:
        result, _ = await forwarding.dispatch(
            pools.fenced(target),
            target,
            "POST",
            URL(f"{target.url}/orders/x"),
            CIMultiDict(),
            b"{}",
            deadline,
        )
    finally:
        await pools.close()
    return result


async def test_within_the_window_the_request_is_sent(upstream: CountingUpstream) -> None:
    deadline = SendDeadline.start(1.0, upstream.clock)
    upstream.jump_on_connect_s = 0.9
    assert await send(upstream, deadline) == Answered(201)
    assert len(upstream.received) == 1 and upstream.received[0].endswith(b"{}")


async def test_past_the_window_at_the_send_nothing_is_written(upstream: CountingUpstream) -> None:
    """The deadline passes while the connection is set up: the check comes after it
    (the upstream saw a connection), and not one byte of the request is written."""
    deadline = SendDeadline.start(1.0, upstream.clock)
    upstream.jump_on_connect_s = 1.1
    result = await send(upstream, deadline)
    assert isinstance(result, TooLateToSend) and isinstance(result, NotSent), result
    assert "send deadline (1s after admission) passed 0.100s" in result.reason, result
    await asyncio.wait_for(upstream.closed.wait(), 10)
    assert upstream.connections == 1
    assert upstream.received == [b""]


async def test_without_a_deadline_a_fenced_session_sends(upstream: CountingUpstream) -> None:
    """Probes share the fenced pools' request class: with no deadline set, it sends."""
    upstream.jump_on_connect_s = 1000.0
    target = Upstream("counting", f"http://127.0.0.1:{upstream.port}", 5, 1)
    pools = forwarding.UpstreamPools([target])
    try:
        result, _ = await forwarding.dispatch(
            pools.fenced(target), target, "POST", URL(f"{target.url}/x"), CIMultiDict(), b"{}"
        )
    finally:
        await pools.close()
    assert result == Answered(201)
