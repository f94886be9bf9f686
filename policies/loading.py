"""The policy file into policy objects: `load_policy(path)`, `parse_policy(text)`.

The loader walks PyYAML's node tree (not `safe_load`'s plain values) so that
every problem names its line and key path. It goes on after the first problem
and raises one `ConfigError` listing them all, each as `file:line: key.path:
message`, so nothing ever starts half-configured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from policies.model import (
    DAY_S,
    DEFAULT_RETENTION,
    RESOURCE_RE,
    Idempotency,
    LeaseBounds,
    Limits,
    Listen,
    Outcome,
    Policy,
    Pool,
    Probe,
    Reconcile,
    Retention,
    Route,
    StatusRules,
    StorePool,
    Upstream,
)
from policies.nodes import ConfigError, Mapping, Node, Problem, Problems, compose
from policies.store_backends import StoreBackend, store_backend
from policies.templates import PathTemplate, StringTemplate, TemplateError

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_STATUS_PATTERN = re.compile(r"([1-5])xx\Z|([1-5][0-9][0-9])\Z")


def load_policy(path: str | Path) -> Policy:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [Problem(1, "<file>", f"cannot be read: {exc}")]) from exc
    return parse_policy(text, str(path))


def parse_policy(text: str, filename: str = "<policy>") -> Policy:
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
        },
    )
    if not root.valid:
        raise ConfigError(filename, problems.items)
    version_node = root.child("version", required=True)
    version = version_node.scalar() if version_node is not None else 1
    if version_node is not None and (isinstance(version, bool) or version != 1):
        problems.add(version_node, f"only version 1 is known, got {version_node.describe()}")
    listen = _parse_listen(root, problems)
    store = _parse_store(root, problems)
    pool = _parse_store_pool(root, problems)
    admin_env = root.text("admin_token_env", default=None)
    leases = _parse_leases(root, problems)
    upstreams = _parse_upstreams(root, problems)
    routes = _parse_routes(root, problems, upstreams)
    retention = _parse_retention(root, problems, routes)
    limits = _parse_limits(root, problems)
    if problems:
        raise ConfigError(filename, problems.items)
    return Policy(1, listen, store, admin_env, leases, upstreams, routes, pool, retention, limits)


def _parse_listen(root: Mapping, problems: Problems) -> Listen:
    node = root.child("listen")
    if node is None:
        return Listen("127.0.0.1", 8080)
    listen = Mapping(node, problems, {"host", "port"})
    host = listen.text("host", default="127.0.0.1")
    port = listen.number("port", default=8080, integer=True)
    if isinstance(port, int) and port > 65535:
        problems.add(listen.children["port"], f"not a TCP port: {port}")
    return Listen(host or "127.0.0.1", port if isinstance(port, int) else 8080)


def _parse_store(root: Mapping, problems: Problems) -> str:
    store = root.text("store", default="sqlite:///state/fenceproxy.db")
    if store is None:
        return ""
    backend = store_backend(store)
    if backend is None:
        problems.add(
            root.children["store"],
            f"expected sqlite:///PATH or postgresql://..., got {store!r}",
        )
    elif backend is StoreBackend.SQLITE and (
        not store.startswith("sqlite:///") or not store[len("sqlite:///") :].partition("?")[0]
    ):
        problems.add(root.children["store"], f"expected sqlite:///PATH, got {store!r}")
    return str(store)


def _parse_store_pool(root: Mapping, problems: Problems) -> StorePool:
    node = root.child("store_pool")
    if node is None:
        return StorePool(1, 10)
    pool = Mapping(node, problems, {"min_size", "max_size"})
    low = pool.number("min_size", default=1, minimum=0, integer=True)
    high = pool.number("max_size", default=10, minimum=1, integer=True)
    if low is None or high is None:
        return StorePool(1, 10)
    if low > high:
        problems.add(node, f"min_size ({low}) is above max_size ({high})")
    return StorePool(low, high)


def _parse_leases(root: Mapping, problems: Problems) -> LeaseBounds:
    node = root.child("leases")
    if node is None:
        return LeaseBounds(1, 300, 30)
    leases = Mapping(node, problems, {"min_ttl_s", "max_ttl_s", "default_ttl_s"})
    low = leases.number("min_ttl_s", default=1, minimum=0.001)
    high = leases.number("max_ttl_s", default=300, minimum=0.001)
    default = leases.number("default_ttl_s", default=30, minimum=0.001)
    if None in (low, high, default):
        return LeaseBounds(1, 300, 30)
    if low > high:
        problems.add(node, f"min_ttl_s ({low}) is above max_ttl_s ({high})")
    elif not low <= default <= high:
        problems.add(node, f"default_ttl_s ({default}) is outside [{low}, {high}]")
    return LeaseBounds(float(low), float(high), float(default))


# One retention pass is one transaction: it must stay short (SQLite's writer, and the
# admissions queued behind it, wait for it).
MAX_RETENTION_BATCH = 10_000


def _parse_retention(root: Mapping, problems: Problems, routes: tuple[Route, ...]) -> Retention:
    """`retention: {effects_days, rejections_days, leases_days, batch}`; days may be
    fractional, 0 keeps forever. A receipt is kept at least as long as its key replays (the longest
    `idempotency.retain_s` of a fenced route): the default stretches to it, and a shorter
    `effects_days` is refused."""
    fenced = [route for route in routes if route.fenced]
    longest = max(fenced, key=lambda route: route.idempotency.retain_s, default=None)
    longest_s = longest.idempotency.retain_s if longest is not None else 0.0
    default_effects_s = max(DEFAULT_RETENTION.effects_s, longest_s)
    node = root.child("retention")
    if node is None:
        return replace(DEFAULT_RETENTION, effects_s=default_effects_s)
    block = Mapping(node, problems, {"effects_days", "rejections_days", "leases_days", "batch"})
    if not block.valid:
        return DEFAULT_RETENTION
    effects = block.number("effects_days", default=None)
    rejections = block.number("rejections_days", default=DEFAULT_RETENTION.rejections_s / DAY_S)
    leases = block.number("leases_days", default=DEFAULT_RETENTION.leases_s / DAY_S)
    batch = block.number("batch", default=DEFAULT_RETENTION.batch, minimum=1, integer=True)
    effects_s = default_effects_s if effects is None else float(effects) * DAY_S
    if effects is not None and longest is not None and 0 < effects_s < longest_s:
        problems.add(
            block.children["effects_days"],
            f"{effects:g} days is shorter than idempotency.retain_s of route {longest.name!r} "
            f"({longest_s:g} s = {longest_s / DAY_S:g} days): a receipt is kept as long as "
            f"its key may replay it; use at least {longest_s / DAY_S:g} (or 0: forever)",
        )
    if isinstance(batch, int) and batch > MAX_RETENTION_BATCH:
        problems.add(
            block.children["batch"],
            f"must be at most {MAX_RETENTION_BATCH} (one pass is one transaction), got {batch}",
        )
    return Retention(
        effects_s,
        float(rejections) * DAY_S if rejections is not None else DEFAULT_RETENTION.rejections_s,
        batch if isinstance(batch, int) else DEFAULT_RETENTION.batch,
        float(leases) * DAY_S if leases is not None else DEFAULT_RETENTION.leases_s,
    )


def _parse_limits(root: Mapping, problems: Problems) -> Limits:
    """`limits: {header_timeout_s, body_timeout_s, max_requests}`."""
    default = Limits()
    node = root.child("limits")
    if node is None:
        return default
    block = Mapping(node, problems, {"header_timeout_s", "body_timeout_s", "max_requests"})
    if not block.valid:
        return default
    header = block.number("header_timeout_s", default=default.header_timeout_s, minimum=0.001)
    body = block.number("body_timeout_s", default=default.body_timeout_s, minimum=0.001)
    most = block.number("max_requests", default=default.max_requests, minimum=1, integer=True)
    return Limits(
        float(header) if header is not None else default.header_timeout_s,
        float(body) if body is not None else default.body_timeout_s,
        most if isinstance(most, int) else default.max_requests,
    )


def _parse_pool(upstream: Mapping, problems: Problems) -> Pool:
    """An upstream's `pool: {fenced, pass_through}`: connections per process."""
    default = Pool()
    node = upstream.child("pool")
    if node is None:
        return default
    block = Mapping(node, problems, {"fenced", "pass_through"})
    if not block.valid:
        return default
    fenced = block.number("fenced", default=default.fenced, minimum=1, integer=True)
    passing = block.number("pass_through", default=default.pass_through, minimum=1, integer=True)
    return Pool(
        fenced if isinstance(fenced, int) else default.fenced,
        passing if isinstance(passing, int) else default.pass_through,
    )


