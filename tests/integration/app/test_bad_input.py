"""Bad input: every refusal is problem+json with its code, never a 500, and changes nothing.

Each case starts from the same state (a live lease on supplier:widget and one
committed order), sends one bad request and checks that the answer is the
contract's problem document, that neither the proxy's records nor the upstream's
changed, and that the refusal was recorded (by code) without any secret or body.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from multidict import CIMultiDict

from tests.integration.app.backends import Backend
from tests.integration.app.conftest import (
    ADMIN_TOKEN,
    Fence,
    FenceFactory,
    Json,
    assert_problem,
    sqlite_rows,
)

RESOURCE = "supplier:widget"
FRESH = "supplier:fresh"
MARKER = "BODYMARKER-3c7e91"
WRONG_BEARER = "wrong-bearer-d41d8cd98f00"
TOKEN = "<<TOKEN>>"  # replaced by the live lease's token when the case is sent
FORGED_TOKEN = "fpt_" + "Q" * 43  # well-formed, never issued
PROXY_TABLES = ("resources", "leases", "effects", "idempotency")


@pytest.fixture
def backend() -> Backend:
    """SQLite only. These refusals are decided before the store (request shape, admin
    auth) or by the shared admission decision, which the contract suites run on both
    backends; what is checked here beyond that is SQLite's own: that no secret reaches
    the database *files*, write-ahead log included. 78 cases twice would double the
    suite's time for no new PostgreSQL behaviour."""
    return "sqlite"


@dataclass(frozen=True)
class Case:
    id: str
    method: str
    path: str
    status: int
    code: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    chunked: bool = False
    query: tuple[tuple[str, str], ...] = field(default=())


def acquire_body(**fields: Any) -> bytes:
    return json.dumps({"resource": FRESH, "holder": "worker-b", **fields}).encode()


def acquire_case(id: str, body: bytes, *headers: tuple[str, str]) -> Case:
    """An acquire of the never-leased supplier:fresh that would be granted if accepted."""
    return Case(id, "POST", "/_fence/v1/leases", 400, "invalid_request", (*JSON_CT, *headers), body)


def order_case(
    id: str, status: int, code: str, *headers: tuple[str, str], body: bytes | None = None
) -> Case:
    """A fenced write that would commit a new order if the rule it breaks were dropped."""
    payload = json.dumps({"qty": 3, "note": MARKER}).encode() if body is None else body
    return Case(id, "POST", "/orders/widget", status, code, (*JSON_CT, *headers), payload)


def admin_case(id: str, status: int, code: str, *query: tuple[str, str], path: str = "") -> Case:
    return Case(id, "GET", path or "/_fence/v1/effects", status, code, ADMIN, query=tuple(query))


TOK = ("Fence-Token", TOKEN)
KEY = ("Idempotency-Key", "k-new")
JSON_CT = (("Content-Type", "application/json"),)
ADMIN = (("Authorization", f"Bearer {ADMIN_TOKEN}"),)
BIG_BODY = json.dumps({"qty": 1, "pad": MARKER * 200}).encode()  # over max_body_bytes 1024
REVOKE_BODY = json.dumps({"resource": RESOURCE, "reason": MARKER}).encode()

