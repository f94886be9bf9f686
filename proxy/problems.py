"""RFC 9457 problem responses with the contract's stable codes."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from core.records import Refusal

STATUS_BY_CODE = {
    "invalid_request": 400,
    "missing_idempotency_key": 400,
    "missing_token": 401,
    "unauthorized": 401,
    "invalid_token": 403,
    "wrong_resource": 403,
    "no_route": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "stale_epoch": 409,
    "lease_expired": 409,
    "lease_held": 409,
    "effect_in_flight": 409,
    "request_in_progress": 409,
    "lease_too_short": 409,
    "effect_settled": 409,
    "payload_too_large": 413,
    "headers_too_large": 431,
    "idempotency_key_reused": 422,
    "resource_blocked": 423,
    "internal_error": 500,
    "upstream_unreachable": 502,
    "store_unavailable": 503,
    "outcome_unknown": 504,
}

PROBLEM_TYPE_BASE = "https://fenceproxy.dev/problems/"


def problem(
    code: str, detail: str, headers: dict[str, str] | None = None, **context: Any
) -> web.Response:
    status = STATUS_BY_CODE[code]
    body = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": code.replace("_", " ").capitalize(),
        "status": status,
        "detail": detail,
        "code": code,
        **{key: value for key, value in context.items() if value is not None},
    }
    response = web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/problem+json",
        headers=headers,
    )
    return response


def refusal_response(refusal: Refusal, headers: dict[str, str] | None = None) -> web.Response:
    extra = dict(headers or {})
    retry_after = refusal.context.get("retry_after_s")
    if refusal.code == "lease_held" and retry_after is not None:
        extra["Retry-After"] = str(retry_after)
    return problem(refusal.code, refusal.detail, extra or None, **refusal.context)


class ProblemError(Exception):
    """Raised by request parsing helpers; the middleware turns it into a response."""

    def __init__(self, code: str, detail: str, **context: Any) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.context = context

    def response(self) -> web.Response:
        return problem(self.code, self.detail, **self.context)
