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
from core.leasing_advice import DEFAULT_MARGIN, DEFAULT_POLL_INTERVAL_S, DEFAULT_TARGETS
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
    GLOB_CHARS,
    MAX_GRID_POINTS,
    MAX_LIST_LIMIT,
    MAX_MARGIN,
    MAX_POLL_INTERVAL_S,
    MAX_TARGETS,
    MAX_TEXT_CHARS,
    OUTCOMES,
)
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
_CLIENT_NAME = {
    "type": ["string", "null"],
    "description": "the `auth.clients[].name` (or `admin`) that took the lease; "
    "null without `auth:`",
}
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
# The admin token, or (with the policy's `auth:` block) a client's key with the right.
_ADMIN: list[dict[str, list[str]]] = [{"admin": []}, {"client": []}]
# Open without `auth:`; with it, a client's key (or the admin token).
_OPEN_OR_CLIENT: list[dict[str, list[str]]] = [{}, {"client": []}, {"admin": []}]
# What a call guarded by a client's rights adds; `forbidden_resource` where it names
# a resource (or an effect, which has one).
_GUARDED = (ErrorCode.UNAUTHORIZED, ErrorCode.FORBIDDEN)
_SCOPED = (*_GUARDED, ErrorCode.FORBIDDEN_RESOURCE)
# A plain decimal number (the operation also takes an exponent, but never needs one).
_DECIMAL = r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


def _comma_list(most: int) -> dict[str, Any]:
    return {"type": "string", "pattern": f"^{_DECIMAL}(?:,{_DECIMAL}){{0,{most - 1}}}$"}


_LEASE_ADVICE_PARAMETERS = [
    _query(
        "resource",
        "one group: the resources this glob (fnmatch) matches; default: one group per "
        "fenced route's resource template and one per other resource prefix",
        {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_RESOURCE_CHARS,
            "pattern": f"^[{GLOB_CHARS}]+$",
        },
    ),
    _query(
        "since",
        "only leases granted (and effects created) in the last this many seconds",
        {"type": "number", "exclusiveMinimum": 0},
    ),
    _query(
        "margin",
        f"suggested TTL = margin x the longest turn (default {DEFAULT_MARGIN:g})",
        {"type": "number", "minimum": 1, "maximum": MAX_MARGIN},
    ),
    _query(
        "poll_interval",
        "seconds between a successor's acquire attempts, for the detection delay "
        f"(default {DEFAULT_POLL_INTERVAL_S:g})",
        {"type": "number", "minimum": 0, "maximum": MAX_POLL_INTERVAL_S},
    ),
    _query(
        "targets",
        "false-expiry rates (0-1), comma-separated "
        f"(default {','.join(f'{t:g}' for t in DEFAULT_TARGETS)})",
        _comma_list(MAX_TARGETS),
    ),
    _query(
        "leases",
        "lease lengths (seconds, 0 or more) of the false-expiry curve, comma-separated "
        "(default: a round grid up to the longest turn)",
        _comma_list(MAX_GRID_POINTS),
    ),
]
_SECONDS_OR_NULL = {"type": ["number", "null"]}


