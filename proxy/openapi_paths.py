"""The control API's paths: each operation, who may call it, what it takes and every
answer it can give."""

from __future__ import annotations

from typing import Any

from core.codes import ErrorCode
from core.leasing_advice import DEFAULT_MARGIN, DEFAULT_POLL_INTERVAL_S, DEFAULT_TARGETS
from core.lifecycle import probe_refusal
from core.records import EffectState
from policies.model import (
    MAX_RESOURCE_CHARS,
)
from proxy.openapi_parts import (
    ADMIN,
    BODY,
    EFFECT_ID,
    GUARDED,
    HOLDER,
    HOLDS_TOKEN,
    LIMIT,
    OPEN_OR_CLIENT,
    RESOURCE,
    RESOURCE_FILTER,
    SCOPED,
    STANDING,
    STATE,
    TEXT,
    TOKEN,
    body,
    comma_list,
    json_body,
    query,
    ref,
    responses,
)
from proxy.openapi_schemas import (
    REFUSAL_KIND,
    lease_advice_schema,
    recent_leases_schema,
    status_schema,
)
from proxy.operations import (
    GLOB_CHARS,
    MAX_GRID_POINTS,
    MAX_MARGIN,
    MAX_POLL_INTERVAL_S,
    MAX_TARGETS,
    OUTCOMES,
)

