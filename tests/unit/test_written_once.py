"""What the proxy says in one way is written in one place: the refusal that carries an
error code, the headers that name a fenced write, and the keys of a route."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from core.records import fence_headers
from policies import Outcome, Route, StatusRules, parse_policy, route_keys
from policies.keys import Block, Key

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("policies", "core", "store", "reconcile", "proxy")


def _sources() -> list[tuple[str, ast.Module]]:
    return [
        (str(source.relative_to(ROOT)), ast.parse(source.read_text(encoding="utf-8")))
        for package in SHIPPED
        for source in sorted((ROOT / package).rglob("*.py"))
    ]


def test_one_class_carries_an_error_code() -> None:
    """`core.records.Refusal`, returned or raised: no second class whose constructor
    takes an `ErrorCode` (there were three, with the same fields)."""
    carriers = [
        f"{path}:{node.name}"
        for path, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for init in node.body
        if isinstance(init, ast.FunctionDef) and init.name == "__init__"
        if any(
            argument.annotation is not None and "ErrorCode" in ast.unparse(argument.annotation)
            for argument in init.args.args + init.args.kwonlyargs
        )
    ]
    assert carriers == ["core/records.py:Refusal"]


FENCE_HEADER_NAMES = {"Fence-Epoch", "Fence-Resource", "Fence-Effect-Id"}


def test_the_fence_headers_are_built_in_one_place() -> None:
    spelled = sorted(
        f"{path}:{node.lineno}"
        for path, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in FENCE_HEADER_NAMES
    )
    assert spelled and all(where.startswith("core/records.py:") for where in spelled), spelled


def test_fence_headers_leave_out_what_is_not_known() -> None:
    assert fence_headers("job:1", epoch=3, effect_id="eff_1") == {
        "Fence-Epoch": "3",
        "Fence-Resource": "job:1",
        "Fence-Effect-Id": "eff_1",
    }
    assert fence_headers("job:1", effect_id="eff_1") == {
        "Fence-Resource": "job:1",
        "Fence-Effect-Id": "eff_1",
    }
    assert fence_headers("job:1") == {"Fence-Resource": "job:1"}


def _declared(block: Key[object]) -> Iterator[Key[object]]:
    assert isinstance(block.kind, Block)
    for key in block.kind.keys:
        yield key
        if isinstance(key.kind, Block):
            yield from _declared(key)


def test_a_route_key_is_declared_once_and_its_default_is_what_the_loader_gives() -> None:
    """The declarations of policies/route_keys.py are the loader's keys, the model's
    defaults and the reference's lines: a route and an upstream that leave every
    optional key out get each declared default."""
    policy = parse_policy(
        "version: 1\n"
        'upstreams: {u: {url: "http://127.0.0.1:9001"}}\n'
        "routes:\n"
        "  - name: r\n"
        "    upstream: u\n"
        '    match: {methods: [PUT], path: "/x/{id}"}\n'
        '    resource: "x:{id}"\n'
    )
    route, upstream = policy.routes[0], policy.upstreams["u"]
    given = {
        route_keys.TIMEOUT_S: upstream.timeout_s,
        route_keys.CONNECT_TIMEOUT_S: upstream.connect_timeout_s,
        route_keys.SEND_WINDOW_S: upstream.send_window_s,
        route_keys.POOL_FENCED: upstream.pool.fenced,
        route_keys.POOL_PASS_THROUGH: upstream.pool.pass_through,
        route_keys.CA_BUNDLE: upstream.ca_bundle,
        route_keys.FENCE: "required" if route.fenced else "none",
        route_keys.FORWARD_FENCE_HEADERS: route.forward_fence_headers,
        route_keys.MAX_BODY_BYTES: route.max_body_bytes,
        route_keys.MAX_IN_FLIGHT: route.max_in_flight,
        route_keys.IDEMPOTENCY_REQUIRED: route.idempotency.required,
        route_keys.RETAIN_S: route.idempotency.retain_s,
        route_keys.UPSTREAM_IDEMPOTENT: route.upstream_idempotent,
    }
    assert {key.name: value for key, value in given.items()} == {
        key.name: key.default for key in given
    }
    assert route.outcomes == StatusRules(
        ((408, Outcome.UNKNOWN),),
        ((2, Outcome.COMMITTED), (4, Outcome.NOT_COMMITTED), (5, Outcome.UNKNOWN)),
        Outcome.UNKNOWN,
    )
    defaults = {field.name: field.default for field in dataclasses.fields(Route)}
    assert defaults["max_body_bytes"] == route_keys.MAX_BODY_BYTES.default
    assert defaults["fenced"] is True
    reference = {
        line.split(" | ")[0].strip("| `"): line
        for line in (ROOT / "docs/reference/configuration.md").read_text().splitlines()
        if line.startswith("| `routes[]") or line.startswith("| `upstreams.")
    }
    for key in _declared(route_keys.ROUTE):
        assert any(key.help.split(";")[0] in line for line in reference.values()), key.name
    assert len(reference) == len(list(_declared(route_keys.ROUTE))) + len(
        list(_declared(route_keys.UPSTREAM))
    )
