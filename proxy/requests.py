"""Reading and validating what a client sent, refusing with a `Refusal`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import hdrs, web
from multidict import MultiMapping

from core.codes import ErrorCode
from core.records import LeaseRecord, Refusal
from policies import HOLDER_RE, LeaseBounds
from proxy.problems import problem
from proxy.tokens import token_hash
from store import Store

MAX_CONTROL_BODY = 65536
MAX_HEADER_VALUE = 8192
MAX_HEADER_TOTAL = 32768
# No route of ours needs a longer target, and every refusal stores the path: over this,
# 414 before anything is matched (aiohttp's own line limit, 64 KiB, is further out).
MAX_TARGET = 8192
# RFC 3986 §3.3 pchar without percent-encodings and sub-delims (unreserved, ':' and
# '@'): a key is a path segment of a probe URL that no layer may rewrite, so it needs no
# escaping, decodes to itself, and is not a dot segment (§5.2.4 removes those).
_IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9\-._~:@]{1,255}\Z")
_DOT_SEGMENTS = frozenset({".", ".."})
# Seconds a client has to send a request's body once its headers arrived (the policy's
# `limits.body_timeout_s`); set by build_app, absent (no limit) on a bare application.
BODY_TIMEOUT = web.AppKey("body_timeout_s", float)


def single_header(request: web.Request, name: str) -> str | None:
    """The header's one value; two copies of a header that carries authority are ambiguous."""
    values = request.headers.getall(name, [])
    if len(values) > 1:
        raise Refusal(ErrorCode.INVALID_REQUEST, f"the {name} header appears more than once")
    return values[0] if values else None


def check_target_size(request: web.Request) -> None:
    if len(request.raw_path) > MAX_TARGET:
        raise Refusal(ErrorCode.URI_TOO_LONG, f"the request target is over {MAX_TARGET} bytes")


def check_header_sizes(request: web.Request) -> None:
    total = 0
    for name, value in request.raw_headers:
        if len(value) > MAX_HEADER_VALUE:
            raise Refusal(
                ErrorCode.HEADERS_TOO_LARGE,
                f"header {name.decode('latin-1')} is over {MAX_HEADER_VALUE} bytes",
            )
        total += len(name) + len(value)
    if total > MAX_HEADER_TOTAL:
        raise Refusal(ErrorCode.HEADERS_TOO_LARGE, f"headers are over {MAX_HEADER_TOTAL} bytes")


def valid_idempotency_key(key: str) -> bool:
    return bool(_IDEMPOTENCY_KEY.match(key)) and key not in _DOT_SEGMENTS


def idempotency_key(request: web.Request) -> str | None:
    key = single_header(request, "Idempotency-Key")
    if key is not None and not valid_idempotency_key(key):
        raise Refusal(
            ErrorCode.INVALID_REQUEST,
            "Idempotency-Key must be 1-255 characters of A-Z a-z 0-9 - . _ ~ : @, "
            "and not '.' or '..'",
        )
    return key


def check_header_encoding(headers: MultiMapping[str]) -> None:
    """Refuse a header value whose bytes are not UTF-8: aiohttp holds them as surrogates,
    which it cannot send on as the bytes that came, so nothing is forwarded at all."""
    for name, value in headers.items():
        if value.isascii():  # nearly every value: a flag of the string, no bytes made
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Refusal(
                ErrorCode.INVALID_REQUEST,
                f"the value of header {name.encode('ascii', 'backslashreplace').decode()} "
                "is not UTF-8",
            ) from None


async def defer_continue(request: web.Request) -> web.Response | None:
    """The proxied routes' Expect handler: aiohttp's own answers 100 Continue before
    the handler runs, which invites the body before the token, key and size checks
    that need none. `read_body` sends it instead, once those have passed. Any other
    expectation is answered here (417), before the handler and its middlewares."""
    if not expects_continue(request):
        return problem(
            ErrorCode.EXPECTATION_FAILED,
            f"unknown Expect: {request.headers[hdrs.EXPECT]} (only 100-continue is supported)",
        )
    return None


