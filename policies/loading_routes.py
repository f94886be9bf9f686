"""A policy file's `upstreams` and `routes`: where requests go, which are fenced and
under which resource, what an upstream's statuses mean, and how to probe it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from policies import route_keys as keys
from policies.keys import Key
from policies.loading_listen import certificates_file
from policies.model import (
    DEFAULT_SEND_WINDOW_S,
    MAX_SEND_WINDOW_S,
    RESOURCE_RE,
    Idempotency,
    Outcome,
    Pool,
    Probe,
    Reconcile,
    Route,
    StatusRules,
    Upstream,
)
from policies.nodes import Mapping, Node, Problems
from policies.templates import PathTemplate, StringTemplate, TemplateError

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_STATUS_PATTERN = re.compile(r"([1-5])xx\Z|([1-5][0-9][0-9])\Z")


def parse_upstreams(root: Mapping, problems: Problems, base: Path) -> dict[str, Upstream]:
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
        upstream = Mapping(child, problems, keys.UPSTREAM.names)
        url = upstream.read(keys.URL)
        timeout = upstream.read(keys.TIMEOUT_S)
        connect = upstream.read(keys.CONNECT_TIMEOUT_S)
        window = _parse_send_window(upstream, problems, connect)
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
            float(_given(timeout, keys.TIMEOUT_S)),
            float(_given(connect, keys.CONNECT_TIMEOUT_S)),
            _parse_pool(upstream, problems),
            _parse_ca_bundle(upstream, url, base),
            window,
        )
    if not upstreams:
        problems.add(node, "at least one upstream is needed")
    return upstreams


def _given(value: Any, key: Key[float]) -> Any:
    """A value as read, or where it was refused (reported), the key's default: the
    object is built all the same, and the policy refused for the problem."""
    return key.default if value is None else value


def _parse_send_window(upstream: Mapping, problems: Problems, connect: object) -> float:
    """`send_window_s`: how long after its admission a fenced write may still be sent
    (core/send_deadline.py). At least `connect_timeout_s`, which covers waiting for a
    pooled connection too: a request that takes that long to get one is allowed to."""
    connect_s = float(connect) if isinstance(connect, int | float) else 0.0
    default = max(DEFAULT_SEND_WINDOW_S, connect_s)
    window = upstream.read(keys.SEND_WINDOW_S, default=default)
    if not isinstance(window, int | float):
        return default
    node = upstream.children.get(keys.SEND_WINDOW_S.name)
    if node is None:
        return float(window)
    if window > MAX_SEND_WINDOW_S:
        problems.add(
            node,
            f"send_window_s ({window:g}) exceeds {MAX_SEND_WINDOW_S:g}: a write admitted on a "
            "replica that then stalls would block its resource that much longer",
        )
    elif window < connect_s:
        problems.add(
            node,
            f"send_window_s ({window:g}) is below connect_timeout_s ({connect_s:g}): a request "
            "still connecting within its connect timeout would pass its send deadline",
        )
    return float(window)


def _parse_pool(upstream: Mapping, problems: Problems) -> Pool:
    """An upstream's `pool: {fenced, pass_through}`: connections per process."""
    default = Pool()
    node = upstream.child(keys.POOL.name)
    if node is None:
        return default
    block = Mapping(node, problems, keys.POOL.names)
    if not block.valid:
        return default
    fenced = block.read(keys.POOL_FENCED)
    passing = block.read(keys.POOL_PASS_THROUGH)
    return Pool(
        fenced if isinstance(fenced, int) else default.fenced,
        passing if isinstance(passing, int) else default.pass_through,
    )


def _parse_ca_bundle(upstream: Mapping, url: str | None, base: Path) -> str | None:
    """An https upstream's `ca_bundle`: the CAs its certificate must chain to."""
    bundle = certificates_file(upstream, keys.CA_BUNDLE.name, base, required=False)
    if bundle is not None and url is not None and not url.lower().startswith("https://"):
        upstream.problems.add(
            upstream.children["ca_bundle"],
            f"only an https url is verified with a CA bundle, and the url is {url!r}",
        )
    return bundle