def _parse_upstreams(root: Mapping, problems: Problems) -> dict[str, Upstream]:
    node = root.child("upstreams", required=True)
    upstreams: dict[str, Upstream] = {}
    if node is None:
        return upstreams
    if not node.is_mapping:
        problems.add(node, f"expected a mapping of upstream names, got {node.describe()}")
        return upstreams
    for name, child in node.items():
        if name in upstreams:
            problems.add(child, "upstream name appears twice")
        upstream = Mapping(child, problems, {"url", "timeout_s", "connect_timeout_s", "pool"})
        url = upstream.text("url")
        timeout = upstream.number("timeout_s", default=10, minimum=0.001)
        connect = upstream.number("connect_timeout_s", default=2, minimum=0.001)
        if url is not None and not _valid_http_url(url):
            problems.add(upstream.children["url"], f"expected an http(s) URL, got {url!r}")
        if (
            isinstance(timeout, int | float)
            and isinstance(connect, int | float)
            and connect > timeout
        ):
            problems.add(child, f"connect_timeout_s ({connect}) exceeds timeout_s ({timeout})")
        upstreams[name] = Upstream(
            name,
            (url or "").rstrip("/"),
            float(timeout or 10),
            float(connect or 2),
            _parse_pool(upstream, problems),
        )
    if not upstreams:
        problems.add(node, "at least one upstream is needed")
    return upstreams