def _lease_advice_schema() -> dict[str, Any]:
    group = {
        "type": "object",
        "required": [
            "resource",
            "turns",
            "turn_s",
            "shortest_lease_s",
            "false_expiry_curve",
            "suggested_ttl_s",
            "detection_delay_s",
            "expired",
            "ttls_in_use_s",
            "warnings",
        ],
        "properties": {
            "resource": {"type": "string"},
            "turns": {"type": "integer", "minimum": 0},
            "turn_s": {
                "type": ["object", "null"],
                "properties": {p: {"type": "number"} for p in ("p50", "p90", "p99", "max")},
            },
            "shortest_lease_s": {
                "type": ["object", "null"],
                "additionalProperties": _SECONDS_OR_NULL,
            },
            "false_expiry_curve": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["lease_s", "share"],
                    "properties": {
                        "lease_s": {"type": "number"},
                        "share": {"type": "number", "minimum": 0, "maximum": 1},
                    },
                },
            },
            "suggested_ttl_s": _SECONDS_OR_NULL,
            "detection_delay_s": {
                "type": ["object", "null"],
                "required": ["lease_s", "turn_s", "poll_interval_s", "expected"],
            },
            "expired": {
                "type": "object",
                "required": ["total", "holder_came_back", "never_came_back"],
                "properties": {
                    key: {"type": "integer", "minimum": 0}
                    for key in ("total", "holder_came_back", "never_came_back")
                },
            },
            "ttls_in_use_s": {"type": ["object", "null"]},
            "warnings": {"type": "array", "items": {"type": "string"}},
        },
    }
    route = {
        "type": "object",
        "required": ["route", "requests", "upstream_s", "timeout_s"],
        "properties": {
            "route": {"type": "string"},
            "requests": {"type": "integer", "minimum": 0},
            "upstream_s": {"type": ["object", "null"]},
            "timeout_s": {"type": "number"},
            "warnings": {"type": "array", "items": {"type": "string"}},
        },
    }
    return {
        "type": "object",
        "required": ["groups", "routes"],
        "properties": {
            "groups": {"type": "array", "items": group},
            "routes": {"type": "array", "items": route},
            "problems": {"type": "array", "items": {"type": "string"}},
        },
    }


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
# A renew by a lease whose client the configuration in force no longer allows
# (core.fencing.check_standing).
_STANDING = (ErrorCode.FORBIDDEN, ErrorCode.FORBIDDEN_RESOURCE)


_NUMBER_OR_NULL = {"type": ["number", "null"]}


def _status_schema() -> dict[str, Any]:
    replica = {
        "type": "object",
        "required": ["instance_id", "version", "started_at", "seen_at"],
        "properties": {
            "instance_id": {"type": "string"},
            "version": {"type": "string"},
            "started_at": {"type": "number"},
            "seen_at": {"type": "number"},
            "last_sweep_at": _NUMBER_OR_NULL,
            "last_probe_at": _NUMBER_OR_NULL,
        },
    }
    return {
        "type": "object",
        "required": ["instance", "store", "replicas_window_s", "replicas"],
        "properties": {
            "instance": {
                "type": ["object", "null"],
                "required": ["instance_id", "version", "uptime_s"],
                "properties": {
                    "instance_id": {"type": "string"},
                    "version": {"type": "string"},
                    "uptime_s": {"type": "number"},
                    "last_sweep_age_s": _NUMBER_OR_NULL,
                    "last_probe_age_s": _NUMBER_OR_NULL,
                },
            },
            "store": {
                "type": "object",
                "required": ["backend", "answers", "problem", "now"],
                "properties": {
                    "backend": {"type": "string"},
                    "answers": {"type": "boolean"},
                    "problem": {"type": ["string", "null"]},
                    "now": _NUMBER_OR_NULL,
                },
            },
            "replicas_window_s": {"type": "number"},
            "replicas": {"type": "array", "items": replica},
        },
    }


def _recent_leases_schema() -> dict[str, Any]:
    lease = {
        "type": "object",
        "required": ["resource", "epoch", "holder", "expires_at", "came_back_at"],
        "properties": {
            "resource": {"type": "string"},
            "epoch": {"type": "integer"},
            "holder": {"type": "string"},
            "client": {"type": ["string", "null"]},
            "granted_at": {"type": "number"},
            "expires_at": {"type": "number"},
            "ended_at": _NUMBER_OR_NULL,
            "end_reason": {"type": ["string", "null"]},
            "came_back_at": _NUMBER_OR_NULL,
            "ttl_left_s": {"type": "number"},
        },
    }
    return {
        "type": "object",
        "required": ["now", "window_s", "live", "recently_ended"],
        "properties": {
            "now": {"type": "number"},
            "window_s": {"type": "number"},
            "live": {"type": "array", "items": lease},
            "recently_ended": {"type": "array", "items": lease},
        },
    }


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


