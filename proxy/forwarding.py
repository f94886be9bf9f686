"""Forwarding to the upstream: at most once, and honest about what happened.

The client never retries on its own (aiohttp would re-send an idempotent-method
request whose pooled connection turned out closed; a PUT may still have landed).
"""

from __future__ import annotations

import contextvars
import functools
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from core import failpoints
from core.frozen import quick_init
from core.outcomes import Answered, DispatchResult, Lost, NotSent, TooLateToSend
from core.send_deadline import SendDeadline
from policies import Upstream
from policies.tls import upstream_context
from proxy.auth import Credentials

# RFC 9110 §7.6.1 and the older proxy headers. Not "trailers": a header of that name
# is an ordinary end-to-end one (RFC 9110 names the hop-by-hop one `Trailer`).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
REPLAYED = "Idempotent-Replayed"
# Never forwarded (besides every `Fence-*`): the lease secret and fence headers only the
# proxy may set upstream, framing the client recomputes, and Host, the upstream's.
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "expect"}
# Never passed back (besides every `Fence-*`): framing, and the headers the proxy sets
# in its own answers (an upstream's "Idempotent-Replayed: true" is not the proxy's word).
_NOT_RETURNED = HOP_BY_HOP | {"content-length", REPLAYED.lower()}
# Kept in a first answer, never replayed: a cookie is for the one worker it was set for.
NOT_REPLAYED = frozenset({"set-cookie"})
# What aiohttp's client adds on its own unless told not to: the proxy adds no header a
# worker did not send (Content-Type: application/octet-stream on a body included).
_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
REPLAY_BODY_LIMIT = 1_048_576
UPSTREAM_BODY_LIMIT = 16 * 1_048_576
# An upstream answer's head, as the proxy reads it: the status line, and each header
# field's name and value together, up to 64 KiB; at most 256 header fields (so at most
# 16 MiB in all, like the body). aiohttp's defaults (8190 bytes a line, 128 fields)
# made an ordinary long Content-Security-Policy or Set-Cookie a lost answer, and a
# committed write an UNKNOWN effect. A head over these is still an answer the upstream
# gave (the write may have been applied): it is treated as a lost one (AnswerHeadTooLarge).
ANSWER_LINE_LIMIT = 65_536
ANSWER_FIELDS_LIMIT = 256
# aiohttp's parsers draw their line limit a few bytes either side of where they are
# told, depending on how the line arrived, and count the status line among the
# fields: they are set past the limits, which `check_answer_head` then checks
# exactly on what they read.
_PARSER_LINE_LIMIT = ANSWER_LINE_LIMIT + 1024
_PARSER_FIELDS_LIMIT = ANSWER_FIELDS_LIMIT + 8
_STATUS_LINE_START = len("HTTP/1.1 200 ")


# `Fence-*` (a lowered name's start): the proxy's headers, in both directions; nobody
# else's copy passes.
PROXY_OWNED = "fence-"


