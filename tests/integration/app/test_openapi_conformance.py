"""Schemathesis against the running app: every documented operation, fed data its
OpenAPI document allows, never answers 5xx and answers only what the document says
(status, content type and body schema).

The app and the demo upstream run in the test's event loop (the `fence` harness);
schemathesis is synchronous (`requests`), so it runs in a process of its own while
the event loop serves it. Not a thread: Hypothesis parses its strategies' lambdas
with `ast.parse`, and CPython 3.11 before 3.11.8 keeps the AST constructor's
recursion depth per interpreter, so a parse on another thread at the same moment
(pytest formatting a report, a log line's traceback) fails one of them with
`SystemError: AST constructor recursion depth mismatch`. The budget is bounded and
deterministic: a few examples per operation, derandomized, no example database.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.app.backends import Backend
from tests.integration.app.conftest import ADMIN_TOKEN, Fence, FenceFactory, json_body
from tests.integration.app.test_auth import AUTH, RULES_READER_KEY

EXAMPLES_PER_OPERATION = 25
# The whole run, on a slow machine, with room to spare; a run over it is a regression.
BUDGET_S = 90.0
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def backend() -> Backend:
    """What is checked is the HTTP contract, the same on both stores: SQLite only."""
    return "sqlite"


def _has_input(document: dict[str, Any], method: str, path: str) -> bool:
    """Whether an operation takes anything a negative example could get wrong."""
    operation = document["paths"][path][method]
    # Security that may be left out (`{}`, open without `auth:`) is nothing to get wrong.
    required_security = "security" in operation and {} not in operation["security"]
    return required_security or any(key in operation for key in ("parameters", "requestBody"))


def _run(
    document: dict[str, Any], base_url: str, mode: GenerationMode, key: str = ADMIN_TOKEN
) -> list[str]:
    """Every operation's examples, in this (worker) thread, presenting `key`; the
    operations checked."""
    schema = schemathesis.openapi.from_dict(document)
    checked = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and not _has_input(
            document, operation.method, operation.path
        ):
            continue

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def examples(case: schemathesis.Case[Any]) -> None:
            case.call_and_validate(
                base_url=base_url,
                headers={"Authorization": f"Bearer {key}"},
                checks=CHECKS,
                timeout=10,
            )

        examples()
        checked.append(f"{operation.method.upper()} {operation.path}")
    return checked


def _run_reporting(
    document: dict[str, Any], base_url: str, mode: GenerationMode, key: str
) -> tuple[list[str], str | None]:
    """`_run` in the child process; a failure comes back as its traceback's text, since
    Hypothesis' and schemathesis' exception groups do not all survive pickling."""
    try:
        return _run(document, base_url, mode, key), None
    except BaseException:
        return [], traceback.format_exc()


async def _run_apart(
    document: dict[str, Any], base_url: str, mode: GenerationMode, key: str = ADMIN_TOKEN
) -> list[str]:
    """`_run` in a spawned process while this event loop serves the app; the operations
    checked."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        checked, failure = await asyncio.get_running_loop().run_in_executor(
            pool, _run_reporting, document, base_url, mode, key
        )
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    return checked


async def _seed(fence: Fence) -> None:
    """Something for the listings to list: a lease, a committed and a refused effect,
    a rejection."""
    lease = await fence.acquire("supplier:widget")
    assert (await fence.order("widget", lease["token"], "k-1")).status == 201
    refused = await fence.order("widget", lease["token"], "k-2", headers={"Demo-Status": "409"})
    assert refused.status == 409
    assert (await fence.order("widget", None, "k-3")).status == 401


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
async def test_every_operation_conforms_to_the_served_document(
    fence: Fence, mode: GenerationMode
) -> None:
    """Positive examples (what the document allows) and negative ones (what it does
    not): either way no 5xx, and only documented statuses and bodies. Whether a
    negative example is refused is not checked: unknown query parameters are ignored."""
    await _seed(fence)
    response = await fence.client.get("/_fence/v1/openapi.json")
    document = await json_body(response)
    base_url = str(fence.client.make_url("")).rstrip("/")
    started = time.monotonic()
    checked = await _run_apart(document, base_url, mode)
    elapsed = time.monotonic() - started
    expected = {
        f"{method.upper()} {path}"
        for path, operations in document["paths"].items()
        for method in operations
        if mode is GenerationMode.POSITIVE or _has_input(document, method, path)
    }
    assert set(checked) == expected
    assert elapsed < BUDGET_S, f"schemathesis took {elapsed:.1f} s"


async def test_the_served_document_states_the_running_policys_lease_bounds(fence: Fence) -> None:
    document = await json_body(await fence.client.get("/_fence/v1/openapi.json"))
    paths = document["paths"]
    leases = fence.policy.leases
    for path in ("/_fence/v1/leases", "/_fence/v1/leases/renew"):
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        ttl_s = body["properties"]["ttl_s"]
        assert (ttl_s["minimum"], ttl_s["maximum"], ttl_s["default"]) == (
            leases.min_ttl_s,
            leases.max_ttl_s,
            leases.default_ttl_s,
        ), path


async def test_with_clients_a_scoped_readers_answers_conform_too(make_fence: FenceFactory) -> None:
    """With an `auth:` block and a client that may only read `rules:*`: the 401 and 403
    answers (forbidden, forbidden_resource) are documented where they happen."""
    fence = await make_fence(top_level=AUTH)
    seeded = await fence.client.post(
        "/_fence/v1/leases",
        json={"resource": "supplier:widget", "holder": "worker-a"},
        headers=fence.admin,
    )
    assert seeded.status == 201, await seeded.text()
    document = await json_body(await fence.client.get("/_fence/v1/openapi.json"))
    base_url = str(fence.client.make_url("")).rstrip("/")
    checked = await _run_apart(document, base_url, GenerationMode.POSITIVE, RULES_READER_KEY)
    assert len(checked) == sum(len(operations) for operations in document["paths"].values())