def _valid_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _parse_status_rules(
    mapping: Mapping | None, keys: tuple[str, ...], defaults: dict[str, tuple[str, ...]] | None
) -> StatusRules | None:
    """Status lists into rules; `defaults` fills keys that are absent (None: all required)."""
    exact: dict[int, tuple[Outcome, Node | None]] = {}
    classes: dict[int, tuple[Outcome, Node | None]] = {}
    for key in keys:
        outcome = Outcome(key)
        listed = mapping.text_list(key, required=defaults is None) if mapping else None
        entries: list[tuple[str, Node | None]]
        if listed is not None:
            entries = list(listed)
        elif defaults is not None and (mapping is None or mapping.child(key) is None):
            entries = [(value, None) for value in defaults[key]]
        else:
            return None
        for value, node in entries:
            found = _STATUS_PATTERN.match(value)
            target = exact if found and found.group(2) else classes
            if found is None:
                if mapping is not None and node is not None:
                    mapping.problems.add(node, f"expected a status like 404 or 5xx, got {value!r}")
                continue
            code = int(found.group(2) or found.group(1))
            if code in target and target[code][0] is not outcome:
                if mapping is not None and node is not None:
                    mapping.problems.add(node, f"{value} is mapped to two outcomes")
                continue
            target[code] = (outcome, node)
    return StatusRules(
        tuple((code, outcome) for code, (outcome, _) in sorted(exact.items())),
        tuple((code, outcome) for code, (outcome, _) in sorted(classes.items())),
        Outcome.UNKNOWN,
    )


_DEFAULT_OUTCOMES = {"committed": ("2xx",), "not_committed": ("4xx",), "unknown": ("408", "5xx")}


