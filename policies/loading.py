"""The policy file into policy objects: `load_policy(path)`, `parse_policy(text)`.

The loader walks PyYAML's node tree (not `safe_load`'s plain values) so that
every problem names its line and key path. It goes on after the first problem
and raises one `ConfigError` listing them all, each as `file:line: key.path:
message`, so nothing ever starts half-configured.

This module is the public loading API: the two functions, the objects they return
and the policy file's own constants. Each block of the file is read by a module of
its own (`loading_listen`, `loading_auth`, `loading_store`, `loading_limits`,
`loading_routes`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from policies.loading_auth import RESERVED_CLIENT_NAMES, env_name, parse_auth
from policies.loading_limits import parse_leases, parse_limits, parse_quotas
from policies.loading_listen import parse_listen, parse_metrics_listen
from policies.loading_routes import HTTP_METHODS, parse_routes, parse_upstreams
from policies.loading_store import (
    MAX_RETENTION_BATCH,
    parse_retention,
    parse_store,
    parse_store_pool,
)
from policies.model import (
    HOLDER_RE,
    RESOURCE_RE,
    Auth,
    AuthClient,
    Idempotency,
    LeaseBounds,
    Limits,
    Listen,
    ListenTLS,
    Outcome,
    Policy,
    Pool,
    Probe,
    Quotas,
    Reconcile,
    Retention,
    Right,
    Route,
    StatusRules,
    StorePool,
    Upstream,
)
from policies.nodes import ConfigError, Mapping, Problem, Problems, compose

__all__ = [
    "HOLDER_RE",
    "HTTP_METHODS",
    "MAX_RETENTION_BATCH",
    "RESERVED_CLIENT_NAMES",
    "RESOURCE_RE",
    "Auth",
    "AuthClient",
    "ConfigError",
    "Idempotency",
    "LeaseBounds",
    "Limits",
    "Listen",
    "ListenTLS",
    "Outcome",
    "Policy",
    "Pool",
    "Probe",
    "Problem",
    "Quotas",
    "Reconcile",
    "Retention",
    "Right",
    "Route",
    "StatusRules",
    "StorePool",
    "Upstream",
    "load_policy",
    "load_policy_with_digest",
    "parse_policy",
]


def load_policy(path: str | Path) -> Policy:
    return load_policy_with_digest(path)[0]


def load_policy_with_digest(path: str | Path) -> tuple[Policy, str]:
    """The policy and the sha256 (hex) of the very bytes it was parsed from.

    The file's bytes, not a canonical form of the parsed policy: an operator can
    compare it with `sha256sum` of the file they deployed, it does not change when a
    new proxy version prints its objects differently, and two replicas started with
    `serve --port` on one file still agree. A comment changed in one copy only is a
    difference too: the copies are then not the same file."""
    try:
        data = Path(path).read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [Problem(1, "<file>", f"cannot be read: {exc}")]) from exc
    return parse_policy(text, str(path), Path(path).parent), hashlib.sha256(data).hexdigest()


def parse_policy(text: str, filename: str = "<policy>", base_dir: Path | None = None) -> Policy:
    """`base_dir` is what relative file paths in the policy (TLS files, the SQLite
    store) are relative to: the policy file's folder when loaded from a file, else the
    working directory."""
    base = base_dir if base_dir is not None else Path()
    problems = Problems()
    root = Mapping(
        compose(text, filename),
        problems,
        {
            "version",
            "listen",
            "store",
            "store_pool",
            "admin_token_env",
            "leases",
            "upstreams",
            "routes",
            "retention",
            "limits",
            "quotas",
            "auth",
            "admin_token_next_env",
            "metrics_listen",
        },
    )
    if not root.valid:
        raise ConfigError(filename, problems.items)
    version_node = root.child("version", required=True)
    version = version_node.scalar() if version_node is not None else 1
    if version_node is not None and (isinstance(version, bool) or version != 1):
        problems.add(version_node, f"only version 1 is known, got {version_node.describe()}")
    listen = parse_listen(root, problems, base)
    store = parse_store(root, problems, base)
    pool = parse_store_pool(root, problems)
    admin_env = root.text("admin_token_env", default=None)
    leases = parse_leases(root, problems)
    upstreams = parse_upstreams(root, problems, base)
    routes = parse_routes(root, problems, upstreams)
    retention = parse_retention(root, problems, routes)
    limits = parse_limits(root, problems)
    quotas = parse_quotas(root, problems)
    auth = parse_auth(root, problems, listen)
    next_admin_env = env_name(root, "admin_token_next_env", problems)
    metrics_listen = parse_metrics_listen(root, problems, listen)
    if problems:
        raise ConfigError(filename, problems.items)
    return Policy(
        1,
        listen,
        store,
        admin_env,
        leases,
        upstreams,
        routes,
        pool,
        retention,
        limits,
        quotas,
        auth=auth,
        admin_token_next_env=next_admin_env,
        metrics_listen=metrics_listen,
    )
