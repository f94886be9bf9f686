"""The error code table is the only source of codes: the problem responses, the
OpenAPI document and the docs' table (docs/reference/errors.md) agree with it, and a
code that is not in it never reaches a client, not even as a bare 500."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpClient

from core.codes import ErrorCode
from core.records import Refusal
from proxy import openapi
from proxy.app import problem_middleware
from proxy.problems import problem

ERRORS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "errors.md"


def documented_error_table() -> list[tuple[str, int, str]]:
    """(code, status, when) of each row of the error codes page's table."""
    section = ERRORS_PAGE.read_text(encoding="utf-8").split("# Error codes\n", 1)[1]
    rows = []
    for line in section.splitlines():
        if line.startswith("## "):
            break
        if line.startswith("| `"):
            code, status, when = line.strip().strip("|").strip().split(" | ", 2)
            rows.append((code.strip("`"), int(status), when))
    return rows


def test_every_code_has_a_status_a_title_and_a_meaning() -> None:
    for code in ErrorCode:
        assert 400 <= code.status <= 599, code
        assert code.problem_title and code.when, code


def test_the_docs_list_exactly_the_codes_of_the_table_with_their_statuses() -> None:
    rows = documented_error_table()
    assert len(rows) == len({code for code, _, _ in rows}), "a code appears twice"
    assert {code: (status, when) for code, status, when in rows} == {
        code.value: (code.status, code.when) for code in ErrorCode
    }


def test_openapi_lists_exactly_the_codes_of_the_table_with_their_statuses() -> None:
    schema = openapi.document()["components"]["schemas"]["Problem"]
    assert schema["properties"]["code"]["enum"] == [code.value for code in ErrorCode]
    branches = {
        branch["properties"]["code"]["const"]: branch["properties"]["status"]["const"]
        for branch in schema["oneOf"]
    }
    assert len(schema["oneOf"]) == len(branches)
    assert branches == {code.value: code.status for code in ErrorCode}


def test_problem_body_keeps_its_shape_with_the_table_title() -> None:
    response = problem(
        ErrorCode.STALE_EPOCH, "superseded", resource="rule:r1", epoch=1, holder=None
    )
    assert response.status == 409
    assert response.content_type == "application/problem+json"
    assert isinstance(response.body, bytes)
    assert json.loads(response.body) == {
        "type": "https://fenceproxy.dev/problems/stale_epoch",
        "title": "Lease no longer current",
        "status": 409,
        "detail": "superseded",
        "code": "stale_epoch",
        "resource": "rule:r1",
        "epoch": 1,
    }


def test_a_refusal_takes_an_error_code_and_refuses_its_string() -> None:
    """mypy rejects a string where the code goes; an untyped caller is stopped where the
    refusal is made, not by a response nobody can map to a status."""
    assert Refusal(ErrorCode.STALE_EPOCH, "old").code is ErrorCode.STALE_EPOCH
    with pytest.raises(TypeError, match="'stale_epoch'"):
        Refusal("stale_epoch", "a code by its string")  # type: ignore[arg-type]


async def test_an_unknown_code_reaching_the_middleware_is_an_internal_error(
    aiohttp_client: AiohttpClient,
) -> None:
    async def raises(request: web.Request) -> web.Response:
        raise Refusal("no_such_code", "raised")  # type: ignore[arg-type]

    async def returns(request: web.Request) -> web.Response:
        return problem("no_such_code", "returned")  # type: ignore[arg-type]

    app = web.Application(middlewares=[problem_middleware])
    app.router.add_get("/raises", raises)
    app.router.add_get("/returns", returns)
    client = await aiohttp_client(app)
    for path in ("/raises", "/returns"):
        response = await client.get(path)
        assert response.status == 500, path
        assert response.content_type == "application/problem+json", path
        assert (await response.json(content_type=None))["code"] == "internal_error", path


async def test_an_http_error_aiohttp_raises_is_a_problem_document(
    aiohttp_client: AiohttpClient,
) -> None:
    """The codes of the statuses aiohttp uses; any other is a bug of ours (500); a
    redirect stays a redirect."""
    raised: dict[str, web.HTTPException] = {
        "/bad": web.HTTPBadRequest(text="no good"),
        "/forbidden": web.HTTPForbidden(),
        "/teapot": web.HTTPExpectationFailed(text="unknown Expect: tea"),
        "/moved": web.HTTPFound("/elsewhere"),
    }

    async def raises(request: web.Request) -> web.Response:
        raise raised[request.path]

    app = web.Application(middlewares=[problem_middleware])
    for path in raised:
        app.router.add_get(path, raises)
    client = await aiohttp_client(app)
    answers = {}
    for path in ("/bad", "/forbidden", "/teapot"):
        response = await client.get(path)
        assert response.content_type == "application/problem+json", path
        body = await response.json(content_type=None)
        answers[path] = (response.status, body["code"], body["detail"])
    moved = await client.get("/moved", allow_redirects=False)

    assert answers == {
        "/bad": (400, "invalid_request", "no good"),
        "/forbidden": (500, "internal_error", "unexpected 403 Forbidden"),
        "/teapot": (417, "expectation_failed", "unknown Expect: tea"),
    }
    assert moved.status == 302