def _send_clock() -> Callable[[], float]:
    """The clock of the send deadline: monotonic, and on Linux counting the time the
    machine was suspended too (CLOCK_BOOTTIME), since a pause is what it must see."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.monotonic
    return functools.partial(time.clock_gettime, boottime)


SEND_CLOCK = _send_clock()
# The send deadline of the fenced request this task is sending (`dispatch` sets it): the
# request class is the session's, and this is how one request's deadline reaches it.
_SEND_DEADLINE: contextvars.ContextVar[SendDeadline | None] = contextvars.ContextVar(
    "send_deadline", default=None
)


class SendDeadlinePassed(Exception):
    """Raised in `FencedRequest.send`, before any byte is written."""

    def __init__(self, deadline: SendDeadline, overdue_s: float) -> None:
        super().__init__(
            f"the send deadline ({deadline.window_s:g}s after admission) passed "
            f"{overdue_s:.3f}s before the request could be sent"
        )


class FencedRequest(aiohttp.ClientRequest):
    """A fenced request: `send` runs once the connection is had, before the request's
    first byte is written (aiohttp buffers the head until the body or the end is
    written, both inside `send`), so the send deadline is checked as late as it can be.
    Refused, nothing is written and aiohttp closes the connection. `request_class` is
    ClientSession's documented hook; tests/unit/test_send_deadline.py pins that `send`
    still runs after the connect and before any byte, so an aiohttp that changes it
    fails a test, not a write."""

    async def send(self, conn: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
        deadline = _SEND_DEADLINE.get()
        if deadline is not None:
            overdue_s = deadline.overdue_s()
            if overdue_s > 0:
                raise SendDeadlinePassed(deadline, overdue_s)
        failpoints.reach(failpoints.BEFORE_SEND)
        return await super().send(conn)


def new_client_session(
    limit: int = 512,
    tls: ssl.SSLContext | bool = True,
    request_class: type[aiohttp.ClientRequest] = aiohttp.ClientRequest,
) -> aiohttp.ClientSession:
    """A session of at most `limit` upstream connections; `tls` verifies https ones
    (True: aiohttp's default, the system's trust store)."""
    session = aiohttp.ClientSession(
        request_class=request_class,
        connector=aiohttp.TCPConnector(limit=limit, ssl=tls, enable_cleanup_closed=True),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None),
        # One session serves every worker: a jar would hand one worker's cookies (set
        # by the upstream in its answer) to the next worker's requests.
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=_AUTO_HEADERS,
        max_line_size=_PARSER_LINE_LIMIT,
        max_field_size=_PARSER_LINE_LIMIT,
        max_headers=_PARSER_FIELDS_LIMIT,
    )
    # Forward at most once: aiohttp otherwise re-sends GET/PUT/DELETE/... when a
    # pooled connection fails, and the first attempt may already have landed.
    # aiohttp has no public switch for this (aio-libs/aiohttp#10790); this private
    # attribute is the one its own TestClient sets. tests/unit/test_forwarding.py
    # pins the behaviour, so an aiohttp that drops it fails a test, not a write.
    session._retry_connection = False
    return session


class UpstreamPools:
    """Two sessions per upstream, fenced and pass-through, each with its own connection
    limit (the upstream's `pool`): with one shared pool, slow pass-through reads that
    need no token could take every connection and fail fenced writes.
    Both forward at most once (`new_client_session`) and verify an https upstream with
    its own CA bundle (`upstream_context`)."""

    def __init__(self, upstreams: Iterable[Upstream]) -> None:
        # By the upstream's whole value, not its name: a request keeps the session of
        # the upstream it started with when a reload changes it (`update`).
        self._fenced: dict[Upstream, aiohttp.ClientSession] = {}
        self._pass_through: dict[Upstream, aiohttp.ClientSession] = {}
        # Sessions of upstreams a reload took away: requests that started before it
        # still find them, until `close_retired`.
        self._retired_fenced: dict[Upstream, aiohttp.ClientSession] = {}
        self._retired_pass_through: dict[Upstream, aiohttp.ClientSession] = {}
        self.update(upstreams)

    def update(self, upstreams: Iterable[Upstream]) -> list[Upstream]:
        """Sessions for the upstreams new or changed; the upstreams no longer named are
        returned, for `close_retired` once the requests that started before are done
        (closing a session cuts its connections in use)."""
        wanted = set(upstreams)
        gone = set(self._fenced) - wanted
        for u in gone:
            self._retired_fenced[u] = self._fenced.pop(u)
            self._retired_pass_through[u] = self._pass_through.pop(u)
        for u in wanted - set(self._fenced):
            back_fenced = self._retired_fenced.pop(u, None)
            back_pass_through = self._retired_pass_through.pop(u, None)
            self._fenced[u] = back_fenced or new_client_session(
                u.pool.fenced, upstream_context(u), FencedRequest
            )
            self._pass_through[u] = back_pass_through or new_client_session(
                u.pool.pass_through, upstream_context(u)
            )
        return sorted(gone, key=lambda u: u.name)

    async def close_retired(self, upstreams: Iterable[Upstream]) -> None:
        for u in upstreams:
            for retired in (self._retired_fenced, self._retired_pass_through):
                session = retired.pop(u, None)
                if session is not None:
                    await session.close()

    def fenced(self, upstream: Upstream) -> aiohttp.ClientSession:
        return self._fenced.get(upstream) or self._retired_fenced[upstream]

    def pass_through(self, upstream: Upstream) -> aiohttp.ClientSession:
        return self._pass_through.get(upstream) or self._retired_pass_through[upstream]

    async def close(self) -> None:
        for sessions in (
            self._fenced,
            self._pass_through,
            self._retired_fenced,
            self._retired_pass_through,
        ):
            for session in sessions.values():
                await session.close()


# Headers whose removal would change what the request means or how it is framed: a
# Connection header may not make them hop-by-hop (the proxy would act on them and then
# strip them, e.g. check an Idempotency-Key the upstream never sees).
MEANINGFUL = frozenset({"idempotency-key", "fence-token", "content-length", "transfer-encoding"})


def strips_meaningful_header(headers: CIMultiDictProxy[str]) -> str | None:
    """The first meaningful header that `Connection` names, if any."""
    for token in sorted(connection_tokens(headers)):
        if token in MEANINGFUL or token.startswith(PROXY_OWNED):
            return token
    return None


def connection_tokens(headers: CIMultiDictProxy[str]) -> set[str]:
    """Headers named in Connection are hop-by-hop for this message too."""
    return {
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
        if token.strip()
    }


def _dropped(always: frozenset[str], headers: CIMultiDictProxy[str]) -> frozenset[str]:
    """`always`, and what this message's Connection header names (most name nothing
    but keep-alive or close: no new set is built for them)."""
    named = connection_tokens(headers)
    return always | named if named - always else always


def upstream_headers(
    request: web.Request,
    fence: dict[str, str] | None,
    credentials: Credentials | None = None,
) -> CIMultiDict[str]:
    """The worker's end-to-end headers, in order with duplicates, less what is never
    forwarded and any credential of this proxy; then the route's fence headers."""
    dropped = _dropped(_NOT_FORWARDED, request.headers)
    # One spelling per name: aiohttp's client session merges a name it has not seen in
    # that exact case by replacing (`X-A: a` then `x-a: b` left only `x-a: b`).
    spelling: dict[str, str] = {}
    kept: list[tuple[str, str]] = []
    for name, value in request.headers.items():
        lower = name.lower()
        if (
            lower in dropped
            or lower.startswith(PROXY_OWNED)
            or (
                lower == "authorization"
                and credentials is not None
                and credentials.carried_by(value)
            )
        ):
            continue
        kept.append((spelling.setdefault(lower, name), value))
    headers: CIMultiDict[str] = CIMultiDict(kept)
    if fence:
        headers.update(fence)
    return headers


