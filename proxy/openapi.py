"""The control API's OpenAPI document, served at /_fence/v1/openapi.json.

Every constraint here is built from the constant the code enforces it with
(policies.model, proxy.operations, proxy.tokens, the running policy's `leases`),
so the document and the checks cannot drift apart; each operation lists the
problem statuses it can answer, one response per status.
"""

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
from proxy.operations import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, MAX_TEXT_CHARS, OUTCOMES
from proxy.tokens import TOKEN_RE


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _anchored(python_re: str) -> str:
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
_TEXT = {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS, "pattern": r"\S"}
_TOKEN = {
    "name": "Fence-Token",
    "in": "header",
    "required": True,
    "description": "the token the acquire answer returned",
    "schema": {"type": "string", "pattern": _anchored(TOKEN_RE.pattern)},
}
_EFFECT_ID = {
    "name": "effect_id",
    "in": "path",
    "required": True,
    "description": "an effect receipt's `id`",
    "schema": {"type": "string", "minLength": 1},
}
_RESOURCE_FILTER = {
    "name": "resource",
    "in": "query",
    "required": False,
    "description": "only this resource's rows",
    "schema": RESOURCE,
}
_LIMIT = {
    "name": "limit",
    "in": "query",
    "required": False,
    "description": f"how many rows (default {DEFAULT_LIST_LIMIT})",
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT},
}
_STATE = {
    "name": "state",
    "in": "query",
    "required": False,
    "description": "only effects in this state",
    "schema": {"type": "string", "enum": list(EffectState.__members__)},
}
_ADMIN: list[dict[str, list[str]]] = [{"admin": []}]

# What any control call can be answered with, whatever it asks: a duplicated
# authority header, oversized headers, a store that fails, a bug.
_ANY = (
    ErrorCode.INVALID_REQUEST,
    ErrorCode.HEADERS_TOO_LARGE,
    ErrorCode.INTERNAL_ERROR,
    ErrorCode.STORE_UNAVAILABLE,
)
# What reading a body adds.
_BODY = (ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.REQUEST_TIMEOUT)
_HOLDS_TOKEN = (
    ErrorCode.MISSING_TOKEN,
    ErrorCode.INVALID_TOKEN,
    ErrorCode.STALE_EPOCH,
    ErrorCode.LEASE_EXPIRED,
)


def _responses(success: dict[str, dict[str, Any]], *codes: Iterable[ErrorCode]) -> dict[str, Any]:
    """The success answers and one problem+json response per status the codes give."""
    by_status: dict[int, list[ErrorCode]] = {}
    for code in sorted({c for group in (_ANY, *codes) for c in group}, key=list(ErrorCode).index):
        by_status.setdefault(code.status, []).append(code)
    responses: dict[str, Any] = dict(success)
    for status in sorted(by_status):
        names = ", ".join(f"`{code.value}`" for code in by_status[status])
        responses[str(status)] = {
            "description": f"refused: {names}",
            "content": {"application/problem+json": {"schema": _ref("Problem")}},
        }
    return responses


