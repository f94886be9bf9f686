"""What the PostgreSQL connector says when a transaction's connection breaks, through
tests/nemesis/pgrelay.py: before the COMMIT was sent, nothing was committed (the
server rolls back a transaction whose connection ended): `StoreUnavailable`. Once it
was sent, its fate is unknown: `CommitUnknown`, and an admission's `AdmissionInDoubt`
names the effect that `settle_unsent` then finds (or not) and settles NOT_SENT."""

from __future__ import annotations

import pytest

from store import AdmissionInDoubt, CommitUnknown, NewEffect, StoreUnavailable
from store.base import Tx
from tests.integration.app import backends
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import granted, new_token_hash, running_store
from tests.nemesis.pgrelay import Action, PgRelay

ADMISSION = "fenceproxy_admission_state"


@pytest.fixture
def backend() -> Backend:
    return "postgresql"


def _new(key: str) -> NewEffect:
    return NewEffect("place-order", "r", key, "fp", "POST", "/orders/x", 1, 5.0, 60.0)


async def test_a_connection_lost_before_the_commit_is_not_in_doubt(
    store_url: str, clock: FakeClock, relay: PgRelay
) -> None:
    async def cut_midway(tx: Tx) -> None:
        await tx.execute("set_resource_epoch", resource="midway", epoch=7)
        relay.cut_all()
        await tx.execute("set_resource_epoch", resource="midway", epoch=8)

    async with running_store(relay.url(store_url), clock) as store:
        with pytest.raises(StoreUnavailable) as raised:
            await store.connector.write(cut_midway)
        assert not isinstance(raised.value, CommitUnknown)
    assert (
        await backends.rows(store_url, "SELECT epoch FROM resources WHERE resource = 'midway'")
        == []
    )


@pytest.mark.parametrize("action", ["cut_after_commit", "cut_before_commit"])
async def test_a_lost_commit_answer_names_the_effect_that_settle_unsent_finds(
    store_url: str, clock: FakeClock, relay: PgRelay, action: Action
) -> None:
    async with running_store(relay.url(store_url), clock) as store:
        token = new_token_hash()
        granted(await store.acquire("r", "w", 30, token))
        fault = relay.arm(action, match=ADMISSION)
        with pytest.raises(AdmissionInDoubt) as raised:
            await store.admit(token, _new("k"))
        assert fault.wait(5.0)
        lost = raised.value
        recorded = await store.effect(lost.effect_id)
        settled = await store.settle_unsent(lost.effect_id, "r", "its answer was lost")
        if action == "cut_after_commit":
            assert recorded is not None and recorded.state.value == "DISPATCHING"
            assert settled is not None and settled.state.value == "NOT_SENT"
        else:
            assert recorded is None and settled is None
        assert (await store.effects(resource="r", state="DISPATCHING")) == []