def _parse_reconcile(node: Node, problems: Problems, route: _RouteDraft) -> Reconcile | None:
    block = Mapping(node, problems, {"probe", "committed", "not_committed", "settle_s", "attempts"})
    if not block.valid:
        return None
    probe_node = block.child("probe", required=True)
    probe = None
    if probe_node is not None:
        spec = Mapping(probe_node, problems, {"method", "path"})
        method = spec.choice("method", ("GET", "HEAD"), "GET")
        path_raw = spec.text("path")
        if path_raw is not None:
            try:
                template = StringTemplate.parse(path_raw)
            except TemplateError as exc:
                problems.add(spec.children["path"], str(exc))
            else:
                known = set(route.params) | {"idempotency_key"}
                for name in template.names:
                    if name not in known:
                        problems.add(
                            spec.children["path"],
                            f"{{{name}}} is neither a path parameter of the route "
                            "nor {idempotency_key}",
                        )
                if not path_raw.startswith("/"):
                    problems.add(spec.children["path"], "the probe path must start with '/'")
                if "idempotency_key" in template.names and not route.idempotency_required:
                    problems.add(
                        spec.children["path"],
                        "{idempotency_key} needs idempotency.required: true on the route",
                    )
                probe = Probe(method, template)
    rules = _parse_status_rules(block, ("committed", "not_committed"), None)
    # settle_s says "after this long since dispatch the upstream will not apply the write
    # any more". The upstream may still apply a write the proxy gave up on at its timeout,
    # so a window shorter than the timeout contradicts the timeout itself: a "not found"
    # inside it would free the key of a write still on its way (a second order).
    timeout_s = route.upstream.timeout_s if route.upstream else 0.0
    settle = block.number("settle_s", default=timeout_s)
    if settle is not None and route.upstream is not None and settle < timeout_s:
        problems.add(
            block.children["settle_s"],
            f"settle_s ({settle:g}) is below upstream {route.upstream.name}'s timeout_s "
            f"({timeout_s:g}): a write that timed out may still land after a 'not found'; "
            f"use at least {timeout_s:g}",
        )
        settle = None
    attempts = block.number("attempts", default=5, minimum=1, integer=True)
    if probe is None or rules is None or settle is None or attempts is None:
        return None
    return Reconcile(probe, rules, float(settle), int(attempts))


@dataclass
class _RouteDraft:
    params: tuple[str, ...]
    idempotency_required: bool
    upstream: Upstream | None


_ROUTE_KEYS = {
    "name",
    "upstream",
    "match",
    "resource",
    "fence",
    "forward_fence_headers",
    "max_body_bytes",
    "max_in_flight",
    "idempotency",
    "outcomes",
    "reconcile",
    "upstream_idempotent",
}


def _parse_route(node: Node, problems: Problems, upstreams: dict[str, Upstream]) -> Route | None:
    spec = Mapping(node, problems, _ROUTE_KEYS)
    if not spec.valid:
        return None
    before = len(problems.items)
    name = spec.text("name")
    upstream_name = spec.text("upstream")
    upstream = upstreams.get(upstream_name) if upstream_name else None
    if upstream_name is not None and upstream is None:
        defined = ", ".join(sorted(upstreams)) or "none"
        problems.add(
            spec.children["upstream"],
            f"upstream {upstream_name!r} is not defined (defined: {defined})",
        )
    methods, path = _parse_match(spec, problems)
    fenced = spec.choice("fence", ("required", "none"), "required") == "required"
    resource = None
    resource_raw = spec.text("resource", default=None)
    if resource_raw is not None:
        try:
            resource = StringTemplate.parse(resource_raw)
        except TemplateError as exc:
            problems.add(spec.children["resource"], str(exc))
        else:
            if path is not None:
                for missing in (n for n in resource.names if n not in path.params):
                    problems.add(
                        spec.children["resource"],
                        f"{{{missing}}} is not a parameter of path {path.raw!r} "
                        f"(parameters: {', '.join(path.params) or 'none'})",
                    )
            sample = resource.render({n: "x" for n in resource.names})
            if not RESOURCE_RE.match(sample):
                problems.add(
                    spec.children["resource"],
                    f"{resource_raw!r} cannot render a valid resource name "
                    "(1-256 of A-Z a-z 0-9 . _ : @ / + = -)",
                )
    elif fenced:
        problems.add(node, "a fenced route (fence: required) needs a 'resource' template")
    forward = spec.flag("forward_fence_headers", False)
    max_body = spec.number("max_body_bytes", default=1_048_576, minimum=0, integer=True)
    max_in_flight = spec.number("max_in_flight", default=1, minimum=1, integer=True)
    idempotency = _parse_idempotency(spec, problems)
    upstream_idempotent = spec.flag("upstream_idempotent", False)
    if upstream_idempotent and not idempotency.required:
        problems.add(
            spec.children["upstream_idempotent"],
            "upstream_idempotent needs idempotency.required: true (a resend is matched by key)",
        )
    outcomes_node = spec.child("outcomes")
    outcomes = _parse_status_rules(
        Mapping(outcomes_node, problems, set(_DEFAULT_OUTCOMES)) if outcomes_node else None,
        tuple(_DEFAULT_OUTCOMES),
        _DEFAULT_OUTCOMES,
    )
    reconcile_node = spec.child("reconcile")
    reconcile = None
    if reconcile_node is not None:
        if not fenced:
            problems.add(reconcile_node, "reconcile only applies to fenced routes")
        draft = _RouteDraft(path.params if path else (), idempotency.required, upstream)
        reconcile = _parse_reconcile(reconcile_node, problems, draft)
    if len(problems.items) > before:
        return None
    assert name and upstream and methods and path and outcomes
    return Route(
        name=name,
        upstream=upstream,
        methods=methods,
        path=path,
        resource=resource,
        fenced=fenced,
        forward_fence_headers=forward,
        max_body_bytes=max_body,
        max_in_flight=max_in_flight,
        idempotency=idempotency,
        outcomes=outcomes,
        reconcile=reconcile,
        upstream_idempotent=upstream_idempotent,
    )