def _body(properties: dict[str, Any], required: Iterable[str] = ()) -> dict[str, Any]:
    """A JSON object body; unknown fields are refused (`invalid_request`)."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return {
        "required": bool(required),
        "content": {"application/json": {"schema": schema}},
    }


def _ttl(leases: LeaseBounds | None) -> dict[str, Any]:
    if leases is None:
        return {"type": "number", "exclusiveMinimum": 0, "description": "seconds"}
    return {
        "type": "number",
        "minimum": leases.min_ttl_s,
        "maximum": leases.max_ttl_s,
        "default": leases.default_ttl_s,
        "description": "seconds, within the policy's `leases` bounds",
    }


def _problem_schema() -> dict[str, Any]:
    """RFC 9457 problem+json; one `oneOf` branch per code pins its status and title."""
    return {
        "type": "object",
        "required": ["type", "title", "status", "detail", "code"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "code": {"type": "string", "enum": [code.value for code in ErrorCode]},
        },
        "oneOf": [
            {
                "title": code.value,
                "description": code.when,
                "properties": {
                    "code": {"const": code.value},
                    "status": {"const": code.status},
                    "title": {"const": code.problem_title},
                },
            }
            for code in ErrorCode
        ],
    }


def document(leases: LeaseBounds | None = None) -> dict[str, Any]:
    """The document; with the running policy's `leases`, `ttl_s` carries its bounds."""
    ttl_s = _ttl(leases)
    lease = {
        "type": "object",
        "required": ["resource", "holder", "epoch", "expires_at", "ttl_s"],
        "properties": {
            "resource": RESOURCE,
            "holder": HOLDER,
            "epoch": {"type": "integer", "minimum": 1},
            "expires_at": {"type": "number", "description": "Unix time, seconds"},
            "ttl_s": {"type": "number"},
            "token": {
                "type": "string",
                "pattern": _anchored(TOKEN_RE.pattern),
                "description": "only in the acquire answer",
            },
        },
    }
    effect = {
        "type": "object",
        "required": ["id", "resource", "state"],
        "properties": {
            "id": {"type": "string"},
            "resource": RESOURCE,
            "state": {"type": "string", "enum": [state.value for state in EffectState]},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "fenceproxy control API", "version": "1"},
        "components": {
            "securitySchemes": {
                "admin": {"type": "http", "scheme": "bearer"},
                "holder": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Fence-Token",
                    "description": "a lease's token: reads the effects of its resource",
                },
            },
            "schemas": {
                "Lease": lease,
                "LeaseView": {
                    "type": "object",
                    "required": ["resource", "epoch", "holder", "expires_at", "live"],
                    "properties": {
                        "resource": RESOURCE,
                        "epoch": {"type": "integer", "minimum": 0},
                        "holder": {"type": ["string", "null"]},
                        "expires_at": {"type": ["number", "null"]},
                        "live": {"type": "boolean"},
                        "blocked": {"type": "boolean"},
                        "in_doubt": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "Effect": effect,
                "InDoubt": {
                    "type": "object",
                    "required": ["blocked_resources", "in_doubt"],
                    "properties": {
                        "blocked_resources": {
                            "type": "array",
                            "items": RESOURCE,
                            "description": "resources with an UNKNOWN or CONFLICTING effect",
                        },
                        "in_doubt": {
                            "type": "array",
                            "description": "effect receipts (DISPATCHING, UNKNOWN, "
                            "CONFLICTING), each with `age_s` and its `last_event`",
                            "items": _ref("Effect"),
                        },
                    },
                },
                "Problem": _problem_schema(),
            },
        },
        "paths": {
            "/_fence/v1/leases": {
                "post": {
                    "summary": "acquire a lease at a new epoch",
                    "requestBody": _body(
                        {"resource": RESOURCE, "holder": HOLDER, "ttl_s": ttl_s},
                        required=["resource", "holder"],
                    ),
                    "responses": _responses(
                        {"201": _json(_ref("Lease"), "granted, with the token")},
                        _BODY,
                        [ErrorCode.LEASE_HELD, ErrorCode.RESOURCE_BLOCKED],
                    ),
                },
                "get": {
                    "summary": "a resource's current lease (never a token)",
                    "parameters": [{**_RESOURCE_FILTER, "required": True}],
                    "responses": _responses({"200": _json(_ref("LeaseView"), "state")}),
                },
            },
            "/_fence/v1/leases/renew": {
                "post": {
                    "summary": "extend a live lease",
                    "parameters": [_TOKEN],
                    "requestBody": _body({"ttl_s": ttl_s}),
                    "responses": _responses(
                        {"200": _json(_ref("Lease"), "renewed")}, _BODY, _HOLDS_TOKEN
                    ),
                }
            },
            "/_fence/v1/leases/release": {
                "post": {
                    "summary": "end a lease now",
                    "parameters": [_TOKEN],
                    "requestBody": _body({}),
                    "responses": _responses(
                        {
                            "200": _json(
                                {
                                    "type": "object",
                                    "required": ["resource", "epoch", "released"],
                                    "properties": {
                                        "resource": RESOURCE,
                                        "epoch": {"type": "integer", "minimum": 1},
                                        "released": {"const": True},
                                    },
                                },
                                "released",
                            )
                        },
                        _BODY,
                        _HOLDS_TOKEN,
                    ),
                }
            },
            "/_fence/v1/admin/revoke": {
                "post": {
                    "summary": "advance a resource's epoch now",
                    "security": _ADMIN,
                    "requestBody": _body(
                        {"resource": RESOURCE, "reason": _TEXT}, required=["resource", "reason"]
                    ),
                    "responses": _responses(
                        {
                            "200": _json(
                                {
                                    "type": "object",
                                    "required": ["resource", "revoked_epoch", "epoch", "reason"],
                                    "properties": {
                                        "resource": RESOURCE,
                                        "revoked_epoch": {"type": "integer", "minimum": 0},
                                        "epoch": {"type": "integer", "minimum": 1},
                                        "reason": {"type": "string"},
                                    },
                                },
                                "revoked",
                            )
                        },
                        _BODY,
                        [ErrorCode.UNAUTHORIZED],
                    ),
                }
            },
            "/_fence/v1/effects": {
                "get": {
                    "summary": "effect receipts, newest first",
                    "security": _ADMIN,
                    "parameters": [_RESOURCE_FILTER, _STATE, _LIMIT],
                    "responses": _responses(
                        {
                            "200": _json(
                                {
                                    "type": "object",
                                    "required": ["effects"],
                                    "properties": {
                                        "effects": {"type": "array", "items": _ref("Effect")}
                                    },
                                },
                                "effects",
                            )
                        },
                        [ErrorCode.UNAUTHORIZED],
                    ),
                }
            },
            "/_fence/v1/effects/{effect_id}": {
                "get": {
                    "summary": "one effect receipt and its history",
                    "description": "With the admin token, any effect. Without it, a "
                    "`Fence-Token` of any lease this proxy issued on the effect's resource "
                    "(current or ended, while the store keeps it) reads that effect, so a "
                    "worker can wait for the outcome of its own request.",
                    "security": [*_ADMIN, {"holder": []}],
                    "parameters": [_EFFECT_ID],
                    "responses": _responses(
                        {
                            "200": _json(
                                {
                                    "allOf": [_ref("Effect")],
                                    "required": ["events"],
                                    "properties": {
                                        "events": {"type": "array", "items": {"type": "object"}}
                                    },
                                },
                                "effect",
                            )
                        },
                        [
                            ErrorCode.UNAUTHORIZED,
                            ErrorCode.INVALID_TOKEN,
                            ErrorCode.WRONG_RESOURCE,
                            ErrorCode.NOT_FOUND,
                        ],
                    ),
                }
            },
            "/_fence/v1/effects/{effect_id}/probe": {
                "post": {
                    "summary": "run the route's probe for an UNKNOWN effect now",
                    "security": _ADMIN,
                    "parameters": [_EFFECT_ID],
                    "responses": _responses(
                        {
                            "200": _json(
                                {
                                    "type": "object",
                                    "required": ["effect_id", "conclusion", "detail", "effect"],
                                    "properties": {
                                        "effect_id": {"type": "string"},
                                        "conclusion": {"type": "string"},
                                        "detail": {"type": "string"},
                                        "effect": {"oneOf": [_ref("Effect"), {"type": "null"}]},
                                    },
                                },
                                "what the probe concluded",
                            )
                        },
                        [
                            ErrorCode.UNAUTHORIZED,
                            ErrorCode.NOT_FOUND,
                            ErrorCode.EFFECT_IN_FLIGHT,
                            ErrorCode.EFFECT_SETTLED,
                            ErrorCode.CONFLICTING_EVIDENCE,
                        ],
                    ),
                }
            },
            "/_fence/v1/effects/{effect_id}/resolve": {
                "post": {
                    "summary": "record an operator's decision on an effect in doubt",
                    "security": _ADMIN,
                    "parameters": [_EFFECT_ID],
                    "requestBody": _body(
                        {
                            "outcome": {"type": "string", "enum": list(OUTCOMES)},
                            "reason": _TEXT,
                            "operator": _TEXT,
                        },
                        required=["outcome", "reason", "operator"],
                    ),
                    "responses": _responses(
                        {"200": _json(_ref("Effect"), "the settled effect")},
                        _BODY,
                        [
                            ErrorCode.UNAUTHORIZED,
                            ErrorCode.NOT_FOUND,
                            ErrorCode.EFFECT_IN_FLIGHT,
                            ErrorCode.EFFECT_SETTLED,
                        ],
                    ),
                }
            },
            "/_fence/v1/reconcile": {
                "get": {
                    "summary": "blocked resources and effects in doubt, oldest first "
                    "(what `fenceproxy reconcile list --json` prints)",
                    "security": _ADMIN,
                    "responses": _responses(
                        {"200": _json(_ref("InDoubt"), "what waits for reconciliation")},
                        [ErrorCode.UNAUTHORIZED],
                    ),
                }
            },
            "/_fence/metrics": {
                "get": {
                    "responses": _responses(
                        {
                            "200": {
                                "description": "Prometheus text format",
                                "content": {"text/plain": {"schema": {"type": "string"}}},
                            }
                        }
                    )
                }
            },
            "/_fence/v1/rejections": {
                "get": {
                    "summary": "refused requests, newest first",
                    "security": _ADMIN,
                    "parameters": [_RESOURCE_FILTER, _LIMIT],
                    "responses": _responses(
                        {
                            "200": _json(
                                {
                                    "type": "object",
                                    "required": ["rejections"],
                                    "properties": {
                                        "rejections": {
                                            "type": "array",
                                            "items": {"type": "object"},
                                        }
                                    },
                                },
                                "rejections",
                            )
                        },
                        [ErrorCode.UNAUTHORIZED],
                    ),
                }
            },
            "/_fence/healthz": {
                "get": {
                    "responses": _responses(
                        {"200": _json({"type": "object"}, "alive")},
                    )
                }
            },
            "/_fence/readyz": {
                "get": {
                    "responses": _responses(
                        {
                            "200": _json(
                                {"type": "object"}, "the store took a write within the last second"
                            )
                        },
                    )
                }
            },
        },
    }