CASES = [
    # acquire: the body's shape
    acquire_case(
        "acquire-malformed-json", f'{{"resource": "{FRESH}", "holder": "{MARKER}'.encode()
    ),
    acquire_case("acquire-not-utf8", b'{"resource": "\xff\xfe' + MARKER.encode() + b'"}'),
    acquire_case("acquire-json-array", json.dumps([FRESH, "worker-b", MARKER]).encode()),
    acquire_case("acquire-json-string", json.dumps(MARKER).encode()),
    acquire_case("acquire-unknown-field", acquire_body(color=MARKER)),
    acquire_case("acquire-empty-body", b""),
    # acquire: resource names
    *[
        acquire_case(f"acquire-resource-{name}", acquire_body(resource=value))
        for name, value in [
            ("empty", ""),
            ("257-chars", "r" * 257),
            ("space", "supplier:wid get"),
            ("unicode", "supplier:caf\u00e9"),
            ("newline", "supplier:widget\n"),
            ("number", 42),
            ("null", None),
            ("list", [FRESH]),
        ]
    ],
    # acquire: holder names
    *[
        acquire_case(f"acquire-holder-{name}", acquire_body(holder=value))
        for name, value in [
            ("empty", ""),
            ("129-chars", "h" * 129),
            ("space", "worker b"),
            ("slash", "worker/b"),
            ("unicode", "w\u00f6rker"),
            ("number", 7),
            ("null", None),
        ]
    ],
    # acquire: ttl_s
    *[
        acquire_case(f"acquire-ttl-{name}", acquire_body(ttl_s=value))
        for name, value in [
            ("below-min", 0.05),
            ("zero", 0),
            ("above-max", 61),
            ("negative", -1),
            ("string", "5"),
            ("true", True),
            ("false", False),
            ("object", {"s": 5}),
            # Absent means the default; null is not absent (a client's bug, not a choice).
            ("null", None),
        ]
    ],
    *[
        acquire_case(
            f"acquire-ttl-{name}",
            f'{{"resource": "{FRESH}", "holder": "worker-b", "ttl_s": {raw}}}'.encode(),
        )
        for name, raw in [
            ("nan", "NaN"),
            ("infinity", "Infinity"),
            ("minus-infinity", "-Infinity"),
            ("overflow", "1e999"),
        ]
    ],
    # renew with a ttl out of bounds (accepted, it would extend the live lease)
    Case(
        "renew-ttl-above-max",
        "POST",
        "/_fence/v1/leases/renew",
        400,
        "invalid_request",
        (*JSON_CT, TOK),
        b'{"ttl_s": 3600}',
    ),
    Case(
        "renew-ttl-null",
        "POST",
        "/_fence/v1/leases/renew",
        400,
        "invalid_request",
        (*JSON_CT, TOK),
        b'{"ttl_s": null}',
    ),
    # tokens on a fenced write
    order_case("write-no-token", 401, "missing_token", KEY),
    order_case("write-token-not-fpt-shape", 403, "invalid_token", ("Fence-Token", "abc123"), KEY),
    order_case("write-token-empty", 403, "invalid_token", ("Fence-Token", ""), KEY),
    order_case(
        "write-token-very-long", 403, "invalid_token", ("Fence-Token", "fpt_" + "A" * 8000), KEY
    ),
    order_case("write-token-short-fpt", 403, "invalid_token", ("Fence-Token", "fpt_abc"), KEY),
    order_case("write-token-forged", 403, "invalid_token", ("Fence-Token", FORGED_TOKEN), KEY),
    order_case("write-token-duplicated", 400, "invalid_request", TOK, TOK, KEY),
    # idempotency keys
    order_case("write-no-key", 400, "missing_idempotency_key", TOK),
    order_case("write-key-duplicated", 400, "invalid_request", TOK, KEY, KEY),
    order_case(
        "write-key-duplicated-differing",
        400,
        "invalid_request",
        TOK,
        KEY,
        ("Idempotency-Key", "k-2"),
    ),
    order_case("write-key-with-spaces", 400, "invalid_request", TOK, ("Idempotency-Key", "a key")),
    order_case("write-key-300-chars", 400, "invalid_request", TOK, ("Idempotency-Key", "k" * 300)),
    # a path that renders no valid resource
    Case(
        "write-path-resource-unicode",
        "POST",
        "/orders/caf%C3%A9",
        400,
        "invalid_request",
        (*JSON_CT, TOK, KEY),
        b'{"qty": 1}',
    ),
    # header sizes
    order_case("write-header-over-8k", 431, "headers_too_large", TOK, KEY, ("X-Pad", "p" * 8300)),
    order_case(
        "write-headers-total-over-32k",
        431,
        "headers_too_large",
        TOK,
        KEY,
        *[(f"X-Pad-{i}", "p" * 7000) for i in range(5)],
    ),
    Case(
        "acquire-header-over-8k",
        "POST",
        "/_fence/v1/leases",
        431,
        "headers_too_large",
        (*JSON_CT, ("X-Pad", "p" * 8300)),
        acquire_body(),
    ),
    # body size
    order_case(
        "write-body-over-limit-content-length", 413, "payload_too_large", TOK, KEY, body=BIG_BODY
    ),
    Case(
        "write-body-over-limit-chunked",
        "POST",
        "/orders/widget",
        413,
        "payload_too_large",
        (*JSON_CT, TOK, KEY),
        BIG_BODY,
        chunked=True,
    ),
    # nothing matches
    Case("unmatched-path", "GET", "/nothing/here", 404, "no_route"),
    Case("unmatched-method", "DELETE", "/orders/widget", 404, "no_route", (TOK, KEY)),
    Case("unmatched-post", "POST", "/elsewhere/w", 404, "no_route", (*JSON_CT, TOK, KEY), b"{}"),
    Case("unknown-fence-path", "GET", "/_fence/v1/nope", 404, "no_route"),
    Case(
        "unknown-fence-version",
        "POST",
        "/_fence/v2/leases",
        404,
        "no_route",
        JSON_CT,
        acquire_body(),
    ),
    Case(
        "fence-method-not-served",
        "PUT",
        "/_fence/v1/leases",
        405,
        "method_not_allowed",
        JSON_CT,
        acquire_body(),
    ),
    Case(
        "deeply-nested-json",
        "POST",
        "/_fence/v1/leases",
        400,
        "invalid_request",
        JSON_CT,
        b"[" * 20000 + b"]" * 20000,
    ),
    # admin authentication
    Case("admin-effects-no-bearer", "GET", "/_fence/v1/effects", 401, "unauthorized"),
    Case(
        "admin-effects-wrong-bearer",
        "GET",
        "/_fence/v1/effects",
        401,
        "unauthorized",
        (("Authorization", f"Bearer {WRONG_BEARER}"),),
    ),
    Case(
        "admin-effects-basic-scheme",
        "GET",
        "/_fence/v1/effects",
        401,
        "unauthorized",
        (("Authorization", f"Basic {ADMIN_TOKEN}"),),
    ),
    Case("admin-rejections-no-bearer", "GET", "/_fence/v1/rejections", 401, "unauthorized"),
    Case(
        "admin-revoke-no-bearer",
        "POST",
        "/_fence/v1/admin/revoke",
        401,
        "unauthorized",
        JSON_CT,
        REVOKE_BODY,
    ),
    Case(
        "admin-revoke-wrong-bearer",
        "POST",
        "/_fence/v1/admin/revoke",
        401,
        "unauthorized",
        (*JSON_CT, ("Authorization", f"Bearer {WRONG_BEARER}")),
        REVOKE_BODY,
    ),
    Case(
        "admin-revoke-token-prefix",
        "POST",
        "/_fence/v1/admin/revoke",
        401,
        "unauthorized",
        (*JSON_CT, ("Authorization", f"Bearer {ADMIN_TOKEN[:-1]}")),
        REVOKE_BODY,
    ),
    # effects / rejections / lease view query parameters
    admin_case("effects-bad-state", 400, "invalid_request", ("state", "DONE")),
    admin_case("effects-lowercase-state", 400, "invalid_request", ("state", "committed")),
    *[
        admin_case(f"effects-limit-{name}", 400, "invalid_request", ("limit", value))
        for name, value in [
            ("zero", "0"),
            ("negative", "-1"),
            ("text", "ten"),
            ("over-max", "1001"),
            ("fraction", "1.5"),
        ]
    ],
    admin_case("effects-bad-resource", 400, "invalid_request", ("resource", "a b")),
    admin_case(
        "rejections-limit-zero",
        400,
        "invalid_request",
        ("limit", "0"),
        path="/_fence/v1/rejections",
    ),
    Case(
        "lease-view-bad-resource",
        "GET",
        "/_fence/v1/leases",
        400,
        "invalid_request",
        query=(("resource", "r" * 257),),
    ),
    Case("lease-view-no-resource", "GET", "/_fence/v1/leases", 400, "invalid_request"),
]