def downstream_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    dropped = _dropped(_NOT_RETURNED, headers)
    kept: list[tuple[str, str]] = []
    for name, value in headers.items():
        lower = name.lower()
        if lower not in dropped and not lower.startswith(PROXY_OWNED):
            kept.append((name, value))
    return CIMultiDict(kept)


def replayable(headers: CIMultiDict[str]) -> tuple[tuple[str, str], ...]:
    """Every end-to-end header of a first answer (as passed on), less cookies."""
    return tuple((k, v) for k, v in headers.items() if k.lower() not in NOT_REPLAYED)


@quick_init
@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    reason: str | None
    headers: CIMultiDict[str]
    # Empty when `over_limit`: the body went past UPSTREAM_BODY_LIMIT and was not kept.
    body: bytes
    over_limit: bool = False


def upstream_url(upstream: Upstream, request: web.Request) -> URL:
    """The upstream's URL with the worker's request target as sent, byte for byte: yarl
    drops an empty query ("/a?" would go up as "/a"), so the whole target, query
    included, is the URL's encoded path, which aiohttp writes as it is."""
    base, prefix = _base_url(upstream)
    return base.with_path(prefix + request.raw_path, encoded=True)


@functools.cache
def _base_url(upstream: Upstream) -> tuple[URL, str]:
    """The upstream's URL, parsed once, and the path every target goes under."""
    base = URL(upstream.url, encoded=True)
    return base, "" if base.raw_path == "/" else base.raw_path


def upstream_body(request: web.Request, body: bytes) -> bytes | None:
    """What to hand aiohttp as the body: None (no framing header at all) for a request
    that had no body and said nothing about one, so that none is added to it."""
    framed = hdrs.CONTENT_LENGTH in request.headers or hdrs.TRANSFER_ENCODING in request.headers
    return body if body or framed else None