def _valid_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _parse_status_rules(
    mapping: Mapping | None, keys_: tuple[Key[tuple[str, ...] | None], ...]
) -> StatusRules | None:
    """Status lists into rules; a key that is absent stands for its default (none: the
    key is required)."""
    exact: dict[int, tuple[Outcome, Node | None]] = {}
    classes: dict[int, tuple[Outcome, Node | None]] = {}
    for key in keys_:
        entries = _status_entries(mapping, key)
        if entries is None:
            return None
        for value, node in entries:
            _add_status(mapping, Outcome(key.name), value, node, exact, classes)
    return StatusRules(
        tuple((code, outcome) for code, (outcome, _) in sorted(exact.items())),
        tuple((code, outcome) for code, (outcome, _) in sorted(classes.items())),
        Outcome.UNKNOWN,
    )


def _status_entries(
    mapping: Mapping | None, key: Key[tuple[str, ...] | None]
) -> list[tuple[str, Node | None]] | None:
    """A key's statuses with their nodes (none for a default's); None if refused."""
    listed = mapping.text_list(key.name, required=key.required) if mapping else None
    if listed is not None:
        return list(listed)
    if key.default is not None and (mapping is None or mapping.child(key.name) is None):
        return [(value, None) for value in key.default]
    return None


def _add_status(
    mapping: Mapping | None,
    outcome: Outcome,
    value: str,
    node: Node | None,
    exact: dict[int, tuple[Outcome, Node | None]],
    classes: dict[int, tuple[Outcome, Node | None]],
) -> None:
    found = _STATUS_PATTERN.match(value)
    target = exact if found and found.group(2) else classes
    if found is None:
        _report(mapping, node, f"expected a status like 404 or 5xx, got {value!r}")
        return
    code = int(found.group(2) or found.group(1))
    if code in target and target[code][0] is not outcome:
        _report(mapping, node, f"{value} is mapped to two outcomes")
        return
    target[code] = (outcome, node)


def _report(mapping: Mapping | None, node: Node | None, message: str) -> None:
    """A problem with a status the file wrote (a default's cannot have one)."""
    if mapping is not None and node is not None:
        mapping.problems.add(node, message)


_OUTCOME_KEYS = (keys.COMMITTED, keys.NOT_COMMITTED, keys.UNKNOWN)
_PROBE_OUTCOME_KEYS = (keys.PROBE_COMMITTED, keys.PROBE_NOT_COMMITTED)


def _parse_reconcile(node: Node, problems: Problems, route: _RouteDraft) -> Reconcile | None:
    block = Mapping(node, problems, keys.RECONCILE.names)
    if not block.valid:
        return None
    probe_node = block.child(keys.PROBE.name, required=True)
    probe = None if probe_node is None else _parse_probe(probe_node, problems, route)
    rules = _parse_status_rules(block, _PROBE_OUTCOME_KEYS)
    settle = _parse_settle(block, route)
    attempts = block.read(keys.ATTEMPTS)
    if probe is None or rules is None or settle is None or attempts is None:
        return None
    return Reconcile(probe, rules, float(settle), int(attempts))


def _parse_probe(node: Node, problems: Problems, route: _RouteDraft) -> Probe | None:
    spec = Mapping(node, problems, keys.PROBE.names)
    method = spec.read(keys.PROBE_METHOD)
    path_raw = spec.read(keys.PROBE_PATH)
    if path_raw is None:
        return None
    at = spec.children[keys.PROBE_PATH.name]
    try:
        template = StringTemplate.parse(path_raw)
    except TemplateError as exc:
        problems.add(at, str(exc))
        return None
    known = set(route.params) | {"idempotency_key"}
    for name in template.names:
        if name not in known:
            problems.add(
                at,
                f"{{{name}}} is neither a path parameter of the route nor {{idempotency_key}}",
            )
    if not path_raw.startswith("/"):
        problems.add(at, "the probe path must start with '/'")
    if "idempotency_key" in template.names and route.idempotency_required is False:
        problems.add(at, "{idempotency_key} needs idempotency.required: true on the route")
    return Probe(method, template)