async def proxy_state(fence: Fence) -> Json:
    """Everything a bad request must leave alone, on both sides of the proxy."""
    tables = {
        table: sorted(sqlite_rows(fence.db_path, f"SELECT * FROM {table}"), key=repr)
        for table in PROXY_TABLES
    }
    return {
        "tables": tables,
        "leases": [await fence.lease(RESOURCE), await fence.lease(FRESH)],
        "effects": await fence.effects(),
        "upstream": await fence.demo_effects(),
        "upstream_headers": await fence.headers_seen(),
    }


@pytest.fixture
async def prepared(make_fence: FenceFactory) -> tuple[Fence, str]:
    """A live lease on supplier:widget and one committed order under it."""
    fence = await make_fence()
    lease = await fence.acquire(RESOURCE)
    response = await fence.order("widget", lease["token"], "k-0")
    assert response.status == 201, await response.text()
    assert await fence.upstream_orders() == 1
    return fence, str(lease["token"])


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 100):
        yield data[start : start + 100]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_bad_input_is_refused_without_effect(prepared: tuple[Fence, str], case: Case) -> None:
    fence, token = prepared
    before = await proxy_state(fence)
    rejections_before = await fence.rejections()

    headers: CIMultiDict[str] = CIMultiDict(
        (name, token if value == TOKEN else value) for name, value in case.headers
    )
    data: bytes | AsyncIterator[bytes] | None = case.body
    if case.chunked and case.body is not None:
        data = chunks(case.body)
    response = await fence.client.request(
        case.method,
        case.path,
        headers=headers,
        data=data,
        params=list(case.query),
        skip_auto_headers={"Content-Type"} if case.body is None else (),
    )
    problem = await assert_problem(response, case.status, case.code)

    assert token not in json.dumps(problem)
    assert await proxy_state(fence) == before
    rejections_after = await fence.rejections()
    assert len(rejections_after) == len(rejections_before) + 1
    newest = rejections_after[0]
    assert newest["code"] == case.code
    assert newest["method"] == case.method
    assert rejections_after[1:] == rejections_before
    # Every refusal is one more in a count of its kind (store/refusals.py): anyone can
    # send these, and one row each would fill the disk.
    assert newest["count"] == 1
    assert sqlite_rows(fence.db_path, "SELECT code, count FROM refusals") == [(case.code, 1)]
    assert_no_secret_stored(fence, token)


