"""Routing and fencing policy: YAML in, frozen validated objects out."""

from policies.loading import load_policy, parse_policy
from policies.model import (
    HOLDER_RE,
    RESOURCE_RE,
    Idempotency,
    LeaseBounds,
    Limits,
    Listen,
    Outcome,
    Policy,
    Pool,
    Probe,
    Quotas,
    Reconcile,
    Retention,
    Route,
    RouteMatch,
    StatusRules,
    StorePool,
    Upstream,
)
from policies.nodes import ConfigError, Problem

__all__ = [
    "HOLDER_RE",
    "RESOURCE_RE",
    "ConfigError",
    "Idempotency",
    "LeaseBounds",
    "Limits",
    "Listen",
    "Outcome",
    "Policy",
    "Pool",
    "Probe",
    "Problem",
    "Quotas",
    "Reconcile",
    "Retention",
    "Route",
    "RouteMatch",
    "StatusRules",
    "StorePool",
    "Upstream",
    "load_policy",
    "parse_policy",
]