def _parse_settle(block: Mapping, route: _RouteDraft) -> float | None:
    # settle_s says "after this long since dispatch the upstream will not apply the write
    # any more". The upstream may still apply a write the proxy gave up on at its timeout,
    # so a window shorter than the timeout contradicts the timeout itself: a "not found"
    # inside it would free the key of a write still on its way (a second order).
    timeout_s = route.upstream.timeout_s if route.upstream else 0.0
    settle = block.read(keys.SETTLE_S, default=timeout_s)
    if settle is not None and route.upstream is not None and settle < timeout_s:
        block.problems.add(
            block.children[keys.SETTLE_S.name],
            f"settle_s ({settle:g}) is below upstream {route.upstream.name}'s timeout_s "
            f"({timeout_s:g}): a write that timed out may still land after a 'not found'; "
            f"use at least {timeout_s:g}",
        )
        return None
    return settle if settle is None else float(settle)


@dataclass
class _RouteDraft:
    params: tuple[str, ...]
    # None when the route's idempotency block failed its own checks: unknown, not false.
    idempotency_required: bool | None
    upstream: Upstream | None


@dataclass(frozen=True)
class _Matcher:
    """What a route matches, for the ambiguity check."""

    name: str
    methods: frozenset[str]
    path: PathTemplate
    node: Node


def _parse_route(
    node: Node, problems: Problems, upstreams: dict[str, Upstream], matchers: list[_Matcher]
) -> Route | None:
    spec = Mapping(node, problems, keys.ROUTE.names)
    if not spec.valid:
        return None
    before = len(problems.items)
    name = spec.read(keys.NAME)
    upstream = _parse_upstream_name(spec, upstreams)
    methods, path = _parse_match(spec, problems)
    if methods and path is not None:
        matchers.append(_Matcher(name or node.key, methods, path, node))
    fenced = spec.read(keys.FENCE) == "required"
    raw_resource = spec.read(keys.RESOURCE)
    resource = None if raw_resource is None else _parse_resource(spec, raw_resource, path)
    if raw_resource is None and fenced and not problems.about(f"{node.key}.{keys.FENCE.name}"):
        problems.add(node, "a fenced route (fence: required) needs a 'resource' template")
    forward = spec.read(keys.FORWARD_FENCE_HEADERS)
    max_body = spec.read(keys.MAX_BODY_BYTES)
    max_in_flight = spec.read(keys.MAX_IN_FLIGHT)
    idempotency = _parse_idempotency(spec, problems)
    upstream_idempotent = _parse_upstream_idempotent(spec, idempotency)
    outcomes_node = spec.child(keys.OUTCOMES.name)
    outcomes = _parse_status_rules(
        Mapping(outcomes_node, problems, keys.OUTCOMES.names) if outcomes_node else None,
        _OUTCOME_KEYS,
    )
    reconcile = _parse_route_reconcile(spec, fenced, idempotency, upstream, path)
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


def _parse_upstream_name(spec: Mapping, upstreams: dict[str, Upstream]) -> Upstream | None:
    upstream_name = spec.read(keys.UPSTREAM_NAME)
    upstream = upstreams.get(upstream_name) if upstream_name else None
    if upstream_name is not None and upstream is None:
        defined = ", ".join(sorted(upstreams)) or "none"
        spec.problems.add(
            spec.children[keys.UPSTREAM_NAME.name],
            f"upstream {upstream_name!r} is not defined (defined: {defined})",
        )
    return upstream


def _parse_resource(spec: Mapping, raw: str, path: PathTemplate | None) -> StringTemplate | None:
    """The route's resource template, checked against its path; None if refused
    (reported)."""
    at = spec.children[keys.RESOURCE.name]
    try:
        resource = StringTemplate.parse(raw)
    except TemplateError as exc:
        spec.problems.add(at, str(exc))
        return None
    if path is not None:
        for missing in (n for n in resource.names if n not in path.params):
            spec.problems.add(
                at,
                f"{{{missing}}} is not a parameter of path {path.raw!r} "
                f"(parameters: {', '.join(path.params) or 'none'})",
            )
    unseparated = resource.unseparated()
    if unseparated is not None:
        first, second = unseparated
        spec.problems.add(
            at,
            f"{{{first}}} and {{{second}}} have no separator between them, so two "
            "paths could render one resource; put one of . _ : @ / + = - between them",
        )
    sample = resource.render({n: "x" for n in resource.names})
    if not RESOURCE_RE.match(sample):
        spec.problems.add(
            at,
            f"{raw!r} cannot render a valid resource name (1-256 of A-Z a-z 0-9 . _ : @ / + = -)",
        )
    return resource


