"""The policy as frozen objects, and what they answer (which route, which outcome).

`policies.loading` builds them from the YAML file and checks everything first,
so every object here is valid by construction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from policies.templates import PathTemplate, StringTemplate

# The characters and lengths are named on their own so that the OpenAPI document
# states the same rule (proxy/openapi.py) rather than a copy of it.
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
class Listen:
    host: str
    port: int


@dataclass(frozen=True)
class StorePool:
    """PostgreSQL connection pool size per proxy process."""

    min_size: int
    max_size: int


DAY_S = 86400.0


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
    (from the connection's start or the previous answer) and then the body, and how
    many proxied requests are handled at once."""

    header_timeout_s: float = 15.0
    body_timeout_s: float = 30.0
    max_requests: int = 1024


@dataclass(frozen=True)
class Pool:
    """Upstream connections per proxy process, one pool for fenced routes and one for
    pass-through routes, so neither kind of traffic can take the other's."""

    fenced: int = 256
    pass_through: int = 256


@dataclass(frozen=True)
class Upstream:
    name: str
    url: str
    timeout_s: float
    connect_timeout_s: float
    pool: Pool = Pool()


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
    required: bool
    retain_s: float


@dataclass(frozen=True)
class Probe:
    method: str
    path: StringTemplate


@dataclass(frozen=True)
class Reconcile:
    probe: Probe
    rules: StatusRules
    settle_s: float
    attempts: int


@dataclass(frozen=True)
class Route:
    name: str
    upstream: Upstream
    methods: frozenset[str]
    path: PathTemplate
    resource: StringTemplate | None
    fenced: bool
    forward_fence_headers: bool
    max_body_bytes: int
    max_in_flight: int
    idempotency: Idempotency
    outcomes: StatusRules
    reconcile: Reconcile | None
    # The upstream itself deduplicates by Idempotency-Key, so resending an operation
    # whose outcome is unknown cannot apply it twice.
    upstream_idempotent: bool = False


@dataclass(frozen=True)
class RouteMatch:
    route: Route
    params: dict[str, str]


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

    def match(self, method: str, path: str) -> RouteMatch | None:
        for route in self.routes:
            if method in route.methods:
                params = route.path.match(path)
                if params is not None:
                    return RouteMatch(route, params)
        return None

    def route_named(self, name: str) -> Route | None:
        return next((route for route in self.routes if route.name == name), None)
