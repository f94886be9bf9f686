"""The building blocks of the control API's OpenAPI document: the values a request
carries (each constrained by the constant the code checks it with), who may call,
and the problem responses an operation can answer, one per status."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.codes import ErrorCode
from core.records import EffectState
from policies.model import (
    HOLDER_CHARS,
    MAX_HOLDER_CHARS,
    MAX_RESOURCE_CHARS,
    RESOURCE_CHARS,
    LeaseBounds,
)
from proxy.operations import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    MAX_TEXT_CHARS,
)
from proxy.tokens import TOKEN_RE


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def anchored(python_re: str) -> str:
    """A Python `fullmatch`-style pattern as an ECMA-262 one (JSON Schema's dialect)."""
    return "^" + python_re.removesuffix(r"\Z") + "$"


RESOURCE = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_RESOURCE_CHARS,
    "pattern": f"^[{RESOURCE_CHARS}]+$",
}

HOLDER = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_HOLDER_CHARS,
    "pattern": f"^[{HOLDER_CHARS}]+$",
}

# required_text: non-blank once stripped, at most MAX_TEXT_CHARS after stripping.
TEXT = {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS, "pattern": r"\S"}

CLIENT_NAME = {
    "type": ["string", "null"],
    "description": "the `auth.clients[].name` (or `admin`) that took the lease; "
    "null without `auth:`",
}

TOKEN = {
    "name": "Fence-Token",
    "in": "header",
    "required": True,
    "description": "the token the acquire answer returned",
    "schema": {"type": "string", "pattern": anchored(TOKEN_RE.pattern)},
}

EFFECT_ID = {
    "name": "effect_id",
    "in": "path",
    "required": True,
    "description": "an effect receipt's `id`",
    "schema": {"type": "string", "minLength": 1},
}

RESOURCE_FILTER = {
    "name": "resource",
    "in": "query",
    "required": False,
    "description": "only this resource's rows",
    "schema": RESOURCE,
}

LIMIT = {
    "name": "limit",
    "in": "query",
    "required": False,
    "description": f"how many rows (default {DEFAULT_LIST_LIMIT})",
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT},
}

STATE = {
    "name": "state",
    "in": "query",
    "required": False,
    "description": "only effects in this state",
    "schema": {"type": "string", "enum": list(EffectState.__members__)},
}

# The admin token, or (with the policy's `auth:` block) a client's key with the right.
ADMIN: list[dict[str, list[str]]] = [{"admin": []}, {"client": []}]

# Open without `auth:`; with it, a client's key (or the admin token).
OPEN_OR_CLIENT: list[dict[str, list[str]]] = [{}, {"client": []}, {"admin": []}]

# What a call guarded by a client's rights adds; `forbidden_resource` where it names
# a resource (or an effect, which has one).
GUARDED = (ErrorCode.UNAUTHORIZED, ErrorCode.FORBIDDEN)

SCOPED = (*GUARDED, ErrorCode.FORBIDDEN_RESOURCE)

# A plain decimal number (the operation also takes an exponent, but never needs one).
_DECIMAL = r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"


def query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


def comma_list(most: int) -> dict[str, Any]:
    return {"type": "string", "pattern": f"^{_DECIMAL}(?:,{_DECIMAL}){{0,{most - 1}}}$"}


# What any control call can be answered with, whatever it asks: a duplicated
# authority header, oversized headers, a store that fails, a bug.
_ANY = (
    ErrorCode.INVALID_REQUEST,
    ErrorCode.HEADERS_TOO_LARGE,
    ErrorCode.INTERNAL_ERROR,
    ErrorCode.STORE_UNAVAILABLE,
)

# What reading a body adds.
BODY = (ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.REQUEST_TIMEOUT)

HOLDS_TOKEN = (
    ErrorCode.MISSING_TOKEN,
    ErrorCode.INVALID_TOKEN,
    ErrorCode.STALE_EPOCH,
    ErrorCode.LEASE_EXPIRED,
)

# A renew by a lease whose client the configuration in force no longer allows
# (core.fencing.check_standing).
STANDING = (ErrorCode.FORBIDDEN, ErrorCode.FORBIDDEN_RESOURCE)


def responses(success: dict[str, dict[str, Any]], *codes: Iterable[ErrorCode]) -> dict[str, Any]:
    """The success answers and one problem+json response per status the codes give."""
    by_status: dict[int, list[ErrorCode]] = {}
    for code in sorted({c for group in (_ANY, *codes) for c in group}, key=list(ErrorCode).index):
        by_status.setdefault(code.status, []).append(code)
    responses: dict[str, Any] = dict(success)
    for status in sorted(by_status):
        names = ", ".join(f"`{code.value}`" for code in by_status[status])
        responses[str(status)] = {
            "description": f"refused: {names}",
            "content": {"application/problem+json": {"schema": ref("Problem")}},
        }
    return responses


def body(
    properties: dict[str, Any], required: Iterable[str] = (), description: str | None = None
) -> dict[str, Any]:
    """A JSON object body; unknown fields are refused (`invalid_request`)."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    body: dict[str, Any] = {
        "required": bool(required),
        "content": {"application/json": {"schema": schema}},
    }
    if description is not None:
        body["description"] = description
    return body


def ttl(leases: LeaseBounds | None) -> dict[str, Any]:
    if leases is None:
        return {"type": "number", "exclusiveMinimum": 0, "description": "seconds"}
    return {
        "type": "number",
        "minimum": leases.min_ttl_s,
        "maximum": leases.max_ttl_s,
        "default": leases.default_ttl_s,
        "description": "seconds, within the policy's `leases` bounds; absent: the "
        "default (`null` is refused)",
    }
