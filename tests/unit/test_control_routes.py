"""Every control endpoint the app serves is in README's "HTTP API" table and in the
OpenAPI document, and nothing is listed there that the app does not serve."""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web

from proxy import control, openapi

README = Path(__file__).resolve().parents[2] / "README.md"
# The document does not list itself.
OPENAPI_ITSELF = ("GET", "/_fence/v1/openapi.json")
_PARAMETER = re.compile(r"\{[^}]*\}")

Endpoint = tuple[str, str]


def _normal(method: str, path: str) -> Endpoint:
    """Path parameters compare by position, not by name (README says {id})."""
    return method.upper(), _PARAMETER.sub("{}", path.partition("?")[0])


def served() -> set[Endpoint]:
    app = web.Application()
    control.add_routes(app)
    return {
        _normal(route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def readme_endpoints() -> set[Endpoint]:
    section = README.read_text(encoding="utf-8").split("## HTTP API\n", 1)[1]
    section = section.split("\n## ", 1)[0].split("\n### ", 1)[0]
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


def test_the_readme_lists_every_control_endpoint() -> None:
    assert readme_endpoints() == served()


def test_the_openapi_document_lists_every_control_endpoint() -> None:
    assert openapi_endpoints() == served() - {OPENAPI_ITSELF}


def test_the_in_doubt_listing_is_an_admin_endpoint() -> None:
    assert ("GET", "/_fence/v1/reconcile") in served()
    operation = openapi.document()["paths"]["/_fence/v1/reconcile"]["get"]
    assert operation["security"] == [{"admin": []}]
