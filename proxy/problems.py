"""RFC 9457 problem responses, one per `ErrorCode`."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from core.codes import ErrorCode
from core.records import Refusal

PROBLEM_TYPE_BASE = "https://fenceproxy.dev/problems/"
STORE_RETRY_AFTER_S = "1"


def problem_document(code: ErrorCode, detail: str, **context: Any) -> bytes:
    body = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": code.problem_title,
        "status": code.status,
        "detail": detail,
        "code": code,
        **{key: value for key, value in context.items() if value is not None},
    }
    return json.dumps(body).encode()


def problem(
    code: ErrorCode, detail: str, headers: dict[str, str] | None = None, **context: Any
) -> web.Response:
    if code is ErrorCode.STORE_UNAVAILABLE:
        # Whatever made the store unavailable (a refusal, a full pool, a failover),
        # the worker's answer is the same: the same request again, a second later.
        headers = {"Retry-After": STORE_RETRY_AFTER_S, **(headers or {})}
    return web.Response(
        status=code.status,
        body=problem_document(code, detail, **context),
        content_type="application/problem+json",
        headers=headers,
    )


# The codes for the statuses aiohttp answers with an HTTPException of its own (the
# router, the static files, the Expect handler). Any other status from one is a bug.
_CODE_OF_HTTP_STATUS = {
    code.status: code
    for code in (
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NO_ROUTE,
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.REQUEST_TIMEOUT,
        ErrorCode.PAYLOAD_TOO_LARGE,
        ErrorCode.URI_TOO_LONG,
        ErrorCode.EXPECTATION_FAILED,
        ErrorCode.HEADERS_TOO_LARGE,
    )
}


def http_error_problem(error: web.HTTPException) -> web.Response:
    """The problem document for an error aiohttp raised (`error.status` >= 400): the
    code of its status, or `internal_error` (500) for a status no code of ours has."""
    code = _CODE_OF_HTTP_STATUS.get(error.status)
    if code is None:
        return problem(ErrorCode.INTERNAL_ERROR, f"unexpected {error.status} {error.reason}")
    return problem(code, error.text or f"{error.status} {error.reason}")


def refusal_response(refusal: Refusal, headers: dict[str, str] | None = None) -> web.Response:
    """The problem document of a refusal, returned or raised; a lease held or a rate
    limit says when to try again."""
    extra = dict(headers or {})
    retry_after = refusal.context.get("retry_after_s")
    if refusal.code in (ErrorCode.LEASE_HELD, ErrorCode.RATE_LIMITED) and retry_after is not None:
        extra["Retry-After"] = str(retry_after)
    return problem(refusal.code, refusal.detail, extra or None, **refusal.context)