async def _unframed(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    # aiohttp gives a bodiless DELETE (any method but GET, HEAD, OPTIONS, TRACE)
    # "Content-Length: 0" of its own; the worker's request had none.
    request.headers.popall(hdrs.CONTENT_LENGTH, None)
    return await handler(request)


class AnswerHeadTooLarge(aiohttp.ClientResponseError):
    """The upstream answered with a head over the proxy's limits: it is not read, and
    it is not "nothing was sent" either (a ClientError after sending: a fenced write's
    effect is UNKNOWN, a pass-through request `504 outcome_unknown`)."""


def answer_head_problem(
    reason: str | None, raw_headers: tuple[tuple[bytes, bytes], ...]
) -> str | None:
    """What makes an answer's head go past the limits, if anything does."""
    if len(raw_headers) > ANSWER_FIELDS_LIMIT:
        return f"{len(raw_headers)} header fields (at most {ANSWER_FIELDS_LIMIT} are read)"
    if _STATUS_LINE_START + len((reason or "").encode()) > ANSWER_LINE_LIMIT:
        return f"a status line over {ANSWER_LINE_LIMIT} bytes"
    for name, value in raw_headers:
        if len(name) + len(value) > ANSWER_LINE_LIMIT:
            return (
                f"header {name[:64].decode('latin-1')} with {len(name) + len(value)} bytes "
                f"of name and value (at most {ANSWER_LINE_LIMIT} are read)"
            )
    return None


def check_answer_head(response: aiohttp.ClientResponse) -> None:
    """Raises AnswerHeadTooLarge for an answer whose head is over the limits. Every
    forwarded request, fenced and pass-through, calls it first thing on its answer (a
    client middleware did, at the price of a chain of coroutines built per request)."""
    problem = answer_head_problem(response.reason, response.raw_headers)
    if problem is not None:
        response.close()  # its body unread: the connection cannot serve another request
        raise AnswerHeadTooLarge(
            response.request_info,
            (),
            status=response.status,
            message=f"the upstream answered {response.status} with a head the proxy does "
            f"not read: {problem}; the request may have been applied",
        )


_UNFRAMED = (_unframed,)


def framing_middlewares(data: bytes | None) -> tuple[aiohttp.ClientMiddlewareType, ...] | None:
    """The client middlewares of a forwarded request: no framing header on a request that
    had none; None (the session's: none) for any other."""
    return _UNFRAMED if data is None else None


def sent_nothing(exc: BaseException) -> bool:
    """Whether a failure proves that no byte of the request left: only failing to
    connect (the TLS handshake included) does. Anything later (a reset, a close, a
    read timeout) may have come after the upstream got it all."""
    return isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError)


async def read_whole(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, as it arrives (one `read(n)` returns only what is buffered);
    None as soon as it is over `limit` bytes. A body cut short raises ClientPayloadError."""
    if response.content_length is not None and response.content_length <= limit:
        # Its length declared and within the limit: read at once, as any client does.
        return await response.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


@functools.cache
def client_timeout(upstream: Upstream) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=upstream.timeout_s, connect=upstream.connect_timeout_s)


async def dispatch(
    session: aiohttp.ClientSession,
    upstream: Upstream,
    method: str,
    url: URL,
    headers: CIMultiDict[str],
    body: bytes | None,
    send_deadline: SendDeadline | None = None,
) -> tuple[DispatchResult, UpstreamResponse | None]:
    """Send once and read the whole answer. Only a failure to connect, or the send
    deadline found passed before the first byte (on a session of FencedRequest),
    proves nothing left. An answer over UPSTREAM_BODY_LIMIT is still an answer (its
    status says what happened), with no body."""
    deadline_set = _SEND_DEADLINE.set(send_deadline)
    try:
        async with session.request(
            method,
            url,
            headers=headers,
            data=body,
            timeout=client_timeout(upstream),
            allow_redirects=False,
            middlewares=framing_middlewares(body),
        ) as response:
            check_answer_head(response)
            answered = (response.status, response.reason, downstream_headers(response.headers))
            payload = await read_whole(response, UPSTREAM_BODY_LIMIT)
            if payload is None:
                return Answered(response.status), UpstreamResponse(*answered, b"", True)
            return Answered(response.status), UpstreamResponse(*answered, payload)
    except SendDeadlinePassed as exc:
        return TooLateToSend(str(exc)), None
    except aiohttp.ConnectionTimeoutError as exc:
        return NotSent(f"connect timeout after {upstream.connect_timeout_s}s ({exc})"), None
    except aiohttp.ClientConnectorError as exc:
        # A failed TLS handshake (an upstream certificate that does not verify included)
        # is a ClientConnectorError too: it ends before any byte of the request is sent.
        return NotSent(f"cannot connect to {upstream.name}: {exc.os_error}"), None
    except TimeoutError:
        return Lost(f"no complete answer within {upstream.timeout_s}s"), None
    except (aiohttp.ClientError, OSError) as exc:
        return Lost(f"{type(exc).__name__}: {exc}"), None
    finally:
        _SEND_DEADLINE.reset(deadline_set)