def _body(
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


def _ttl(leases: LeaseBounds | None) -> dict[str, Any]:
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


# Members some problems carry beyond RFC 9457's, for a client to act on.
_PROBLEM_EXTENSIONS: dict[ErrorCode, dict[str, Any]] = {
    ErrorCode.LEASE_TOO_SHORT: {
        "needed_s": {
            "type": "number",
            "description": "seconds the lease must have left for this route (its upstream"
            " timeout): renew to at least this, then send again",
        },
        "remaining_s": {"type": "number", "description": "seconds the lease had left"},
    },
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
                    **_PROBLEM_EXTENSIONS.get(code, {}),
                },
            }
            for code in ErrorCode
        ],
    }


# One kind of refusal on the record (store/refusals.py): `count` requests from
# `first_seen` to `at`; method, path and fingerprint are the latest one's. A name the
# store did not know when it counted (a resource never leased, a holder of nothing) is null.
_NULLABLE_TEXT: dict[str, Any] = {"type": ["string", "null"]}
_REFUSAL_KIND: dict[str, Any] = {
    "type": "object",
    "required": ["at", "first_seen", "count", "code", "method", "path"],
    "properties": {
        "at": {"type": "number"},
        "first_seen": {"type": "number"},
        "count": {"type": "integer", "minimum": 1},
        "code": {"type": "string"},
        "method": {"type": "string"},
        "path": {"type": "string"},
        "route": _NULLABLE_TEXT,
        "resource": _NULLABLE_TEXT,
        "holder": _NULLABLE_TEXT,
        "epoch": {"type": ["integer", "null"]},
        "client": _NULLABLE_TEXT,
        "fingerprint": _NULLABLE_TEXT,
    },
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
            "client": _CLIENT_NAME,
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
                "admin": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an admin token (`admin_token_env`, `admin_token_next_env`)",
                },
                "client": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a key of the policy's `auth.clients`; what it may call "
                    "is its `may`, on the resources its `resources` globs match",
                },
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
                        "next_epoch": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "the epoch the next acquire or revoke gets: "
                            "epoch + 1, or above the floor `store fence-restore` set",
                        },
                        "holder": {"type": ["string", "null"]},
                        "client": _CLIENT_NAME,
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
                    "security": _OPEN_OR_CLIENT,
                    "requestBody": _body(
                        {"resource": RESOURCE, "holder": HOLDER, "ttl_s": ttl_s},
                        required=["resource", "holder"],
                    ),
                    "responses": _responses(
                        {"201": _json(_ref("Lease"), "granted, with the token")},
                        _BODY,
                        _SCOPED,
                        [ErrorCode.LEASE_HELD, ErrorCode.RESOURCE_BLOCKED, ErrorCode.RATE_LIMITED],
                    ),
                },
                "get": {
                    "summary": "a resource's current lease (never a token)",
                    "security": _OPEN_OR_CLIENT,
                    "parameters": [{**_RESOURCE_FILTER, "required": True}],
                    "responses": _responses({"200": _json(_ref("LeaseView"), "state")}, _SCOPED),
                },
            },
            "/_fence/v1/leases/renew": {
                "post": {
                    "summary": "extend a live lease",
                    "parameters": [_TOKEN],
                    "requestBody": _body({"ttl_s": ttl_s}),
                    "responses": _responses(
                        {"200": _json(_ref("Lease"), "renewed")}, _BODY, _HOLDS_TOKEN, _STANDING
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
                        _SCOPED,
                    ),
                }
            },
            "/_fence/v1/admin/close-recovery": {
                "post": {
                    "summary": "close the recovery window opened after a failover lost "
                    "history: keys the store does not know are new again",
                    "security": _ADMIN,
                    "requestBody": _body({}),
                    "responses": _responses(
                        {
                            "200": _json(
                                {
                                    "type": "object",
                                    "required": ["closed"],
                                    "properties": {"closed": {"type": "boolean"}},
                                },
                                "closed (false: none was open)",
                            )
                        },
                        _BODY,
                        _GUARDED,
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
                        _SCOPED,
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
                        _SCOPED,
                        [ErrorCode.INVALID_TOKEN, ErrorCode.WRONG_RESOURCE, ErrorCode.NOT_FOUND],
                    ),
                }
            },
            "/_fence/v1/effects/{effect_id}/probe": {
                "post": {
                    "summary": "run the route's probe for an UNKNOWN effect now",
                    "security": _ADMIN,
                    "parameters": [_EFFECT_ID],
                    "requestBody": _body(
                        {
                            "operator": {**_TEXT, "description": "who asked (optional)"},
                            "reason": {**_TEXT, "description": "why (optional)"},
                        }
                    ),
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
                        _SCOPED,
                        [
                            ErrorCode.NOT_FOUND,
                            ErrorCode.EFFECT_IN_FLIGHT,
                            ErrorCode.EFFECT_SETTLED,
                            ErrorCode.CONFLICTING_EVIDENCE,
                            ErrorCode.NO_PROBE,
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
                            "operator": {
                                **_TEXT,
                                "description": "who decided: required with the admin token; "
                                "a client's decision is recorded as its name (then `/operator`)",
                            },
                        },
                        required=["outcome", "reason"],
                        description="`operator` is required with the admin token (shared by "
                        "whoever holds it, so the caller names who decides; `400 "
                        "invalid_request` without); with a client's key it is optional, the "
                        "decision being recorded as the client's name (then `/operator`)",
                    ),
                    "responses": _responses(
                        {"200": _json(_ref("Effect"), "the settled effect")},
                        _BODY,
                        _SCOPED,
                        [
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
                        _SCOPED,
                    ),
                }
            },
            "/_fence/metrics": {
                "get": {
                    "summary": "Prometheus metrics (here unless `metrics_listen` moves them); "
                    "with `auth:`, `read` on every resource (`*`): the counts span them all",
                    "security": _OPEN_OR_CLIENT,
                    "responses": _responses(
                        {
                            "200": {
                                "description": "Prometheus text format",
                                "content": {"text/plain": {"schema": {"type": "string"}}},
                            }
                        },
                        _SCOPED,
                    ),
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
                                            "items": _REFUSAL_KIND,
                                        }
                                    },
                                },
                                "rejections",
                            )
                        },
                        _SCOPED,
                    ),
                }
            },
            "/_fence/v1/lease-advice": {
                "get": {
                    "summary": "lease TTLs from the measured turns of recorded leases "
                    "(what `fenceproxy lease-advice --json` prints)",
                    "security": _ADMIN,
                    "parameters": _LEASE_ADVICE_PARAMETERS,
                    "responses": _responses(
                        {"200": _json(_lease_advice_schema(), "the advice")},
                        _SCOPED,
                    ),
                }
            },
            "/_fence/v1/status": {
                "get": {
                    "summary": "this instance, the store and whether it answers, and every "
                    "replica seen lately (what `fenceproxy status --json` prints); a store "
                    "that does not answer is reported here, not refused",
                    "security": _ADMIN,
                    "responses": _responses(
                        {"200": _json(_status_schema(), "the service's status")},
                        _GUARDED,
                    ),
                }
            },
            "/_fence/v1/leases/recent": {
                "get": {
                    "summary": "live leases, and those expired or ended in the last hour "
                    "(came_back_at: the holder came back after expiry, a false expiry)",
                    "security": _ADMIN,
                    "responses": _responses(
                        {"200": _json(_recent_leases_schema(), "the leases")},
                        _GUARDED,
                    ),
                }
            },
            "/_fence/v1/openapi.json": {
                "get": {
                    "summary": "this document",
                    "responses": _responses(
                        {
                            "200": _json(
                                {"type": "object"}, "the OpenAPI document of the control API"
                            )
                        },
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
