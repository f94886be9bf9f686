"""Forwarding to the upstream: at most once, and honest about what happened.

The client never retries on its own (aiohttp would re-send an idempotent-method
request whose pooled connection turned out closed; a PUT may still have landed).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from core.outcomes import Answered, DispatchResult, Lost, NotSent
from policies import Upstream
from policies.tls import upstream_context

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
FENCE_HEADERS = ("Fence-Epoch", "Fence-Resource", "Fence-Effect-Id")
# Never forwarded: the lease secret, headers only the proxy may set upstream, and
# framing headers the client recomputes.
_NOT_FORWARDED = (
    HOP_BY_HOP
    | {"host", "content-length", "expect", "fence-token"}
    | {name.lower() for name in FENCE_HEADERS}
)
# Response headers worth keeping for a replay; never cookies or framing.
REPLAYABLE_HEADERS = frozenset(
    {
        "content-type",
        "content-language",
        "content-location",
        "location",
        "etag",
        "last-modified",
        "cache-control",
    }
)
REPLAY_BODY_LIMIT = 1_048_576
UPSTREAM_BODY_LIMIT = 16 * 1_048_576


def new_client_session(
    limit: int = 512, tls: ssl.SSLContext | bool = True
) -> aiohttp.ClientSession:
    """A session of at most `limit` upstream connections; `tls` verifies https ones
    (True: aiohttp's default, the system's trust store)."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ssl=tls, enable_cleanup_closed=True),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None),
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
    need no token could take every connection and fail fenced writes (issue 8, item 4).
    Both forward at most once (`new_client_session`) and verify an https upstream with
    its own CA bundle (`upstream_context`)."""

    def __init__(self, upstreams: Iterable[Upstream]) -> None:
        self._fenced = {
            u.name: new_client_session(u.pool.fenced, upstream_context(u)) for u in upstreams
        }
        self._pass_through = {
            u.name: new_client_session(u.pool.pass_through, upstream_context(u)) for u in upstreams
        }

    def fenced(self, upstream: Upstream) -> aiohttp.ClientSession:
        return self._fenced[upstream.name]

    def pass_through(self, upstream: Upstream) -> aiohttp.ClientSession:
        return self._pass_through[upstream.name]

    async def close(self) -> None:
        for session in [*self._fenced.values(), *self._pass_through.values()]:
            await session.close()


# Headers whose removal would change what the request means or how it is framed: a
# Connection header may not make them hop-by-hop (the proxy would act on them and then
# strip them, e.g. check an Idempotency-Key the upstream never sees).
MEANINGFUL = frozenset({"idempotency-key", "fence-token", "content-length", "transfer-encoding"})


def strips_meaningful_header(headers: CIMultiDictProxy[str]) -> str | None:
    """The first meaningful header that `Connection` names, if any."""
    for token in sorted(connection_tokens(headers)):
        if token in MEANINGFUL or token.startswith("fence-"):
            return token
    return None


def connection_tokens(headers: CIMultiDictProxy[str]) -> set[str]:
    """Headers named in Connection are hop-by-hop for this message too."""
    return {
        token.strip().lower()
        for value in headers.getall("Connection", [])
        for token in value.split(",")
        if token.strip()
    }


def upstream_headers(request: web.Request, fence: dict[str, str] | None) -> CIMultiDict[str]:
    dropped = _NOT_FORWARDED | connection_tokens(request.headers)
    headers: CIMultiDict[str] = CIMultiDict(
        (name, value) for name, value in request.headers.items() if name.lower() not in dropped
    )
    client = request.remote or "unknown"
    host = request.host
    proto = request.scheme
    previous_for = request.headers.get("X-Forwarded-For")
    headers["X-Forwarded-For"] = f"{previous_for}, {client}" if previous_for else client
    headers["X-Forwarded-Host"] = host
    headers["X-Forwarded-Proto"] = proto
    quoted_for = _quoted(f"[{client}]") if ":" in client else client
    forwarded = f"for={quoted_for};host={_quoted(host)};proto={proto}"
    previous = request.headers.get("Forwarded")
    headers["Forwarded"] = f"{previous}, {forwarded}" if previous else forwarded
    if fence:
        headers.update(fence)
    return headers


def _quoted(value: str) -> str:
    """An RFC 7230 quoted-string (RFC 7239 takes its values so): a client's Host must not
    close the quotes and add Forwarded parameters of its own."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def downstream_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    dropped = HOP_BY_HOP | {"content-length"} | connection_tokens(headers)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in dropped)


def replayable(headers: CIMultiDict[str]) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in headers.items() if k.lower() in REPLAYABLE_HEADERS)


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    headers: CIMultiDict[str]
    body: bytes


def upstream_url(upstream: Upstream, request: web.Request) -> URL:
    return URL(upstream.url + request.raw_path, encoded=True)


@functools.cache
def client_timeout(upstream: Upstream) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=upstream.timeout_s, connect=upstream.connect_timeout_s)


async def dispatch(
    session: aiohttp.ClientSession,
    upstream: Upstream,
    method: str,
    url: URL,
    headers: CIMultiDict[str],
    body: bytes,
) -> tuple[DispatchResult, UpstreamResponse | None]:
    """Send once and read the whole answer. Only a failure to connect proves nothing left."""
    try:
        async with session.request(
            method,
            url,
            headers=headers,
            data=body,
            timeout=client_timeout(upstream),
            allow_redirects=False,
        ) as response:
            payload = await response.content.read(UPSTREAM_BODY_LIMIT + 1)
            if len(payload) > UPSTREAM_BODY_LIMIT:
                return Lost(f"upstream response over {UPSTREAM_BODY_LIMIT} bytes"), None
            return Answered(response.status), UpstreamResponse(
                response.status, downstream_headers(response.headers), payload
            )
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
