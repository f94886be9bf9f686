"""The control API's OpenAPI document, served at /_fence/v1/openapi.json.

Every constraint here is built from the constant the code enforces it with
(policies.model, proxy.operations, proxy.tokens, the running policy's `leases`),
so the document and the checks cannot drift apart; each operation lists the
problem statuses it can answer, one response per status.

Built, not kept as a YAML/JSON file: `ttl_s` carries the running policy's bounds,
every `Problem` branch comes from the codes table (core/codes.py), the probe's
refusals from core.lifecycle's own rule, and every limit from the constant that
enforces it; a file would restate each and need a test per value to stay true.
The parts: `openapi_parts` (request values, callers, problem responses),
`openapi_schemas` (the answers' schemas), `openapi_paths` (the operations).
"""

from __future__ import annotations

from typing import Any

from policies.model import LeaseBounds
from proxy.openapi_parts import ttl
from proxy.openapi_paths import admin_paths, effect_paths, lease_paths, service_paths
from proxy.openapi_schemas import component_schemas


def document(leases: LeaseBounds | None = None) -> dict[str, Any]:
    """The document; with the running policy's `leases`, `ttl_s` carries its bounds."""
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
            "schemas": component_schemas(),
        },
        "paths": {
            **lease_paths(ttl(leases)),
            **admin_paths(),
            **effect_paths(),
            **service_paths(),
        },
    }
