"""The schemas of the control API's answers: leases, effects, what is in doubt, the
problem+json of every code (from the codes table), lease advice, status."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.codes import ErrorCode
from core.lifecycle import AWAITING_RECONCILIATION, BLOCKING
from core.records import EffectState
from proxy.openapi_parts import CLIENT_NAME, HOLDER, RESOURCE, anchored, ref
from proxy.tokens import TOKEN_RE

_SECONDS_OR_NULL = {"type": ["number", "null"]}


def lease_advice_schema() -> dict[str, Any]:
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
            "ended": {
                "type": "object",
                "required": ["total"],
                "additionalProperties": {"type": "integer", "minimum": 0},
            },
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
        "required": ["groups", "leases_ended", "routes"],
        "properties": {
            "groups": {"type": "array", "items": group},
            "leases_ended": {"type": "integer", "minimum": 0},
            "routes": {"type": "array", "items": route},
            "problems": {"type": "array", "items": {"type": "string"}},
        },
    }


_NUMBER_OR_NULL = {"type": ["number", "null"]}


def status_schema() -> dict[str, Any]:
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
            # The sha256 of the policy file it serves (null: it does not say).
            "policy_digest": {"type": ["string", "null"]},
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
                    "policy_digest": {"type": ["string", "null"]},
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
            # The distinct policy files the replicas serve: more than one is a mismatch.
            "policy_digests": {"type": "array", "items": {"type": "string"}},
        },
    }


def recent_leases_schema() -> dict[str, Any]:
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
    ErrorCode.STORE_UNAVAILABLE: {
        "settled": {
            "type": "boolean",
            "description": "only when the store's answer to the admission was lost (nothing"
            " was sent): true once the admission's record, if it was written, is settled"
            " NOT_SENT (the operation can be retried); false while the proxy is still"
            " settling it (`effect_id` names it)",
        },
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

REFUSAL_KIND: dict[str, Any] = {
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


def _named(states: Iterable[EffectState], joiner: str) -> str:
    """States as core.lifecycle's sets hold them, in the order EffectState lists them."""
    return joiner.join(state.value for state in EffectState if state in states)


def component_schemas() -> dict[str, Any]:
    """The schemas the paths refer to (`ref`)."""
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
                "pattern": anchored(TOKEN_RE.pattern),
                "description": "only in the acquire answer",
            },
            "client": CLIENT_NAME,
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
                "client": CLIENT_NAME,
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
                    "description": f"resources with an {_named(AWAITING_RECONCILIATION, ' or ')} "
                    "effect",
                },
                "in_doubt": {
                    "type": "array",
                    "description": f"effect receipts ({_named(BLOCKING, ', ')}), each with "
                    "`age_s`, its `last_event` and `has_probe` (whether its route has a probe)",
                    "items": ref("Effect"),
                },
            },
        },
        "Problem": _problem_schema(),
    }
