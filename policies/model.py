"""The policy as frozen objects, and what they answer (which route, which outcome).

`policies.loading` builds them from the YAML file and checks everything first,
so every object here is valid by construction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from fnmatch import fnmatchcase

from policies import route_keys as keys
from policies.keys import DAY_S
from policies.templates import PathTemplate, StringTemplate

# The characters and lengths are named on their own so that the OpenAPI document
# states the same rule (proxy/openapi_parts.py) rather than a copy of it.
RESOURCE_CHARS = "A-Za-z0-9._:@/+=-"
MAX_RESOURCE_CHARS = 256
HOLDER_CHARS = "A-Za-z0-9._:@-"
MAX_HOLDER_CHARS = 128
RESOURCE_RE = re.compile(rf"[{RESOURCE_CHARS}]{{1,{MAX_RESOURCE_CHARS}}}\Z")
HOLDER_RE = re.compile(rf"[{HOLDER_CHARS}]{{1,{MAX_HOLDER_CHARS}}}\Z")


class Outcome(Enum):
    COMMITTED = "committed"
    NOT_COMMITTED = "not_committed"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ListenTLS:
    """The listener's certificate chain and private key (PEM files), and the CA that
    every client certificate must chain to (mutual TLS), or None: no client
    certificate asked for."""

    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True)
class Listen:
    host: str
    port: int
    tls: ListenTLS | None = None


@dataclass(frozen=True)
class StorePool:
    """PostgreSQL connection pool per proxy process: its size; whether statements are
    prepared once per connection and kept (`statement_cache`: off behind a pooler in
    transaction mode, where a prepared statement's name means different things on
    different server connections); how long a request waits for a free connection
    (`acquire_timeout_s`) and for one statement (`command_timeout_s`) before the store
    counts as unavailable."""

    min_size: int
    max_size: int
    statement_cache: bool = True
    acquire_timeout_s: float = 5.0
    command_timeout_s: float = 30.0


@dataclass(frozen=True)
class Retention:
    """How long the audit trail is kept, in seconds (0: forever), and the most one
    pass of the retention collector deletes of each kind in one transaction.
    `leases_s` runs from a lease's expiry; a resource row goes once nothing refers
    to it (and never lets its epoch be issued again)."""

    effects_s: float
    rejections_s: float
    batch: int
    leases_s: float = 30 * DAY_S


DEFAULT_RETENTION = Retention(30 * DAY_S, 7 * DAY_S, 1000)


@dataclass(frozen=True)
class LeaseBounds:
    min_ttl_s: float
    max_ttl_s: float
    default_ttl_s: float


@dataclass(frozen=True)
class Limits:
    """What one client may hold of the proxy: seconds to send the request headers
    (from the connection's start or the previous answer) and then the body, how
    many proxied requests are handled at once, and how many connections are open."""

    header_timeout_s: float = 15.0
    body_timeout_s: float = 30.0
    max_requests: int = 1024
    # Past it the connection waiting longest for a request head is closed
    # (proxy/connections.py); above max_requests, so that each request in flight can
    # hold its connection and workers still have room to connect.
    max_connections: int = 1280
    # Requests with no verified credential (no configured client's key, no live
    # lease's token) waiting at once for their token's lookup or their body; one
    # more sheds the one waiting longest (proxy/connections.py). None: a quarter of
    # max_requests, so that such requests, however many, leave the rest to workers
    # with a credential.
    max_unverified_waits: int | None = None

    @property
    def unverified_waits(self) -> int:
        if self.max_unverified_waits is not None:
            return self.max_unverified_waits
        return max(1, self.max_requests // 4)


@dataclass(frozen=True)
class Quotas:
    """What one quota subject may take (proxy/quotas.py `quota_subject`: the holder, or
    with `auth:` the client): live leases at once, and acquires per second with a burst
    (a token bucket per subject, per process). 0 means unlimited. The defaults are far
    above what a worker needs, and below what a runaway loop takes."""

    live_leases: int = 1000
    acquires_per_s: float = 50.0
    burst: int = 100


@dataclass(frozen=True)
class Pool:
    """Upstream connections per proxy process, one pool for fenced routes and one for
    pass-through routes, so neither kind of traffic can take the other's."""

    fenced: int = keys.POOL_FENCED.default
    pass_through: int = keys.POOL_PASS_THROUGH.default


# An admitted fenced write may be sent only this long after its admission began (by
# default; core/send_deadline.py): enough to connect and wait for a pooled connection.
DEFAULT_SEND_WINDOW_S = keys.SEND_WINDOW_S.default
# The longest allowed: each second of it is a second longer that an effect whose
# replica stalled keeps its resource blocked before another replica may settle it.
MAX_SEND_WINDOW_S = 60.0


@dataclass(frozen=True)
class Upstream:
    name: str
    url: str
    timeout_s: float = keys.TIMEOUT_S.default
    connect_timeout_s: float = keys.CONNECT_TIMEOUT_S.default
    pool: Pool = Pool()
    # The only CAs an https upstream's certificate may chain to (PEM file); None: the
    # system's trust store. Verification is never off.
    ca_bundle: str | None = None
    send_window_s: float = DEFAULT_SEND_WINDOW_S


@dataclass(frozen=True)
class StatusRules:
    """Maps an upstream status to an outcome: exact codes first, then classes (`5xx`)."""

    exact: tuple[tuple[int, Outcome], ...]
    classes: tuple[tuple[int, Outcome], ...]
    default: Outcome

    def classify(self, status: int) -> Outcome:
        for code, outcome in self.exact:
            if code == status:
                return outcome
        for hundreds, outcome in self.classes:
            if status // 100 == hundreds:
                return outcome
        return self.default


@dataclass(frozen=True)
class Idempotency:
    required: bool = keys.IDEMPOTENCY_REQUIRED.default
    retain_s: float = keys.RETAIN_S.default


@dataclass(frozen=True)
class Probe:
    method: str
    path: StringTemplate


@dataclass(frozen=True)
class Reconcile:
    probe: Probe
    rules: StatusRules
    settle_s: float
    attempts: int = keys.ATTEMPTS.default


@dataclass(frozen=True)
class Route:
    """A route of the policy; its defaults are those its keys declare
    (policies/route_keys.py)."""

    name: str
    upstream: Upstream
    methods: frozenset[str]
    path: PathTemplate
    outcomes: StatusRules
    resource: StringTemplate | None = None
    fenced: bool = keys.FENCE.default == "required"
    forward_fence_headers: bool = keys.FORWARD_FENCE_HEADERS.default
    max_body_bytes: int = keys.MAX_BODY_BYTES.default
    max_in_flight: int = keys.MAX_IN_FLIGHT.default
    idempotency: Idempotency = Idempotency()
    reconcile: Reconcile | None = None
    # The upstream itself deduplicates by Idempotency-Key, so resending an operation
    # whose outcome is unknown cannot apply it twice.
    upstream_idempotent: bool = keys.UPSTREAM_IDEMPOTENT.default


@dataclass(frozen=True)
class RouteMatch:
    route: Route
    params: dict[str, str]


class Right(Enum):
    """What an authenticated client may do (`auth.clients[].may`); see `AuthClient.holds`."""

    LEASE = "lease"
    READ = "read"
    OPERATE = "operate"
    ADMIN = "admin"


# `operate` is useless without seeing what to operate on, and `admin` is everything.
_IMPLIED_BY = {
    Right.LEASE: frozenset({Right.LEASE, Right.ADMIN}),
    Right.READ: frozenset({Right.READ, Right.OPERATE, Right.ADMIN}),
    Right.OPERATE: frozenset({Right.OPERATE, Right.ADMIN}),
    Right.ADMIN: frozenset({Right.ADMIN}),
}


@dataclass(frozen=True)
class AuthClient:
    """A client of the control API: its key (an environment variable's value, or the
    key's SHA-256 in hex), the resources it may act on (fnmatch globs) and its rights.
    `line` is where the policy file defines it, for messages about its key."""

    name: str
    key_env: str | None
    key_sha256: str | None
    resources: tuple[str, ...]
    may: frozenset[Right]
    line: int = 0
    # Instead of a key: the subject CN of a client certificate verified against
    # `listen.tls.client_ca` names this client (mutual TLS).
    cert_subject: str | None = None

    def holds(self, right: Right) -> bool:
        return bool(self.may & _IMPLIED_BY[right])

    def covers(self, resource: str | None) -> bool:
        """Whether `resource` is in scope; None (a row about no resource) only for a
        client that covers every resource."""
        if resource is None:
            return "*" in self.resources
        return any(fnmatchcase(resource, glob) for glob in self.resources)


@dataclass(frozen=True)
class Auth:
    clients: tuple[AuthClient, ...]


@dataclass(frozen=True)
class Policy:
    version: int
    listen: Listen
    store: str
    admin_token_env: str | None
    leases: LeaseBounds
    upstreams: dict[str, Upstream]
    routes: tuple[Route, ...]
    store_pool: StorePool = StorePool(1, 10)
    retention: Retention = DEFAULT_RETENTION
    limits: Limits = Limits()
    quotas: Quotas = Quotas()
    # With it, the lease API and every read need a client's key (`auth:`); without it,
    # the lease API is open and only the admin token guards the rest.
    auth: Auth | None = None
    # A second admin token accepted alongside the first, so it can be rotated.
    admin_token_next_env: str | None = None
    # Metrics served on their own listener instead of the main one.
    metrics_listen: Listen | None = None

    def match(self, method: str, path: str) -> RouteMatch | None:
        for route in self.routes:
            if method in route.methods:
                params = route.path.match(path)
                if params is not None:
                    return RouteMatch(route, params)
        return None

    def route_named(self, name: str) -> Route | None:
        return next((route for route in self.routes if route.name == name), None)
