"""Every control endpoint the app serves is in the docs' HTTP API table
(docs/reference/http-api.md) and in the OpenAPI document, and nothing is listed there
that the app does not serve."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import schemathesis
from aiohttp import web

from policies import RESOURCE_RE, LeaseBounds
from policies.model import MAX_HOLDER_CHARS, MAX_RESOURCE_CHARS
from proxy import control, openapi
from proxy.operations import MAX_LIST_LIMIT

HTTP_API_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "http-api.md"
_PARAMETER = re.compile(r"\{[^}]*\}")

Endpoint = tuple[str, str]


def _normal(method: str, path: str) -> Endpoint:
    """Path parameters compare by position, not by name (the docs say {id})."""
    return method.upper(), _PARAMETER.sub("{}", path.partition("?")[0])


def served() -> set[Endpoint]:
    app = web.Application()
    control.add_routes(app)
    return {
        _normal(route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def documented_endpoints() -> set[Endpoint]:
    """The endpoints of the page's table (the page's text up to its first section)."""
    section = HTTP_API_PAGE.read_text(encoding="utf-8").split("\n## ", 1)[0]
    found = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            method, path = line.split("`")[1].split(" ", 1)
            found.add(_normal(method, path))
    return found


def openapi_endpoints() -> set[Endpoint]:
    return {
        _normal(method, path)
        for path, operations in openapi.document()["paths"].items()
        for method in operations
    }


def test_the_docs_list_every_control_endpoint() -> None:
    assert documented_endpoints() == served()


def test_the_openapi_document_lists_every_control_endpoint_itself_included() -> None:
    assert ("GET", "/_fence/v1/openapi.json") in served()
    assert openapi_endpoints() == served()


def test_the_in_doubt_listing_is_an_admin_endpoint() -> None:
    assert ("GET", "/_fence/v1/reconcile") in served()
    operation = openapi.document()["paths"]["/_fence/v1/reconcile"]["get"]
    assert operation["security"] == [{"admin": []}, {"client": []}]


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, operations in openapi.document()["paths"].items()
        for method, operation in operations.items()
    ]


def test_every_path_parameter_the_router_names_is_declared() -> None:
    app = web.Application()
    control.add_routes(app)
    documented = openapi.document()["paths"]
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method == "HEAD" or path not in documented:
            continue
        names = set(re.findall(r"\{([^}:]*)", path))
        operation = documented[path][route.method.lower()]
        declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        assert declared == names, (route.method, path)
        assert all(p["required"] for p in operation.get("parameters", []) if p["in"] == "path")


def test_every_operation_answers_problems_per_status_with_no_catch_all() -> None:
    for method, path, operation in _operations():
        responses = operation["responses"]
        assert "default" not in responses, (method, path)
        for status, response in responses.items():
            if int(status) >= 400:
                assert "application/problem+json" in response["content"], (method, path, status)


def test_the_body_and_query_constraints_are_the_codes_own() -> None:
    lease_bounds = LeaseBounds(min_ttl_s=2, max_ttl_s=60, default_ttl_s=10)
    paths = openapi.document(lease_bounds)["paths"]
    acquire = paths["/_fence/v1/leases"]["post"]["requestBody"]["content"]["application/json"]
    fields = acquire["schema"]["properties"]
    assert fields["ttl_s"]["minimum"] == 2 and fields["ttl_s"]["maximum"] == 60
    assert fields["resource"]["maxLength"] == MAX_RESOURCE_CHARS
    assert fields["holder"]["maxLength"] == MAX_HOLDER_CHARS
    for name, schema, good, bad in [
        ("resource", fields["resource"], "orders/42:a+b=c", "has space"),
        ("holder", fields["holder"], "worker-1@host", "a/b"),
    ]:
        assert re.search(schema["pattern"], good) and RESOURCE_RE.match(good), name
        assert not re.search(schema["pattern"], bad), name
    limit = next(
        p for p in paths["/_fence/v1/effects"]["get"]["parameters"] if p["name"] == "limit"
    )
    assert limit["schema"]["maximum"] == MAX_LIST_LIMIT


def test_the_document_is_valid_openapi_3_1() -> None:
    """Against the OpenAPI 3.1 meta-schema (schemathesis carries it: no network)."""
    for leases in (None, LeaseBounds(min_ttl_s=1, max_ttl_s=300, default_ttl_s=30)):
        schemathesis.openapi.from_dict(openapi.document(leases)).validate()
