"""The proxy's listener: request heads counted as they arrive, and connections capped.

aiohttp's parser keeps a request head until it is complete, up to 256 headers of
64 KiB each (16 MiB per connection); the proxy's own header checks run once it is.
Each connection here is a `GuardedConnection` in front of aiohttp's RequestHandler:
it feeds what arrives to a `HeadCounter` (core/request_heads.py) before the handler
sees it, and a head over the limits is answered `431 headers_too_large` or
`414 uri_too_long` (problem+json) and the connection closed, having held a few KiB.

At most `limits.max_connections` connections are open. One more closes the
connection that has waited longest, either without a request being handled (an
unfinished head, or an idle keep-alive connection) or on a request with no
verified credential (no configured client's key, no live lease's token) that has
done nothing yet: waiting for its token's lookup or its body (proxy/requests.py
`UnverifiedWait`; that one is answered `503 overloaded`). If every connection has
a request being handled otherwise, the new one is answered `503 overloaded` and
closed. A worker connecting during a flood of unfinished heads, or of bodies that
never come, is then the newest and is served, and once its credential is
verified its connection is kept.

Such unverified waits are also capped on their own (`limits.max_unverified_waits`,
a quarter of `max_requests` by default): one more sheds the one waiting longest in
the same way, so that however many of them come, they hold no more than that of
the requests that `max_requests` counts.

Everything here is aiohttp's public API (AppRunner, its `server` protocol factory,
`request.protocol`) and asyncio's: the listener is `loop.create_server` over a
factory that wraps aiohttp's, which is how TCPSite builds it too.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import signal
import ssl
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from core.codes import ErrorCode
from core.request_heads import ONCE_ONLY_FIELDS, HeadCounter, HeadLimits
from proxy.metrics import Metrics
from proxy.problems import problem_document
from proxy.requests import (
    MAX_HEADER_TOTAL,
    MAX_TARGET,
    SHED_DETAIL,
    UNVERIFIED_WAIT,
    UnverifiedWait,
)

# The head as sent, line ends and spaces included: the exact checks on what the
# parser made of it (proxy/requests.py, 8 KiB per value and 32 KiB of names and
# values) still run in the handler; these only stop a head well before the parser
# would hold megabytes of it. Room is left for a method, a version and line ends.
HEAD_LIMITS = HeadLimits(
    request_line=MAX_TARGET + 1024,
    # aiohttp's own max_headers (proxy/cli_serve.py PARSER_LIMITS): its plain-text 400
    # for one more is then never reached.
    header_lines=256,
    header_bytes=MAX_HEADER_TOTAL + 8192,
)
_DETAILS = {
    ErrorCode.HEADERS_TOO_LARGE: (
        f"the request's header block is over {HEAD_LIMITS.header_bytes} bytes as sent "
        f"or {HEAD_LIMITS.header_lines} lines"
    ),
    ErrorCode.URI_TOO_LONG: f"the request line is over {HEAD_LIMITS.request_line} bytes",
    ErrorCode.INVALID_REQUEST: (
        "the request repeats a field that may appear once "
        f"({', '.join(sorted(name.decode() for name in ONCE_ONLY_FIELDS))})"
    ),
    ErrorCode.OVERLOADED: "every connection the proxy keeps open has a request being handled",
}
# After a refusal the client may still be sending: closing at once would reset the
# connection and could destroy the answer before it is read. Its bytes are read and
# dropped for this long, or up to this many (a client still sending after that is
# not reading answers, and dropping its bytes costs the proxy a core), then the
# connection is closed.
LINGER_S = 2.0
LINGER_BYTES = 256 * 1024
# The freed memory of many closed connections goes back to the system this long
# after the last one closed (glibc keeps freed heap otherwise; see `_MallocTrim`).
TRIM_DELAY_S = 1.0


def refusal_bytes(code: ErrorCode, head_only: bool = False, detail: str | None = None) -> bytes:
    """A whole answer, written on the connection outside aiohttp's handling of it;
    `head_only` for a HEAD request, whose answer has no content (RFC 9110 §9.3.2)."""
    body = problem_document(code, detail or _DETAILS[code])
    extra = "Retry-After: 1\r\n" if code is ErrorCode.OVERLOADED else ""
    head = (
        f"HTTP/1.1 {code.status} {HTTPStatus(code.status).phrase}\r\n"
        f"Content-Type: application/problem+json\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


class GuardedConnection(asyncio.Protocol):
    """One client connection: aiohttp's handler, behind the head counter."""

    def __init__(self, guard: ConnectionGuard, handler: asyncio.Protocol) -> None:
        self._guard = guard
        self.handler = handler
        self.counter = HeadCounter(HEAD_LIMITS)
        self.transport: asyncio.Transport | None = None
        self._refused = False
        self._dropped = 0  # bytes received since the refusal

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.handler.connection_made(transport)
        self._guard.opened(self)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES and self.transport is not None:
                self.transport.close()
            return
        heads_before = self.counter.heads_completed
        refusal = self.counter.feed(data)
        if refusal is not None:
            self._guard.count_refusal(refusal)
            self.refuse(refusal)
            return
        if self.counter.heads_completed != heads_before:
            self._guard.request_started(self)
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.closed(self)
        self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def refuse(self, code: ErrorCode, detail: str | None = None) -> None:
        """Answer `code` and close, whatever the connection was doing."""
        transport = self.transport
        if self._refused or transport is None or transport.is_closing():
            return
        self._refused = True
        transport.write(refusal_bytes(code, self.counter.method == b"HEAD", detail))
        # A connection refused for want of room must give its room back at once.
        if code is not ErrorCode.OVERLOADED and transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        else:  # TLS cannot half-close: close once the answer is written.
            transport.close()

    def shed(self) -> None:
        """Close at once: the connection had no request being handled."""
        if self.transport is not None:
            self.transport.abort()


