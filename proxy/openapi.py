"""The control API's OpenAPI document, served at /_fence/v1/openapi.json."""

from __future__ import annotations

from typing import Any

from core.codes import ErrorCode


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_PROBLEM = {
    "description": "refused; see `code`",
    "content": {"application/problem+json": {"schema": _ref("Problem")}},
}
_TOKEN = {"name": "Fence-Token", "in": "header", "required": True, "schema": {"type": "string"}}
_ADMIN: list[dict[str, list[str]]] = [{"admin": []}]


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


def document() -> dict[str, Any]:
    lease = {
        "type": "object",
        "properties": {
            "resource": {"type": "string"},
            "holder": {"type": "string"},
            "epoch": {"type": "integer", "minimum": 1},
            "expires_at": {"type": "number", "description": "Unix time, seconds"},
            "ttl_s": {"type": "number"},
            "token": {"type": "string", "description": "only in the acquire answer"},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "fenceproxy control API", "version": "1"},
        "components": {
            "securitySchemes": {"admin": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Lease": lease,
                "LeaseView": {
                    "type": "object",
                    "properties": {
                        "resource": {"type": "string"},
                        "epoch": {"type": "integer", "minimum": 0},
                        "holder": {"type": ["string", "null"]},
                        "expires_at": {"type": ["number", "null"]},
                        "live": {"type": "boolean"},
                        "blocked": {"type": "boolean"},
                        "in_doubt": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "InDoubt": {
                    "type": "object",
                    "properties": {
                        "blocked_resources": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "resources with an UNKNOWN or CONFLICTING effect",
                        },
                        "in_doubt": {
                            "type": "array",
                            "description": "effect receipts (DISPATCHING, UNKNOWN, "
                            "CONFLICTING), each with `age_s` and its `last_event`",
                            "items": {"type": "object"},
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
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["resource", "holder"],
                                    "properties": {
                                        "resource": {"type": "string"},
                                        "holder": {"type": "string"},
                                        "ttl_s": {"type": "number"},
                                    },
                                }
                            }
                        }
                    },
                    "responses": {"201": _json(_ref("Lease"), "granted"), "default": _PROBLEM},
                },
                "get": {
                    "summary": "a resource's current lease (never a token)",
                    "parameters": [
                        {
                            "name": "resource",
                            "in": "query",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {"200": _json(_ref("LeaseView"), "state"), "default": _PROBLEM},
                },
            },
            "/_fence/v1/leases/renew": {
                "post": {
                    "summary": "extend a live lease",
                    "parameters": [_TOKEN],
                    "responses": {"200": _json(_ref("Lease"), "renewed"), "default": _PROBLEM},
                }
            },
            "/_fence/v1/leases/release": {
                "post": {
                    "summary": "end a lease now",
                    "parameters": [_TOKEN],
                    "responses": {
                        "200": _json({"type": "object"}, "released"),
                        "default": _PROBLEM,
                    },
                }
            },
            "/_fence/v1/admin/revoke": {
                "post": {
                    "summary": "advance a resource's epoch now",
                    "security": _ADMIN,
                    "responses": {"200": _json({"type": "object"}, "revoked"), "default": _PROBLEM},
                }
            },
            "/_fence/v1/effects": {
                "get": {
                    "summary": "effect receipts, newest first",
                    "security": _ADMIN,
                    "responses": {"200": _json({"type": "object"}, "effects"), "default": _PROBLEM},
                }
            },
            "/_fence/v1/effects/{effect_id}": {
                "get": {
                    "summary": "one effect receipt",
                    "security": _ADMIN,
                    "responses": {"200": _json({"type": "object"}, "effect"), "default": _PROBLEM},
                }
            },
            "/_fence/v1/effects/{effect_id}/probe": {
                "post": {
                    "summary": "run the route's probe for an UNKNOWN effect now",
                    "security": _ADMIN,
                    "responses": {
                        "200": _json({"type": "object"}, "what the probe concluded"),
                        "default": _PROBLEM,
                    },
                }
            },
            "/_fence/v1/effects/{effect_id}/resolve": {
                "post": {
                    "summary": "record an operator's decision on an effect in doubt",
                    "security": _ADMIN,
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["outcome", "reason", "operator"],
                                    "properties": {
                                        "outcome": {
                                            "type": "string",
                                            "enum": ["committed", "not_committed"],
                                        },
                                        "reason": {"type": "string"},
                                        "operator": {"type": "string"},
                                    },
                                }
                            }
                        }
                    },
                    "responses": {
                        "200": _json({"type": "object"}, "the settled effect"),
                        "default": _PROBLEM,
                    },
                }
            },
            "/_fence/v1/reconcile": {
                "get": {
                    "summary": "blocked resources and effects in doubt, oldest first "
                    "(what `fenceproxy reconcile list --json` prints)",
                    "security": _ADMIN,
                    "responses": {
                        "200": _json(_ref("InDoubt"), "what waits for reconciliation"),
                        "default": _PROBLEM,
                    },
                }
            },
            "/_fence/metrics": {
                "get": {"responses": {"200": {"description": "Prometheus text format"}}}
            },
            "/_fence/v1/rejections": {
                "get": {
                    "summary": "refused requests, newest first",
                    "security": _ADMIN,
                    "responses": {
                        "200": _json({"type": "object"}, "rejections"),
                        "default": _PROBLEM,
                    },
                }
            },
            "/_fence/healthz": {"get": {"responses": {"200": {"description": "alive"}}}},
            "/_fence/readyz": {
                "get": {
                    "responses": {
                        "200": {"description": "the store took a write within the last second"},
                        "503": _PROBLEM,
                    }
                }
            },
        },
    }
