"""Retention of the audit trail (policy `retention:`), on SQLite and PostgreSQL.

Settled receipts go with their history and expired keys once they settled longer
ago than `effects_s`; rejections once older than `rejections_s`. An effect in doubt
or conflicting is never deleted, however old, nor one that a key still retained
points to. A pass deletes at most `batch` of each, in one transaction, whatever the
backlog; one replica at a time does it.

Time moves with the FakeClock (the store's clock on both backends); bulk records are
inserted with one INSERT ... SELECT (tests/integration/app/backends.py), not through
the API.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from core.lifecycle import Event
from core.records import EffectState, Refusal, Rejection, StoredResponse
from policies import Retention
from proxy.retention import RetentionCollector
from proxy.runtime import RUNTIME
from store import Admitted, NewEffect, Purged, Store, StoreError
from tests.integration.app import backends
from tests.integration.app.conftest import FakeClock, FenceFactory, poll_until
from tests.integration.app.test_store_contract import granted, new_token_hash, running_store

DAY = 86400.0
KEEP = Retention(effects_s=30 * DAY, rejections_s=7 * DAY, batch=1000)
RESPONSE = StoredResponse(201, (("Content-Type", "application/json"),), b'{"order": 1}')


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[Store]:
    async with running_store(store_url, clock) as opened:
        yield opened


def order(resource: str, key: str | None, retain_s: float = 60.0) -> NewEffect:
    return NewEffect(
        route="place-order",
        resource=resource,
        idempotency_key=key,
        fingerprint=f"fp-{resource}-{key}",
        method="POST",
        path=f"/orders/{resource}",
        max_in_flight=1,
        upstream_timeout_s=5.0,
        retain_s=retain_s,
    )


async def dispatched(store: Store, resource: str, key: str | None, retain_s: float = 60.0) -> str:
    """A fresh lease on `resource` and one admitted effect under it (DISPATCHING)."""
    token = new_token_hash()
    granted(await store.acquire(resource, "worker-a", 60, token))
    decision = await store.admit(token, order(resource, key, retain_s))
    assert isinstance(decision, Admitted), decision
    return decision.effect.id


async def settled(
    store: Store, resource: str, event: Event, key: str | None = None, retain_s: float = 60.0
) -> str:
    effect_id = await dispatched(store, resource, key, retain_s)
    response = RESPONSE if event is Event.ANSWERED_COMMITTED else None
    status = {Event.ANSWERED_COMMITTED: 201, Event.ANSWERED_NOT_COMMITTED: 409}.get(event)
    receipt = await store.finish_effect(effect_id, event, status, "receipt", response)
    assert receipt.effect.state not in (EffectState.DISPATCHING, EffectState.UNKNOWN)
    return effect_id


async def refused(store: Store, resource: str) -> None:
    await store.record_rejection(Rejection("stale_epoch", "POST", "/orders/x", resource=resource))
    await store.flush_refusal_counts()


async def effect_ids(store_url: str) -> set[str]:
    return {str(row[0]) for row in await backends.rows(store_url, "SELECT id FROM effects")}


async def event_owners(store_url: str) -> set[str]:
    return {
        str(row[0]) for row in await backends.rows(store_url, "SELECT effect_id FROM effect_events")
    }


async def key_owners(store_url: str) -> set[str]:
    return {
        str(row[0]) for row in await backends.rows(store_url, "SELECT effect_id FROM idempotency")
    }


async def rejected_resources(store_url: str) -> list[str]:
    rows = await backends.rows(store_url, "SELECT resource FROM refusals ORDER BY last_seen")
    return [str(row[0]) for row in rows]


# --- what goes and what stays --------------------------------------------------------------


async def test_old_settled_effects_and_rejections_go_with_their_history_and_keys(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    committed = await settled(store, "r:committed", Event.ANSWERED_COMMITTED, key="k-1")
    not_committed = await settled(store, "r:not-committed", Event.ANSWERED_NOT_COMMITTED, "k-2")
    not_sent = await settled(store, "r:not-sent", Event.NOT_SENT)
    # Settled by a probe after a lost answer: it has a history of events.
    probed = await dispatched(store, "r:probed", "k-3")
    await store.finish_effect(probed, Event.LOST, None, "response lost", None)
    await store.record_probe(probed, Event.PROBE_COMMITTED, 200, "found", None)
    await refused(store, "r:old")
    assert await event_owners(store_url) == {probed}
    assert await key_owners(store_url) == {committed, probed}

    clock.advance(31 * DAY)
    recent = await settled(store, "r:recent", Event.ANSWERED_COMMITTED, key="k-4")
    await refused(store, "r:recent")

    purged = await store.apply_retention(KEEP)

    # Their leases expired 31 days ago too, and then nothing referred to their resources.
    assert purged == Purged(effects=4, rejections=1, leases=4, resources=4)
    assert await effect_ids(store_url) == {recent}
    assert await event_owners(store_url) == set()
    assert await key_owners(store_url) == {recent}  # the old keys had expired (retain_s 60)
    assert await rejected_resources(store_url) == ["r:recent"]
    assert await store.effect(committed) is None
    assert {not_committed, not_sent}.isdisjoint(await effect_ids(store_url))
    # Nothing more is due.
    assert await store.apply_retention(KEEP) == Purged(0, 0)


async def test_a_receipt_for_a_deleted_effect_is_refused_and_recreates_nothing(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    effect_id = await settled(store, "r:a", Event.ANSWERED_COMMITTED, key="k-1")
    clock.advance(31 * DAY)
    assert await store.apply_retention(KEEP) == Purged(1, 0, leases=1, resources=1)

    # A proxy that stalled for longer than the retention wakes with its receipt.
    with pytest.raises(StoreError, match="no longer in the store"):
        await store.finish_effect(effect_id, Event.ANSWERED_COMMITTED, 201, "late", RESPONSE)
    assert await effect_ids(store_url) == set()
    assert await key_owners(store_url) == set()


async def test_rejections_go_on_their_own_horizon(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    effect_id = await settled(store, "r:a", Event.ANSWERED_COMMITTED, key="k-1")
    await refused(store, "r:a")
    clock.advance(8 * DAY)  # past 7 days of rejections, inside 30 days of effects

    assert await store.apply_retention(KEEP) == Purged(effects=0, rejections=1)
    assert await effect_ids(store_url) == {effect_id}
    assert await rejected_resources(store_url) == []


async def test_effects_in_doubt_or_conflicting_stay_however_old(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    in_flight = await dispatched(store, "r:dispatching", "k-1")
    unknown = await dispatched(store, "r:unknown", "k-2")
    await store.finish_effect(unknown, Event.LOST, None, "response lost", None)
    # A probe found it committed, then the stalled dispatch's own receipt said "not sent".
    conflicting = await dispatched(store, "r:conflicting", "k-3")
    await store.finish_effect(conflicting, Event.LOST, None, "response lost", None)
    await store.record_probe(conflicting, Event.PROBE_COMMITTED, 200, "found", None)
    await store.finish_effect(conflicting, Event.NOT_SENT, None, "refused", None)
    assert await store.effect(conflicting) is not None
    states = {e.id: e.state for e in await store.effects(limit=10)}
    assert states == {
        in_flight: EffectState.DISPATCHING,
        unknown: EffectState.UNKNOWN,
        conflicting: EffectState.CONFLICTING,
    }
    # UNKNOWN and CONFLICTING effects have a finished_at too: only their state saves them.
    finished = await backends.rows(
        store_url, "SELECT count(*) FROM effects WHERE finished_at IS NOT NULL"
    )
    assert finished == [(2,)]

    clock.advance(10 * 365 * DAY)
    # Their leases go; their resources stay with them (resource_rows_stay_... below).
    assert await store.apply_retention(Retention(1.0, 1.0, 1000)) == Purged(0, 0, leases=3)

    assert await effect_ids(store_url) == {in_flight, unknown, conflicting}
    assert await event_owners(store_url) == {unknown, conflicting}
    assert await key_owners(store_url) == {in_flight, unknown, conflicting}


async def test_an_old_unknown_seeded_in_bulk_stays_while_settled_ones_go(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    long_ago = await store.now() - 100 * DAY
    for state in ("DISPATCHING", "UNKNOWN", "CONFLICTING"):
        await backends.seed_settled_effects(
            store_url, 50, finished_at=long_ago, prefix=f"eff_{state.lower()}_", state=state
        )
    await backends.seed_settled_effects(store_url, 50, finished_at=long_ago, prefix="eff_old_")

    assert await store.apply_retention(KEEP) == Purged(50, 0)
    assert await backends.count(store_url, "effects") == 150
    assert await backends.count(store_url, "effects", "state = 'COMMITTED'") == 0


async def test_a_key_still_retained_keeps_its_effect(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    # A key kept for 40 days after settlement, under 30 days of effect retention (the
    # policy refuses that combination; the store must hold whatever it is given).
    effect_id = await settled(store, "r:a", Event.ANSWERED_COMMITTED, key="k-1", retain_s=40 * DAY)
    clock.advance(31 * DAY)

    assert await store.apply_retention(KEEP) == Purged(0, 0, leases=1)
    assert await effect_ids(store_url) == {effect_id}
    assert await key_owners(store_url) == {effect_id}
    # It still replays.
    token = new_token_hash()
    granted(await store.acquire("r:a", "worker-b", 60, token))
    replay = await store.admit(token, order("r:a", "k-1", 40 * DAY))
    assert not isinstance(replay, Admitted | Refusal), replay

    clock.advance(10 * DAY)  # the key's 40 days are over
    assert await store.apply_retention(KEEP) == Purged(effects=1, rejections=0)
    assert await effect_ids(store_url) == set()
    assert await key_owners(store_url) == set()


async def test_a_key_without_expiry_keeps_its_effect(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    now = await store.now()
    await backends.seed_settled_effects(
        store_url, 20, finished_at=now - 40 * DAY, every=2, key_expires_at=now + DAY
    )
    await backends.execute(store_url, "UPDATE idempotency SET expires_at = NULL")

    # The ten with a record (kept until further notice) stay; the other ten go.
    assert await store.apply_retention(KEEP) == Purged(10, 0)
    assert await backends.count(store_url, "effects") == 10
    assert await key_owners(store_url) == await effect_ids(store_url)


async def test_zero_keeps_forever(store: Store, store_url: str, clock: FakeClock) -> None:
    long_ago = await store.now() - 100 * 365 * DAY
    await backends.seed_settled_effects(store_url, 30, finished_at=long_ago)
    await backends.seed_refusals(store_url, 30, at=long_ago)

    assert await store.apply_retention(Retention(0, 0, 1000)) == Purged(0, 0)
    assert await store.apply_retention(Retention(0, 7 * DAY, 1000)) == Purged(0, 30)
    assert await backends.count(store_url, "effects") == 30
    assert await store.apply_retention(Retention(30 * DAY, 0, 1000)) == Purged(30, 0)


# --- bounded passes ------------------------------------------------------------------------


async def test_a_pass_deletes_at_most_a_batch_and_the_collector_repeats_passes(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    long_ago = await store.now() - 60 * DAY
    await backends.seed_settled_effects(
        store_url, 25, finished_at=long_ago, every=1, key_expires_at=long_ago + 60
    )
    await backends.seed_refusals(store_url, 25, at=long_ago)
    small = Retention(30 * DAY, 7 * DAY, batch=10)

    assert await store.apply_retention(small) == Purged(10, 10)
    assert await backends.count(store_url, "effects") == 15
    assert await backends.count(store_url, "effect_events") == 15
    assert await backends.count(store_url, "idempotency") == 15
    assert await backends.count(store_url, "refusals") == 15

    # The collector goes on while a pass deleted a full batch: 10, then 5 (not full).
    deleted: list[Purged] = []
    collector = RetentionCollector(store, small, on_deleted=deleted.append)
    assert await collector.collect() == (Purged(15, 15), 2)
    assert deleted == [Purged(10, 10), Purged(5, 5)]
    assert await backends.count(store_url, "effects") == 0
    assert await backends.count(store_url, "effect_events") == 0
    assert await backends.count(store_url, "idempotency") == 0
    assert await backends.count(store_url, "refusals") == 0


async def test_one_pass_over_a_hundred_thousand_old_effects_deletes_one_batch(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    many = 100_000
    long_ago = await store.now() - 60 * DAY
    await backends.seed_settled_effects(
        store_url, many, finished_at=long_ago, key_expires_at=long_ago + 60
    )
    await backends.seed_refusals(store_url, many, at=long_ago)
    events_before = await backends.count(store_url, "effect_events")
    assert events_before == many // 10

    purged = await store.apply_retention(KEEP)

    # One transaction, one batch of each, whatever the backlog: the oldest thousand.
    assert purged == Purged(KEEP.batch, KEEP.batch)
    assert await backends.count(store_url, "effects") == many - KEEP.batch
    assert await backends.count(store_url, "refusals") == many - KEEP.batch
    assert await backends.count(store_url, "effect_events") == events_before - KEEP.batch // 10
    assert await backends.count(store_url, "idempotency") == (many - KEEP.batch) // 10


async def test_two_replicas_collecting_at_once_delete_each_record_once(
    store_url: str, clock: FakeClock
) -> None:
    many = 2000
    async with (
        running_store(store_url, clock, instance_id="replica-1") as one,
        running_store(store_url, clock, instance_id="replica-2") as two,
    ):
        long_ago = await one.now() - 60 * DAY
        await backends.seed_settled_effects(
            store_url, many, finished_at=long_ago, key_expires_at=long_ago + 60
        )
        await backends.seed_refusals(store_url, many, at=long_ago)
        small = Retention(30 * DAY, 7 * DAY, batch=100)

        every_pass: list[Purged] = []

        async def passes(store: Store) -> None:
            # A pass that finds another replica's pass running deletes nothing: go on
            # until everything is gone (bounded, should the total never add up).
            for _ in range(2000):
                if sum(p.effects for p in every_pass) >= many:
                    return
                every_pass.append(await store.apply_retention(small))

        await asyncio.gather(passes(one), passes(two), passes(one), passes(two))

    assert all(p.effects <= 100 and p.rejections <= 100 for p in every_pass)
    assert sum(p.effects for p in every_pass) == many
    assert sum(p.rejections for p in every_pass) == many
    for table in ("effects", "effect_events", "idempotency", "refusals"):
        assert await backends.count(store_url, table) == 0, table


# --- the collector in the app ----------------------------------------------------------------


async def test_the_app_collects_old_receipts_and_counts_them(make_fence: FenceFactory) -> None:
    fence = await make_fence()
    lease = await fence.acquire("supplier:widget", "worker-a", ttl_s=30)
    assert (await fence.order("widget", lease["token"], "k-1")).status == 201
    await fence.order("widget", "fpt_" + "x" * 43, "k-2")  # refused and recorded
    assert len(await fence.effects()) == 1
    assert len(await fence.rejections()) == 1

    fence.clock.advance(31 * 86400)
    collector = fence.app[RUNTIME].retention
    assert collector is not None
    collector.wake.set()

    async def collected() -> bool:
        text = await (await fence.client.get("/_fence/metrics")).text()
        return 'fenceproxy_retention_deleted_total{record="effects"} 1.0' in text

    await poll_until(collected, "the old receipt to be collected")
    assert await fence.effects() == []
    assert await fence.rejections() == []


async def test_the_retention_collector_survives_an_unexpected_failure(
    make_fence: FenceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    fence = await make_fence()
    collector = fence.app[RUNTIME].retention
    assert collector is not None
    real = fence.store.apply_retention
    calls: list[str] = []

    async def failing_once(retention: Retention) -> Purged:
        calls.append("pass")
        if len(calls) == 1:
            raise RuntimeError("an unexpected bug in one pass")
        return await real(retention)

    monkeypatch.setattr(fence.store, "apply_retention", failing_once)
    collector.wake.set()

    async def counted() -> bool:
        text = await (await fence.client.get("/_fence/metrics")).text()
        return 'fenceproxy_background_failures_total{loop="retention"} 1.0' in text

    await poll_until(counted, "the failed round to be counted")
    collector.wake.set()  # cut the back-off short

    async def ran_again() -> bool:
        return len(calls) >= 2

    await poll_until(ran_again, "the collector to run again")