def assert_no_secret_stored(fence: Fence, token: str) -> None:
    """The refusal record holds neither the token, the Authorization header nor a body:
    each refusal is on it (store/refusals.py), and holds no secret."""
    secrets = (token, ADMIN_TOKEN, WRONG_BEARER, MARKER, FORGED_TOKEN)
    rows = sqlite_rows(fence.db_path, "SELECT * FROM refusals")
    assert rows
    text = json.dumps(rows, default=repr)
    for secret in secrets:
        assert secret not in text
    # And nowhere in the proxy's files, write-ahead log included.
    for path in fence.db_path.parent.glob(f"{fence.db_path.name}*"):
        raw = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in raw, (path.name, secret)


async def test_wrong_bearer_on_revoke_leaves_the_epoch(prepared: tuple[Fence, str]) -> None:
    """The revoke case above, spelled out: the holder's token keeps working."""
    fence, token = prepared
    response = await fence.client.post(
        "/_fence/v1/admin/revoke",
        json={"resource": RESOURCE, "reason": "nope"},
        headers={"Authorization": f"Bearer {WRONG_BEARER}"},
    )
    await assert_problem(response, 401, "unauthorized")
    assert (await fence.lease(RESOURCE))["epoch"] == 1
    again = await fence.order("widget", token, "k-after-bad-revoke")
    assert again.status == 201
    assert await fence.upstream_orders() == 2


async def test_admin_api_off_without_a_configured_token(make_fence: FenceFactory) -> None:
    fence = await make_fence(admin_token=None)
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": f"Bearer {ADMIN_TOKEN}"}):
        response = await fence.client.get("/_fence/v1/effects", headers=headers)
        await assert_problem(response, 401, "unauthorized")


async def test_a_wrong_method_on_a_control_path_names_the_allowed_ones(fence: Fence) -> None:
    response = await fence.client.put("/_fence/v1/leases", json={})
    await assert_problem(response, 405, "method_not_allowed")
    assert set(response.headers["Allow"].split(",")) >= {"GET", "POST"}
    effect = await fence.client.delete("/_fence/v1/effects/eff_x/probe", headers=fence.admin)
    await assert_problem(effect, 405, "method_not_allowed")
    assert effect.headers["Allow"] == "POST"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/orders/widget"),  # a proxied route
        ("POST", "/_fence/v1/leases"),  # a control POST
        ("GET", "/_fence/v1/effects"),  # a control GET (aiohttp's own Expect handler)
        ("GET", "/_fence/v1/nothing-here"),  # no route at all
        ("GET", "/_fence/ui/"),
    ],
)
async def test_an_expectation_the_proxy_cannot_meet_is_a_problem_document(
    fence: Fence, method: str, path: str
) -> None:
    response = await fence.client.request(
        method, path, headers={"Expect": "x-teapot", **fence.admin}, data=b"{}"
    )
    problem = await assert_problem(response, 417, "expectation_failed")
    assert "x-teapot" in problem["detail"]
