"""Reading and validating what a client sent, refusing with a ProblemError."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import Any

from aiohttp import hdrs, web
from multidict import MultiMapping

from core.codes import ErrorCode
from policies import HOLDER_RE, LeaseBounds
from proxy.problems import ProblemError, problem
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
        raise ProblemError(ErrorCode.INVALID_REQUEST, f"the {name} header appears more than once")
    return values[0] if values else None


def check_target_size(request: web.Request) -> None:
    if len(request.raw_path) > MAX_TARGET:
        raise ProblemError(ErrorCode.URI_TOO_LONG, f"the request target is over {MAX_TARGET} bytes")


def check_header_sizes(request: web.Request) -> None:
    total = 0
    for name, value in request.raw_headers:
        if len(value) > MAX_HEADER_VALUE:
            raise ProblemError(
                ErrorCode.HEADERS_TOO_LARGE,
                f"header {name.decode('latin-1')} is over {MAX_HEADER_VALUE} bytes",
            )
        total += len(name) + len(value)
    if total > MAX_HEADER_TOTAL:
        raise ProblemError(
            ErrorCode.HEADERS_TOO_LARGE, f"headers are over {MAX_HEADER_TOTAL} bytes"
        )


def valid_idempotency_key(key: str) -> bool:
    return bool(_IDEMPOTENCY_KEY.match(key)) and key not in _DOT_SEGMENTS


def idempotency_key(request: web.Request) -> str | None:
    key = single_header(request, "Idempotency-Key")
    if key is not None and not valid_idempotency_key(key):
        raise ProblemError(
            ErrorCode.INVALID_REQUEST,
            "Idempotency-Key must be 1-255 characters of A-Z a-z 0-9 - . _ ~ : @, "
            "and not '.' or '..'",
        )
    return key


def check_header_encoding(headers: MultiMapping[str]) -> None:
    """Refuse a header value whose bytes are not UTF-8: aiohttp holds them as surrogates,
    which it cannot send on as the bytes that came, so nothing is forwarded at all."""
    for name, value in headers.items():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ProblemError(
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
    """With `Expect: 100-continue`, the token is looked up before the body is invited:
    one never issued here is refused then (403 invalid_token), so that anyone with a
    well-formed string cannot make the proxy wait for an upload it will refuse. Without
    it, the body is on its way anyway and the store's own decision refuses the token:
    the hot path pays no extra read."""
    if expects_continue(request) and await store.lease_of_token(token_hash(token)) is None:
        raise ProblemError(ErrorCode.INVALID_TOKEN, "the Fence-Token is not one this proxy issued")


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, refusing before reading more than `limit` bytes, or once the
    body has taken longer than the body timeout: a client that promises bytes and
    never sends them would otherwise hold its connection (and handler) forever."""
    declared = request.content_length
    if declared is not None and declared > limit:
        # Refused before reading a byte of it (and before inviting it, below).
        raise ProblemError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"the body is {declared} bytes; the limit is {limit}",
            limit=limit,
        )
    if expects_continue(request):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if declared is not None and request.content.is_eof():
        # Every byte it declared is already here (a small body arrives with its head):
        # nothing to wait for, so no timer to arm and cancel.
        return await request.content.read()
    timeout_s = request.config_dict.get(BODY_TIMEOUT)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, limit)
    except TimeoutError:
        raise ProblemError(
            ErrorCode.REQUEST_TIMEOUT,
            f"the body did not arrive within {timeout_s:g} s",
            limit_s=timeout_s,
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
            raise ProblemError(
                ErrorCode.PAYLOAD_TOO_LARGE, f"the body is over {limit} bytes", limit=limit
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
        raise ProblemError(ErrorCode.INVALID_REQUEST, f"the body is not valid JSON: {exc}") from exc
    except RecursionError:
        # Nesting deeper than the parser's stack: no control body is more than one level.
        raise ProblemError(ErrorCode.INVALID_REQUEST, "the body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ProblemError(ErrorCode.INVALID_REQUEST, "the body must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ProblemError(
            ErrorCode.INVALID_REQUEST,
            f"unknown field(s): {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})",
        )
    return data


def holder_name(value: Any) -> str:
    if not isinstance(value, str) or not HOLDER_RE.match(value):
        raise ProblemError(
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
        raise ProblemError(ErrorCode.INVALID_REQUEST, "ttl_s must be a number of seconds")
    if not bounds.min_ttl_s <= value <= bounds.max_ttl_s:
        raise ProblemError(
            ErrorCode.INVALID_REQUEST,
            f"ttl_s must be between {bounds.min_ttl_s:g} and {bounds.max_ttl_s:g}",
            min_ttl_s=bounds.min_ttl_s,
            max_ttl_s=bounds.max_ttl_s,
        )
    return float(value)


def fingerprint(method: str, path: str, query: str, body: bytes) -> str:
    """What makes two requests "the same operation" for an idempotency key."""
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode(), query.encode(), hashlib.sha256(body).digest()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