class ConnectionGuard:
    """Open connections in the order they began waiting for a request head."""

    def __init__(
        self, max_connections: int, metrics: Metrics, max_unverified_waits: int | None = None
    ) -> None:
        self._max = max_connections
        # None: no limit but max_connections (a guard built for a test).
        self._max_unverified_waits = max_unverified_waits
        self._metrics = metrics
        self._open: dict[asyncio.Protocol, GuardedConnection] = {}  # by aiohttp's handler
        # Connections with no request being handled, oldest wait first (dicts keep
        # insertion order): a request's end puts its connection last. Each with the
        # number its wait began with, to compare with `_unverified_waits`.
        self._waiting: dict[GuardedConnection, int] = {}
        # Connections whose request waits for its body without a verified credential,
        # oldest wait first, numbered from the same count.
        self._unverified_waits: dict[GuardedConnection, tuple[int, UnverifiedWait]] = {}
        self._waits_begun = 0
        self._trim = _MallocTrim()

    def protocol_factory(
        self, handler_factory: Callable[[], asyncio.Protocol]
    ) -> Callable[[], GuardedConnection]:
        """What `loop.create_server` calls per connection, around aiohttp's factory."""
        return lambda: GuardedConnection(self, handler_factory())

    def opened(self, connection: GuardedConnection) -> None:
        if len(self._open) >= self._max and not self._make_room():
            self._metrics.connections_shed.labels("refused").inc()
            connection.refuse(ErrorCode.OVERLOADED)
            return
        self._open[connection.handler] = connection
        self._waiting[connection] = self._next_wait()
        self._metrics.open_connections.set(len(self._open))

    def _next_wait(self) -> int:
        self._waits_begun += 1
        return self._waits_begun

    def _make_room(self) -> bool:
        """Close the connection that has waited longest, idle or for a body with no
        verified credential; False if there is none. Idle ones are not preferred: a
        worker's new connection is idle until its head is read, and during a flood of
        bodies it would be the only one."""
        oldest_idle = next(iter(self._waiting.items()), None)
        oldest_body = next(iter(self._unverified_waits.values()), None)
        if oldest_idle is not None and (oldest_body is None or oldest_idle[1] < oldest_body[0]):
            connection = oldest_idle[0]
            self._forget(connection)
            connection.shed()
            self._metrics.connections_shed.labels("evicted").inc()
            return True
        if oldest_body is not None:
            self._shed_oldest_unverified_wait()
            return True
        return False

    def _shed_oldest_unverified_wait(self) -> None:
        awaited, (_, wait) = next(iter(self._unverified_waits.items()))
        self._forget(awaited)
        # Before the close, which ends the body's read: read_body then knows why.
        wait.shed = True
        awaited.refuse(ErrorCode.OVERLOADED, SHED_DETAIL.format(what=wait.waiting_for))
        self._metrics.connections_shed.labels("unverified").inc()

    def closed(self, connection: GuardedConnection) -> None:
        self._forget(connection)
        self._trim.after_close()

    def _forget(self, connection: GuardedConnection) -> None:
        if self._open.pop(connection.handler, None) is not None:
            self._metrics.open_connections.set(len(self._open))
        self._waiting.pop(connection, None)
        self._unverified_waits.pop(connection, None)

    def request_started(self, connection: GuardedConnection) -> None:
        self._waiting.pop(connection, None)

    def request_ended(self, connection: GuardedConnection) -> None:
        if connection.handler in self._open:
            self._waiting.pop(connection, None)
            self._waiting[connection] = self._next_wait()

    def unverified_wait_began(self, connection: GuardedConnection, wait: UnverifiedWait) -> None:
        if connection.handler not in self._open:
            return
        # However many come, such waits hold at most this many connections (and
        # requests of max_requests): the one waiting longest makes room.
        if (
            self._max_unverified_waits is not None
            and len(self._unverified_waits) >= self._max_unverified_waits
        ):
            self._shed_oldest_unverified_wait()
        self._unverified_waits[connection] = (self._next_wait(), wait)

    def unverified_wait_ended(self, connection: GuardedConnection) -> None:
        self._unverified_waits.pop(connection, None)

    def count_refusal(self, code: ErrorCode) -> None:
        self._metrics.count_refusal(code)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """A connection with a request being handled is not evicted as idle; it may be
        shed only while that request waits for its body without a verified credential."""
        connection = self._open.get(request.protocol)
        if connection is None:
            return await handler(request)
        request[UNVERIFIED_WAIT] = _GuardedWait(self, connection)
        self.request_started(connection)
        try:
            return await handler(request)
        finally:
            self.request_ended(connection)


