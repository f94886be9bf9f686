"""A policy file's `upstreams` and `routes`: where requests go, which are fenced and
under which resource, what an upstream's statuses mean, and how to probe it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

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
        upstream = Mapping(
            child,
            problems,
            {"url", "timeout_s", "connect_timeout_s", "send_window_s", "pool", "ca_bundle"},
        )
        url = upstream.text("url")
        timeout = upstream.number("timeout_s", default=10, minimum=0.001)
        connect = upstream.number("connect_timeout_s", default=2, minimum=0.001)
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
            float(timeout or 10),
            float(connect or 2),
            _parse_pool(upstream, problems),
            _parse_ca_bundle(upstream, url, base),
            window,
        )
    if not upstreams:
        problems.add(node, "at least one upstream is needed")
    return upstreams


def _parse_send_window(upstream: Mapping, problems: Problems, connect: object) -> float:
    """`send_window_s`: how long after its admission a fenced write may still be sent
    (core/send_deadline.py). At least `connect_timeout_s`, which covers waiting for a
    pooled connection too: a request that takes that long to get one is allowed to."""
    connect_s = float(connect) if isinstance(connect, int | float) else 0.0
    default = max(DEFAULT_SEND_WINDOW_S, connect_s)
    window = upstream.number("send_window_s", default=default, minimum=0.001)
    if not isinstance(window, int | float):
        return default
    node = upstream.children.get("send_window_s")
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


def _parse_ca_bundle(upstream: Mapping, url: str | None, base: Path) -> str | None:
    """An https upstream's `ca_bundle`: the CAs its certificate must chain to."""
    bundle = certificates_file(upstream, "ca_bundle", base, required=False)
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
                if "idempotency_key" in template.names and route.idempotency_required is False:
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
    # None when the route's idempotency block failed its own checks: unknown, not false.
    idempotency_required: bool | None
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
    if methods and path is not None:
        matchers.append(_Matcher(name or node.key, methods, path, node))
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
            unseparated = resource.unseparated()
            if unseparated is not None:
                first, second = unseparated
                problems.add(
                    spec.children["resource"],
                    f"{{{first}}} and {{{second}}} have no separator between them, so two "
                    "paths could render one resource; put one of . _ : @ / + = - between them",
                )
            sample = resource.render({n: "x" for n in resource.names})
            if not RESOURCE_RE.match(sample):
                problems.add(
                    spec.children["resource"],
                    f"{resource_raw!r} cannot render a valid resource name "
                    "(1-256 of A-Z a-z 0-9 . _ : @ / + = -)",
                )
    elif fenced and not problems.about(f"{node.key}.fence"):
        problems.add(node, "a fenced route (fence: required) needs a 'resource' template")
    forward = spec.flag("forward_fence_headers", False)
    max_body = spec.number("max_body_bytes", default=1_048_576, minimum=0, integer=True)
    max_in_flight = spec.number("max_in_flight", default=1, minimum=1, integer=True)
    idempotency = _parse_idempotency(spec, problems)
    upstream_idempotent = spec.flag("upstream_idempotent", False)
    if (
        upstream_idempotent
        and not idempotency.required
        and not problems.about(f"{node.key}.idempotency")
    ):
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
        required = None if problems.about(f"{node.key}.idempotency") else idempotency.required
        draft = _RouteDraft(path.params if path else (), required, upstream)
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