def _parse_match(spec: Mapping, problems: Problems) -> tuple[frozenset[str], PathTemplate | None]:
    node = spec.child("match", required=True)
    if node is None:
        return frozenset(), None
    match = Mapping(node, problems, {"methods", "path"})
    methods: set[str] = set()
    for value, element in match.text_list("methods", required=True) or ():
        if value.upper() not in HTTP_METHODS:
            problems.add(element, f"unknown HTTP method {value!r}")
        methods.add(value.upper())
    if match.valid and "methods" in match.children and not methods:
        problems.add(match.children["methods"], "at least one method is needed")
    raw = match.text("path")
    path = None
    if raw is not None:
        try:
            path = PathTemplate.parse(raw)
        except TemplateError as exc:
            problems.add(match.children["path"], f"{exc} in {raw!r}")
    return frozenset(methods), path


def _parse_idempotency(spec: Mapping, problems: Problems) -> Idempotency:
    node = spec.child("idempotency")
    if node is None:
        return Idempotency(False, 86400)
    block = Mapping(node, problems, {"required", "retain_s"})
    retain = block.number("retain_s", default=86400, minimum=1)
    return Idempotency(block.flag("required", False), float(retain or 86400))


def _parse_routes(
    root: Mapping, problems: Problems, upstreams: dict[str, Upstream]
) -> tuple[Route, ...]:
    node = root.child("routes", required=True)
    if node is None:
        return ()
    if not node.is_sequence:
        problems.add(node, f"expected a list of routes, got {node.describe()}")
        return ()
    routes: list[tuple[Route, Node]] = []
    names: dict[str, int] = {}
    for element in node.elements():
        route = _parse_route(element, problems, upstreams)
        if route is None:
            continue
        if route.name in names:
            problems.add(
                element,
                f"route name {route.name!r} is already used on line {names[route.name]}",
            )
        names.setdefault(route.name, element.line)
        for earlier, earlier_node in routes:
            shared = route.methods & earlier.methods
            witness = route.path.overlaps(earlier.path) if shared else None
            if witness is not None:
                problems.add(
                    element,
                    f"route {route.name!r} and route {earlier.name!r} (line {earlier_node.line}) "
                    f"both match {sorted(shared)[0]} {witness}; matching would be ambiguous",
                )
        routes.append((route, element))
    if not routes and not problems:
        problems.add(node, "at least one route is needed")
    return tuple(route for route, _ in routes)