class _GuardedWait(UnverifiedWait):
    def __init__(self, guard: ConnectionGuard, connection: GuardedConnection) -> None:
        self._guard = guard
        self._connection = connection

    def begin(self) -> None:
        self._guard.unverified_wait_began(self._connection, self)

    def end(self) -> None:
        self._guard.unverified_wait_ended(self._connection)


class _MallocTrim:
    """glibc keeps the heap that closed connections freed, so a process that took a
    burst keeps its peak size; `malloc_trim(0)` gives the free pages back. Called once
    the connections stop closing for TRIM_DELAY_S, not on every close (it walks the
    heap). A no-op where the C library is not glibc."""

    def __init__(self) -> None:
        self._handle: asyncio.TimerHandle | None = None
        name = ctypes.util.find_library("c")
        library = ctypes.CDLL(name) if name else None
        self._trim: Callable[[int], int] | None = getattr(library, "malloc_trim", None)

    def after_close(self) -> None:
        if self._trim is None:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._handle = asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._run)

    def _run(self) -> None:
        self._handle = None
        assert self._trim is not None
        self._trim(0)


async def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    grace_s: float,
    max_connections: int,
    max_unverified_waits: int | None,
    metrics: Metrics,
    server_options: dict[str, Any],
    on_listening: Callable[[], None],
) -> None:
    """Serve `app` until SIGTERM or SIGINT, then stop as aiohttp's run_app does:
    close the listener, wait up to `grace_s` for requests in flight, run the cleanups.
    `on_listening` runs once the app started (its store open) and the port listens."""
    guard = ConnectionGuard(max_connections, metrics, max_unverified_waits)
    # First: requests refused by the other middlewares also end and free their connection.
    app.middlewares.insert(0, guard.middleware)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=grace_s, **server_options)
    try:
        await runner.setup()
        handler_factory = runner.server
        assert handler_factory is not None
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(
            guard.protocol_factory(handler_factory),
            host,
            port,
            ssl=ssl_context,
            backlog=128,
            reuse_address=True,
        )
        on_listening()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            listener.close()
    finally:
        await runner.cleanup()
