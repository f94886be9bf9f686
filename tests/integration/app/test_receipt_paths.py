"""The receipt written in one block (`finish_effect(admitted=...)`, the `receipt` block
of each backend's SQL) writes exactly what the step-by-step path writes from
core/lifecycle.py's `plan`: the same receipts, one effect through each path, leave the
same rows in effects, idempotency and effect_events. On SQLite, whose clock is the
test's (on PostgreSQL the database's clock flows between the two, so the times differ;
tests/integration/app/test_lifecycle_store.py runs both paths there)."""

from __future__ import annotations

from typing import Any

import pytest

from core.lifecycle import Event
from core.records import StoredResponse
from store import Admitted, NewEffect, Store
from tests.integration.app import backends
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import granted, new_token_hash, running_store

RESPONSE = StoredResponse(201, (("Content-Type", "application/json"),), b'{"order": 1}')
CASES = [
    ("committed", Event.ANSWERED_COMMITTED, 201, RESPONSE, "k"),
    ("committed-no-key", Event.ANSWERED_COMMITTED, 201, RESPONSE, None),
    ("committed-unkept", Event.ANSWERED_COMMITTED, 204, None, "k"),
    ("not-committed", Event.ANSWERED_NOT_COMMITTED, 409, None, "k"),
    ("not-sent", Event.NOT_SENT, None, None, "k"),
    ("lost", Event.LOST, None, None, "k"),
]
EFFECT = (
    "SELECT state, finished_at, upstream_status, reason, settled_by, next_probe_at,"
    " probe_claimed_by, probe_claimed_until, probe_attempts FROM effects WHERE id = ?"
)
KEY = (
    "SELECT fingerprint, epoch, expires_at, response_status, response_headers,"
    " response_body, settled_by FROM idempotency WHERE effect_id = ?"
)
EVENTS = (
    "SELECT at, kind, actor, upstream_status, conclusion, detail FROM effect_events"
    " WHERE effect_id = ? ORDER BY at, kind"
)


@pytest.fixture
def backend() -> Backend:
    return "sqlite"


async def _written(
    store: Store, store_url: str, resource: str, case: tuple[Any, ...], one_block: bool
) -> list[list[tuple[Any, ...]]]:
    _, event, status, response, key = case
    token = new_token_hash()
    granted(await store.acquire(resource, "w", 30, token))
    new = NewEffect("place-order", resource, key, "fp", "POST", "/orders/x", 1, 5.0, 60.0)
    decision = await store.admit(token, new)
    assert isinstance(decision, Admitted), decision
    effect = decision.effect
    admitted = effect if one_block else None
    receipt = await store.finish_effect(
        effect.id, event, status, "the upstream said so", response, admitted=admitted
    )
    found = await store.effect(effect.id)
    assert found == receipt.effect  # what the receipt answers is what it wrote
    return [await backends.rows(store_url, sql, (effect.id,)) for sql in (EFFECT, KEY, EVENTS)]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
async def test_the_one_block_receipt_writes_what_the_steps_write(
    store_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, case: tuple[Any, ...]
) -> None:
    async with running_store(store_url, clock) as store:
        blocks: list[Any] = []
        statement = store.connector.statement

        async def counted(query: str, **params: Any) -> Any:
            row = await statement(query, **params)
            blocks.append(None if row is None else bool(row["applied"]))
            return row

        stepped = await _written(store, store_url, "step", case, one_block=False)
        monkeypatch.setattr(store.connector, "statement", counted)
        in_one = await _written(store, store_url, "one", case, one_block=True)
    assert blocks == [True]  # the block ran, and wrote
    assert in_one == stepped
    assert stepped[0]  # the effect is there to compare
