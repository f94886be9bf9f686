"""Schemathesis against the running app: every documented operation, fed data its
OpenAPI document allows, never answers 5xx and answers only what the document says
(status, content type and body schema).

The app and the demo upstream run in the test's event loop (the `fence` harness);
schemathesis is synchronous (`requests`), so its loop runs in a worker thread while
the event loop serves it. The budget is bounded and deterministic: a few examples
per operation, derandomized, no example database.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.app.backends import Backend
from tests.integration.app.conftest import ADMIN_TOKEN, Fence, json_body

EXAMPLES_PER_OPERATION = 20
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


def _run(document: dict[str, Any], base_url: str) -> list[str]:
    """Every operation's examples, in this (worker) thread; the operations checked."""
    schema = schemathesis.openapi.from_dict(document)
    checked = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(case=operation.as_strategy())
        def examples(case: schemathesis.Case[Any]) -> None:
            case.call_and_validate(
                base_url=base_url,
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                checks=CHECKS,
                timeout=10,
            )

        examples()
        checked.append(f"{operation.method.upper()} {operation.path}")
    return checked


async def test_every_operation_conforms_to_the_served_document(fence: Fence) -> None:
    response = await fence.client.get("/_fence/v1/openapi.json")
    document = await json_body(response)
    base_url = str(fence.client.make_url("")).rstrip("/")
    started = time.monotonic()
    checked = await asyncio.to_thread(_run, document, base_url)
    elapsed = time.monotonic() - started
    assert len(checked) == sum(len(ops) for ops in document["paths"].values())
    assert elapsed < BUDGET_S, f"schemathesis took {elapsed:.1f} s"