def expects_continue(request: web.Request) -> bool:
    """The client waits for 100 Continue before sending its body (`read_body` sends it)."""
    return request.headers.get(hdrs.EXPECT, "").lower() == "100-continue"


async def refuse_unissued_token_before_inviting(
    request: web.Request, token: str, store: Store
) -> None:
    """The token is looked up before a body that has not arrived is waited for (or
    invited, with `Expect: 100-continue`): one never issued here is refused then
    (403 invalid_token), so that anyone with a well-formed string can neither make the
    proxy wait for an upload it will refuse nor hold a connection meanwhile. A body
    that came with the head is not waited for: the store's own decision refuses the
    token, and the hot path (a small body in the head's packets) pays no extra read.
    A live lease's token is a verified credential (`CREDENTIAL_VERIFIED`)."""
    if expects_continue(request) or body_pending(request):
        await lease_before_body(request, token, store)


async def lease_before_body(request: web.Request, token: str, store: Store) -> LeaseRecord:
    """The lease of the request's token, looked up before any of its body is read:
    never issued here, 403 invalid_token; live, the request's credential is verified
    (its connection is then kept while its body comes). A token whose lease ended or
    expired is no credential: its request goes on, to be refused by the store, but
    its connection may be shed while its body is awaited (proxy/connections.py), as
    while the lookup itself is awaited: nothing has been done yet."""
    async with _unverified_wait(request, "its token's lookup"):
        lease = await store.lease_of_token(token_hash(token))
    if lease is None:
        # The body that may still come is not waited for, nor drained.
        if expects_continue(request) or body_pending(request):
            request[CLOSE_AFTER_ANSWER] = True
        raise Refusal(ErrorCode.INVALID_TOKEN, "the Fence-Token is not one this proxy issued")
    # The proxy's clock, not the store's: this only decides which connections may be
    # shed, never whether the lease holds (the store decides that, by its own clock).
    if lease.live(time.time()):
        request[CREDENTIAL_VERIFIED] = True
    return lease


def body_pending(request: web.Request) -> bool:
    """The request has a body that has not all arrived yet."""
    return request.body_exists and not request.content.is_eof()


class UnverifiedWait:
    """A request's part in the connection guard (proxy/connections.py): while a
    request with no verified credential waits, having done nothing yet (for its
    token's lookup, for its body), the guard may shed its connection, answering 503
    overloaded, to make room for another. `begin` and `end` bracket such a wait; the
    guard sets `shed` when it took the connection, and the request then goes no
    further."""

    shed = False
    waiting_for = ""  # what the wait is for, said in the answer if it is shed

    def begin(self) -> None:
        """The request waits from now on."""

    def end(self) -> None:
        """The wait is over."""


# Set by the connection guard on each request it serves (absent on a bare application).
UNVERIFIED_WAIT = web.RequestKey("unverified_wait", UnverifiedWait)
# Set once the request's credential is verified: a configured client's key or
# certificate (proxy/auth.py `require`), or a live lease's token (`lease_before_body`).
CREDENTIAL_VERIFIED = web.RequestKey("credential_verified", bool)
# Set on a request refused while its body may still be coming: its answer is sent, then
# the connection closed (proxy/app.py), since that body is not wanted.
CLOSE_AFTER_ANSWER = web.RequestKey("close_after_answer", bool)
SHED_DETAIL = (
    "the proxy needed the room: this connection, waiting (for {what}) on a request with "
    "no verified credential, was the one waiting longest (limits.max_connections, "
    "limits.max_unverified_waits)"
)