_LEASE_ADVICE_PARAMETERS = [
    query(
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
    query(
        "since",
        "only leases granted (and effects created) in the last this many seconds",
        {"type": "number", "exclusiveMinimum": 0},
    ),
    query(
        "margin",
        f"suggested TTL = margin x the longest turn (default {DEFAULT_MARGIN:g})",
        {"type": "number", "minimum": 1, "maximum": MAX_MARGIN},
    ),
    query(
        "poll_interval",
        "seconds between a successor's acquire attempts, for the detection delay "
        f"(default {DEFAULT_POLL_INTERVAL_S:g})",
        {"type": "number", "minimum": 0, "maximum": MAX_POLL_INTERVAL_S},
    ),
    query(
        "targets",
        "false-expiry rates (0-1), comma-separated "
        f"(default {','.join(f'{t:g}' for t in DEFAULT_TARGETS)})",
        comma_list(MAX_TARGETS),
    ),
    query(
        "leases",
        "lease lengths (seconds, 0 or more) of the false-expiry curve, comma-separated "
        "(default: a round grid up to the longest turn)",
        comma_list(MAX_GRID_POINTS),
    ),
]


def _probe_refusals() -> list[ErrorCode]:
    """What core.lifecycle refuses to probe, state by state: the rule's own codes."""
    return [
        refused.code for state in EffectState if (refused := probe_refusal("", state)) is not None
    ]


def lease_paths(ttl_s: dict[str, Any]) -> dict[str, Any]:
    """A worker's lease: acquire, read, renew, release (`ttl_s`: the policy's bounds)."""
    return {
        "/_fence/v1/leases": {
            "post": {
                "summary": "acquire a lease at a new epoch",
                "security": OPEN_OR_CLIENT,
                "requestBody": body(
                    {"resource": RESOURCE, "holder": HOLDER, "ttl_s": ttl_s},
                    required=["resource", "holder"],
                ),
                "responses": responses(
                    {"201": json_body(ref("Lease"), "granted, with the token")},
                    BODY,
                    SCOPED,
                    [ErrorCode.LEASE_HELD, ErrorCode.RESOURCE_BLOCKED, ErrorCode.RATE_LIMITED],
                ),
            },
            "get": {
                "summary": "a resource's current lease (never a token)",
                "security": OPEN_OR_CLIENT,
                "parameters": [{**RESOURCE_FILTER, "required": True}],
                "responses": responses({"200": json_body(ref("LeaseView"), "state")}, SCOPED),
            },
        },
        "/_fence/v1/leases/renew": {
            "post": {
                "summary": "extend a live lease",
                "parameters": [TOKEN],
                "requestBody": body({"ttl_s": ttl_s}),
                "responses": responses(
                    {"200": json_body(ref("Lease"), "renewed")}, BODY, HOLDS_TOKEN, STANDING
                ),
            }
        },
        "/_fence/v1/leases/release": {
            "post": {
                "summary": "end a lease now",
                "parameters": [TOKEN],
                "requestBody": body({}),
                "responses": responses(
                    {
                        "200": json_body(
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
                    BODY,
                    HOLDS_TOKEN,
                ),
            }
        },
    }


def admin_paths() -> dict[str, Any]:
    """An administrator's acts: revoke a lease, close the recovery window."""
    return {
        "/_fence/v1/admin/revoke": {
            "post": {
                "summary": "advance a resource's epoch now",
                "security": ADMIN,
                "requestBody": body(
                    {"resource": RESOURCE, "reason": TEXT}, required=["resource", "reason"]
                ),
                "responses": responses(
                    {
                        "200": json_body(
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
                    BODY,
                    SCOPED,
                ),
            }
        },
        "/_fence/v1/admin/close-recovery": {
            "post": {
                "summary": "close the recovery window opened after a failover lost "
                "history: keys the store does not know are new again",
                "security": ADMIN,
                "requestBody": body({}),
                "responses": responses(
                    {
                        "200": json_body(
                            {
                                "type": "object",
                                "required": ["closed"],
                                "properties": {"closed": {"type": "boolean"}},
                            },
                            "closed (false: none was open)",
                        )
                    },
                    BODY,
                    GUARDED,
                ),
            }
        },
        "/_fence/v1/admin/reload": {
            "post": {
                "summary": "read this replica's policy file again and serve it from the next "
                "request on; refused (409 reload_refused, nothing changed) when it is "
                "invalid, changes a key that needs a restart, or would strand an effect in "
                "doubt",
                "security": ADMIN,
                "requestBody": body({}),
                "responses": responses(
                    {
                        "200": json_body(
                            {
                                "type": "object",
                                "required": ["file", "digest", "previous_digest", "changed"],
                                "properties": {
                                    "file": {"type": "string"},
                                    "digest": {"type": "string"},
                                    "previous_digest": {"type": ["string", "null"]},
                                    "changed": {"type": "boolean"},
                                },
                            },
                            "reloaded: the sha256 of the file now served",
                        )
                    },
                    BODY,
                    GUARDED,
                    [ErrorCode.RELOAD_REFUSED],
                ),
            }
        },
    }


def effect_paths() -> dict[str, Any]:
    """Effect receipts and reconciliation: list, read, probe, resolve, what is in doubt."""
    return {
        "/_fence/v1/effects": {
            "get": {
                "summary": "effect receipts, newest first",
                "security": ADMIN,
                "parameters": [RESOURCE_FILTER, STATE, LIMIT],
                "responses": responses(
                    {
                        "200": json_body(
                            {
                                "type": "object",
                                "required": ["effects"],
                                "properties": {
                                    "effects": {"type": "array", "items": ref("Effect")}
                                },
                            },
                            "effects",
                        )
                    },
                    SCOPED,
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
                "security": [*ADMIN, {"holder": []}],
                "parameters": [EFFECT_ID],
                "responses": responses(
                    {
                        "200": json_body(
                            {
                                "allOf": [ref("Effect")],
                                "required": ["events"],
                                "properties": {
                                    "events": {"type": "array", "items": {"type": "object"}}
                                },
                            },
                            "effect",
                        )
                    },
                    SCOPED,
                    [ErrorCode.INVALID_TOKEN, ErrorCode.WRONG_RESOURCE, ErrorCode.NOT_FOUND],
                ),
            }
        },
        "/_fence/v1/effects/{effect_id}/probe": {
            "post": {
                "summary": "run the route's probe for an UNKNOWN effect now",
                "security": ADMIN,
                "parameters": [EFFECT_ID],
                "requestBody": body(
                    {
                        "operator": {**TEXT, "description": "who asked (optional)"},
                        "reason": {**TEXT, "description": "why (optional)"},
                    }
                ),
                "responses": responses(
                    {
                        "200": json_body(
                            {
                                "type": "object",
                                "required": ["effect_id", "conclusion", "detail", "effect"],
                                "properties": {
                                    "effect_id": {"type": "string"},
                                    "conclusion": {"type": "string"},
                                    "detail": {"type": "string"},
                                    "effect": {"oneOf": [ref("Effect"), {"type": "null"}]},
                                },
                            },
                            "what the probe concluded",
                        )
                    },
                    SCOPED,
                    [ErrorCode.NOT_FOUND, *_probe_refusals(), ErrorCode.NO_PROBE],
                ),
            }
        },
        "/_fence/v1/effects/{effect_id}/resolve": {
            "post": {
                "summary": "record an operator's decision on an effect in doubt",
                "security": ADMIN,
                "parameters": [EFFECT_ID],
                "requestBody": body(
                    {
                        "outcome": {"type": "string", "enum": list(OUTCOMES)},
                        "reason": TEXT,
                        "operator": {
                            **TEXT,
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
                "responses": responses(
                    {"200": json_body(ref("Effect"), "the settled effect")},
                    BODY,
                    SCOPED,
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
                "security": ADMIN,
                "responses": responses(
                    {"200": json_body(ref("InDoubt"), "what waits for reconciliation")},
                    SCOPED,
                ),
            }
        },
    }


def service_paths() -> dict[str, Any]:
    """The service itself: metrics, refusals, lease advice, status, health, this document."""
    return {
        "/_fence/metrics": {
            "get": {
                "summary": "Prometheus metrics (here unless `metrics_listen` moves them); "
                "with `auth:`, `read` on every resource (`*`): the counts span them all",
                "security": OPEN_OR_CLIENT,
                "responses": responses(
                    {
                        "200": {
                            "description": "Prometheus text format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                    SCOPED,
                ),
            }
        },
        "/_fence/v1/rejections": {
            "get": {
                "summary": "refused requests, newest first",
                "security": ADMIN,
                "parameters": [RESOURCE_FILTER, LIMIT],
                "responses": responses(
                    {
                        "200": json_body(
                            {
                                "type": "object",
                                "required": ["rejections"],
                                "properties": {
                                    "rejections": {
                                        "type": "array",
                                        "items": REFUSAL_KIND,
                                    }
                                },
                            },
                            "rejections",
                        )
                    },
                    SCOPED,
                ),
            }
        },
        "/_fence/v1/lease-advice": {
            "get": {
                "summary": "lease TTLs from the measured turns of recorded leases "
                "(what `fenceproxy lease-advice --json` prints)",
                "security": ADMIN,
                "parameters": _LEASE_ADVICE_PARAMETERS,
                "responses": responses(
                    {"200": json_body(lease_advice_schema(), "the advice")},
                    SCOPED,
                ),
            }
        },
        "/_fence/v1/status": {
            "get": {
                "summary": "this instance, the store and whether it answers, and every "
                "replica seen lately (what `fenceproxy status --json` prints); a store "
                "that does not answer is reported here, not refused",
                "security": ADMIN,
                "responses": responses(
                    {"200": json_body(status_schema(), "the service's status")},
                    GUARDED,
                ),
            }
        },
        "/_fence/v1/leases/recent": {
            "get": {
                "summary": "live leases, and those expired or ended in the last hour "
                "(came_back_at: the holder came back after expiry, a false expiry)",
                "security": ADMIN,
                "responses": responses(
                    {"200": json_body(recent_leases_schema(), "the leases")},
                    GUARDED,
                ),
            }
        },
        "/_fence/v1/openapi.json": {
            "get": {
                "summary": "this document",
                "responses": responses(
                    {
                        "200": json_body(
                            {"type": "object"}, "the OpenAPI document of the control API"
                        )
                    },
                ),
            }
        },
        "/_fence/healthz": {
            "get": {
                "responses": responses(
                    {"200": json_body({"type": "object"}, "alive")},
                )
            }
        },
        "/_fence/readyz": {
            "get": {
                "responses": responses(
                    {
                        "200": json_body(
                            {"type": "object"}, "the store took a write within the last second"
                        )
                    },
                )
            }
        },
    }