def _parse_upstream_idempotent(spec: Mapping, idempotency: Idempotency) -> bool:
    upstream_idempotent = spec.read(keys.UPSTREAM_IDEMPOTENT)
    if (
        upstream_idempotent
        and not idempotency.required
        and not spec.problems.about(f"{spec.node.key}.{keys.IDEMPOTENCY.name}")
    ):
        spec.problems.add(
            spec.children[keys.UPSTREAM_IDEMPOTENT.name],
            "upstream_idempotent needs idempotency.required: true (a resend is matched by key)",
        )
    return bool(upstream_idempotent)


def _parse_route_reconcile(
    spec: Mapping,
    fenced: bool,
    idempotency: Idempotency,
    upstream: Upstream | None,
    path: PathTemplate | None,
) -> Reconcile | None:
    node = spec.child(keys.RECONCILE.name)
    if node is None:
        return None
    problems = spec.problems
    if not fenced:
        problems.add(node, "reconcile only applies to fenced routes")
    unknown = problems.about(f"{spec.node.key}.{keys.IDEMPOTENCY.name}")
    required = None if unknown else idempotency.required
    draft = _RouteDraft(path.params if path else (), required, upstream)
    return _parse_reconcile(node, problems, draft)


def _parse_match(spec: Mapping, problems: Problems) -> tuple[frozenset[str], PathTemplate | None]:
    node = spec.child(keys.MATCH.name, required=True)
    if node is None:
        return frozenset(), None
    match = Mapping(node, problems, keys.MATCH.names)
    methods: set[str] = set()
    for value, element in match.text_list(keys.METHODS.name, required=True) or ():
        if value.upper() not in HTTP_METHODS:
            problems.add(element, f"unknown HTTP method {value!r}")
        methods.add(value.upper())
    if match.valid and keys.METHODS.name in match.children and not methods:
        problems.add(match.children[keys.METHODS.name], "at least one method is needed")
    raw = match.read(keys.PATH)
    path = None
    if raw is not None:
        try:
            path = PathTemplate.parse(raw)
        except TemplateError as exc:
            problems.add(match.children[keys.PATH.name], f"{exc} in {raw!r}")
    return frozenset(methods), path


def _parse_idempotency(spec: Mapping, problems: Problems) -> Idempotency:
    node = spec.child(keys.IDEMPOTENCY.name)
    if node is None:
        return Idempotency()
    block = Mapping(node, problems, keys.IDEMPOTENCY.names)
    retain = block.read(keys.RETAIN_S)
    return Idempotency(block.read(keys.IDEMPOTENCY_REQUIRED), float(_given(retain, keys.RETAIN_S)))


def parse_routes(
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
    # Every route whose match parsed, valid or not otherwise: an ambiguity is reported
    # with the file's other problems, not only once they are fixed.
    matchers: list[_Matcher] = []
    for element in node.elements():
        route = _parse_route(element, problems, upstreams, matchers)
        if route is None:
            continue
        if route.name in names:
            problems.add(
                element,
                f"route name {route.name!r} is already used on line {names[route.name]}",
            )
        names.setdefault(route.name, element.line)
        routes.append((route, element))
    for index, matcher in enumerate(matchers):
        for earlier in matchers[:index]:
            shared = matcher.methods & earlier.methods
            witness = matcher.path.overlaps(earlier.path) if shared else None
            if witness is not None:
                problems.add(
                    matcher.node,
                    f"route {matcher.name!r} and route {earlier.name!r} (line "
                    f"{earlier.node.line}) both match {sorted(shared)[0]} {witness}; "
                    "matching would be ambiguous",
                )
    if not routes and not problems:
        problems.add(node, "at least one route is needed")
    return tuple(route for route, _ in routes)