@contextlib.asynccontextmanager
async def _unverified_wait(request: web.Request, what: str) -> AsyncIterator[None]:
    """A wait the guard may cut short, unless the request's credential is verified:
    a shed one ends in 503 overloaded, and one whose client went in 400 (nobody reads
    either; each is counted for what it is, not logged as the proxy's failure)."""
    wait = None if request.get(CREDENTIAL_VERIFIED) else request.get(UNVERIFIED_WAIT)
    if wait is not None:
        wait.waiting_for = what
        wait.begin()
    try:
        yield
    except ConnectionError:
        if wait is not None and wait.shed:
            raise Refusal(ErrorCode.OVERLOADED, SHED_DETAIL.format(what=what)) from None
        raise Refusal(
            ErrorCode.INVALID_REQUEST, f"the connection closed during the wait for {what}"
        ) from None
    finally:
        if wait is not None:
            wait.end()
    if wait is not None and wait.shed:
        # Shed while the wait ended by itself: its answer is gone, so nothing more.
        raise Refusal(ErrorCode.OVERLOADED, SHED_DETAIL.format(what=what))


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, refusing before reading more than `limit` bytes, or once the
    body has taken longer than the body timeout: a client that promises bytes and
    never sends them would otherwise hold its connection (and handler) forever.
    Without a verified credential the wait may also end by the guard shedding the
    connection for room (`UnverifiedWait`)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        # Refused before reading a byte of it (and before inviting it, below).
        raise Refusal(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"the body is {declared} bytes; the limit is {limit}",
            {"limit": limit},
        )
    if expects_continue(request):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if not body_pending(request):
        return await _read_body(request, limit)
    timeout_s = request.config_dict.get(BODY_TIMEOUT)
    try:
        async with _unverified_wait(request, "its body"), asyncio.timeout(timeout_s):
            return await _read_body(request, limit)
    except TimeoutError:
        request[CLOSE_AFTER_ANSWER] = True
        raise Refusal(
            ErrorCode.REQUEST_TIMEOUT,
            f"the body did not arrive within {timeout_s:g} s",
            {"limit_s": timeout_s},
        ) from None


async def _read_body(request: web.Request, limit: int) -> bytes:
    declared = request.content_length
    if declared is not None:
        # Framed by Content-Length (already checked against the limit): one read.
        return await request.content.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(65536):
        size += len(chunk)
        if size > limit:
            raise Refusal(
                ErrorCode.PAYLOAD_TOO_LARGE, f"the body is over {limit} bytes", {"limit": limit}
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def json_object(request: web.Request, allowed: set[str]) -> dict[str, Any]:
    raw = await read_body(request, MAX_CONTROL_BODY)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refusal(ErrorCode.INVALID_REQUEST, f"the body is not valid JSON: {exc}") from exc
    except RecursionError:
        # Nesting deeper than the parser's stack: no control body is more than one level.
        raise Refusal(ErrorCode.INVALID_REQUEST, "the body is nested too deeply") from None
    if not isinstance(data, dict):
        raise Refusal(ErrorCode.INVALID_REQUEST, "the body must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise Refusal(
            ErrorCode.INVALID_REQUEST,
            f"unknown field(s): {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})",
        )
    return data


def holder_name(value: Any) -> str:
    if not isinstance(value, str) or not HOLDER_RE.match(value):
        raise Refusal(
            ErrorCode.INVALID_REQUEST, "holder must be 1-128 characters of A-Z a-z 0-9 . _ : @ -"
        )
    return value


def ttl(data: dict[str, Any], bounds: LeaseBounds) -> float:
    """The body's `ttl_s`: the policy's default when the field is absent. `null` is
    refused, not read as absent: a client that sends it meant some number."""
    if "ttl_s" not in data:
        return bounds.default_ttl_s
    value = data["ttl_s"]
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise Refusal(ErrorCode.INVALID_REQUEST, "ttl_s must be a number of seconds")
    if not bounds.min_ttl_s <= value <= bounds.max_ttl_s:
        raise Refusal(
            ErrorCode.INVALID_REQUEST,
            f"ttl_s must be between {bounds.min_ttl_s:g} and {bounds.max_ttl_s:g}",
            {"min_ttl_s": bounds.min_ttl_s, "max_ttl_s": bounds.max_ttl_s},
        )
    return float(value)


def fingerprint(method: str, path: str, query: str, body: bytes) -> str:
    """What makes two requests "the same operation" for an idempotency key."""
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode(), query.encode(), hashlib.sha256(body).digest()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
