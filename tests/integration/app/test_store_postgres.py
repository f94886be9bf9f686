"""What only the PostgreSQL store has: several replicas deciding on one database, and
one clock for all of them, the database's.

Each "replica" is a Store of its own (its own connection pool) on the test's schema,
as separate proxy processes would be. Races are started with asyncio.gather over both
stores, many resources at once, so the database sees truly concurrent transactions.
The contract both backends share is in test_store_contract.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import asyncpg
import pytest

from core.fencing import Replay
from core.lifecycle import Event
from core.records import EffectRecord, EffectState, Refusal
from policies.model import StorePool
from store import Admitted, NewEffect, Store, StoreUnavailable, UnknownKey, open_store
from store.history import NOTICE
from store.postgres import PostgresConnector, StoreConnection, store_connection_of
from store.queries import load_migrations
from store.types import DEFAULT_RETAIN_S
from tests.integration.app import backends
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import (
    AcquireResult,
    acquire,
    granted,
    new_token_hash,
    running_store,
)

AdmitResult = Admitted | Replay | Refusal | UnknownKey


@pytest.fixture
def backend() -> Backend:
    return "postgresql"


@pytest.fixture
async def replicas(store_url: str, clock: FakeClock) -> AsyncIterator[tuple[Store, Store]]:
    """Two replicas of the authority on one database, each with its own pool."""
    async with (
        running_store(store_url, clock, instance_id="replica-1") as one,
        running_store(store_url, clock, instance_id="replica-2") as two,
    ):
        yield one, two


def new_effect(resource: str, key: str) -> NewEffect:
    return NewEffect(
        route="place-order",
        resource=resource,
        idempotency_key=key,
        fingerprint=f"fp-{key}",
        method="POST",
        path=f"/orders/{key}",
        max_in_flight=1,
        upstream_timeout_s=1.0,
        retain_s=60,
    )


async def leased(store: Store, resource: str, holder: str = "w", ttl_s: float = 30) -> str:
    """Acquire `resource` through `store`; returns the lease's token hash."""
    token_hash = new_token_hash()
    granted(await store.acquire(resource, holder, ttl_s, token_hash))
    return token_hash


async def unknown_effect(store: Store, resource: str) -> str:
    """An effect on `resource` whose outcome is unknown (its answer was lost)."""
    token_hash = await leased(store, resource)
    admitted = await store.admit(token_hash, new_effect(resource, f"k-{resource}"))
    assert isinstance(admitted, Admitted), admitted
    effect_id = admitted.effect.id
    await store.finish_effect(effect_id, Event.LOST, None, "response lost", None)
    effect = await store.effect(effect_id)
    assert effect is not None and effect.state is EffectState.UNKNOWN
    return effect_id


async def test_two_replicas_race_for_one_lease_and_exactly_one_wins(
    replicas: tuple[Store, Store], clock: FakeClock, store_url: str
) -> None:
    epochs: list[int] = []
    for _ in range(3):
        attempts = [
            acquire(store, "shared", holder=f"{n}") for n in range(25) for store in replicas
        ]
        results: list[AcquireResult] = await asyncio.gather(*attempts)

        grants = [granted(r) for r in results if not isinstance(r, Refusal)]
        assert len(grants) == 1, grants
        assert {r.code for r in results if isinstance(r, Refusal)} == {"lease_held"}
        epochs.append(grants[0].epoch)
        for store in replicas:
            view = await store.lease_view("shared")
            assert (view.epoch, view.holder, view.live) == (grants[0].epoch, grants[0].holder, True)
        clock.advance(31)  # the lease expires, for both replicas at once

    assert epochs == [1, 2, 3]
    rows = await backends.rows(
        store_url, "SELECT epoch FROM leases WHERE resource = ?", ("shared",)
    )
    assert sorted(epoch for (epoch,) in rows) == [1, 2, 3]


async def test_admissions_under_two_epochs_never_both_succeed(
    replicas: tuple[Store, Store], store_url: str
) -> None:
    """Replica 1 admits a write under the current lease while replica 2 revokes it,
    takes a new lease and admits a write under that. Whatever the interleaving,
    exactly one of the two writes is admitted: the old holder's before the revoke
    (and the successor is then refused, the resource being busy with it), or the
    successor's (and the old holder's is stale)."""
    one, two = replicas
    resources = [f"race:{i}" for i in range(30)]
    old_tokens = [await leased(one, resource, "old") for resource in resources]

    async def old_holder(resource: str, token_hash: str) -> AdmitResult:
        return await one.admit(token_hash, new_effect(resource, "old"))

    async def successor(resource: str) -> AcquireResult | AdmitResult:
        await two.revoke(resource, "takeover")
        token_hash = new_token_hash()
        lease = await two.acquire(resource, "new", 30, token_hash)
        if isinstance(lease, Refusal):
            return lease
        return await two.admit(token_hash, new_effect(resource, "new"))

    outcomes = await asyncio.gather(
        *(old_holder(r, t) for r, t in zip(resources, old_tokens, strict=True)),
        *(successor(r) for r in resources),
    )
    old_results, new_results = outcomes[: len(resources)], outcomes[len(resources) :]

    for resource, old, new in zip(resources, old_results, new_results, strict=True):
        admitted = [r for r in (old, new) if isinstance(r, Admitted)]
        assert len(admitted) == 1, (resource, old, new)
        if isinstance(old, Admitted):
            assert isinstance(new, Refusal) and new.code == "resource_blocked", (resource, new)
            assert old.effect.epoch == 1
        else:
            assert isinstance(old, Refusal) and old.code == "stale_epoch", (resource, old)
            assert isinstance(new, Admitted) and new.effect.epoch == 3
    # The records agree: one write in flight per resource, never two.
    rows = await backends.rows(
        store_url, "SELECT resource, COUNT(*) FROM effects GROUP BY resource ORDER BY resource"
    )
    assert rows == [(resource, 1) for resource in sorted(resources)]


@pytest.mark.parametrize(
    ("same_key", "refused_as"), [(False, "effect_in_flight"), (True, "request_in_progress")]
)
async def test_one_holder_writing_through_both_replicas_at_once_gets_one_write_in_flight(
    replicas: tuple[Store, Store], same_key: bool, refused_as: str
) -> None:
    """max_in_flight 1 holds across replicas: of 20 simultaneous writes under one lease
    (different keys, or the same key retried), exactly one is admitted."""
    one, _ = replicas
    token_hash = await leased(one, "busy")
    attempts = [
        store.admit(token_hash, new_effect("busy", "k" if same_key else f"k-{n}-{i}"))
        for n in range(10)
        for i, store in enumerate(replicas)
    ]
    results: list[AdmitResult] = await asyncio.gather(*attempts)

    admitted = [r for r in results if isinstance(r, Admitted)]
    assert len(admitted) == 1, results
    assert {r.code for r in results if isinstance(r, Refusal)} == {refused_as}
    in_flight = await one.effects(resource="busy", state="DISPATCHING")
    assert [e.id for e in in_flight] == [admitted[0].effect.id]


async def test_two_replicas_resolving_one_effect_settle_it_once(
    replicas: tuple[Store, Store], store_url: str
) -> None:
    one, two = replicas
    effect_ids = [await unknown_effect(one, f"doubt:{i}") for i in range(10)]

    outcomes = await asyncio.gather(
        *(one.resolve(e, EffectState.COMMITTED, "found it", "alice") for e in effect_ids),
        *(two.resolve(e, EffectState.NOT_COMMITTED, "not there", "bob") for e in effect_ids),
    )

    for index, effect_id in enumerate(effect_ids):
        pair = (outcomes[index], outcomes[index + len(effect_ids)])
        settled = [r for r in pair if isinstance(r, EffectRecord)]
        refused = [r for r in pair if isinstance(r, Refusal)]
        assert len(settled) == 1 and len(refused) == 1, pair
        assert refused[0].code == "effect_settled"
        winner = settled[0]
        assert winner.state in (EffectState.COMMITTED, EffectState.NOT_COMMITTED)
        stored = await two.effect(effect_id)
        assert stored is not None
        assert (stored.state, stored.settled_by) == (winner.state, winner.settled_by)
        events = await backends.rows(
            store_url,
            "SELECT actor FROM effect_events WHERE effect_id = ? AND kind = 'resolve'",
            (effect_id,),
        )
        assert events == [(winner.settled_by,)]


async def test_probe_claims_never_overlap_across_replicas(
    replicas: tuple[Store, Store], clock: FakeClock
) -> None:
    one, two = replicas
    effect_ids = {await unknown_effect(one, f"probe:{i}") for i in range(20)}

    claims = await asyncio.gather(
        *(store.claim_due_probes(limit=4, claim_s=30) for _ in range(4) for store in replicas)
    )

    claimed = [effect.id for batch in claims for effect in batch]
    assert len(claimed) == len(set(claimed)), "an effect was claimed twice"
    assert set(claimed) == effect_ids  # 8 claims of 4: every due effect, once
    assert await one.claim_due_probes(limit=20, claim_s=30) == []
    assert await two.claim_due_probes(limit=20, claim_s=30) == []
    # A replica that died holding claims: once they run out, the effects are due again.
    clock.advance(31)
    again = await asyncio.gather(*(store.claim_due_probes(20, 30) for store in replicas))
    reclaimed = [effect.id for batch in again for effect in batch]
    assert sorted(reclaimed) == sorted(effect_ids)


async def test_two_replicas_sweeping_at_once_turn_each_overdue_effect_unknown_once(
    replicas: tuple[Store, Store], clock: FakeClock, store_url: str
) -> None:
    """Both replicas' background sweeps find the same overdue DISPATCHING effects (a
    third replica died with them in flight): each effect becomes UNKNOWN once, with
    one "recover" decision in its history, claimed by one sweeper."""
    one, two = replicas
    effect_ids = set()
    for i in range(20):
        resource = f"sweep:{i}"
        admitted = await one.admit(await leased(one, resource), new_effect(resource, "k"))
        assert isinstance(admitted, Admitted), admitted
        effect_ids.add(admitted.effect.id)
    clock.advance(1.0 + 2.0 + 0.5)  # past every deadline (1 s) + margin (2 s)

    for _ in range(3):  # a few rounds, as the sweeps of live replicas would run
        swept = await asyncio.gather(one.recover(None, 2.0), two.recover(None, 2.0))
        if any(swept):
            break
    first, second = swept
    assert set(first) | set(second) == effect_ids
    events = await backends.rows(
        store_url,
        "SELECT effect_id, COUNT(*) FROM effect_events WHERE kind = 'recover' GROUP BY effect_id",
    )
    recorded = sorted(count for _, count in events)
    assert recorded == [1] * len(effect_ids), f"recover events per effect: {recorded}"
    both = set(first) & set(second)
    assert not both, f"both replicas report sweeping {len(both)} of the same effects"
    for effect_id in effect_ids:
        effect = await two.effect(effect_id)
        assert effect is not None and effect.state is EffectState.UNKNOWN


async def test_lease_expiry_is_judged_by_the_database_clock(
    store_url: str, clock: FakeClock
) -> None:
    # Each replica is given a Python clock that disagrees wildly with the other's and
    # with the database's: on PostgreSQL neither is read.
    early, late = FakeClock(start=0.0), FakeClock(start=4e9)
    async with (
        running_store(store_url, early, instance_id="replica-early") as one,
        running_store(store_url, late, instance_id="replica-late") as two,
    ):
        token_hash = new_token_hash()
        result = await one.acquire("r", "a", 5, token_hash)
        assert not isinstance(result, Refusal), result
        lease, granted_at = result
        db_now = await two.now()
        assert granted_at == pytest.approx(db_now, abs=clock.tolerance)
        assert lease.expires_at == granted_at + 5

        early.advance(3600)  # a replica's own clock jumping forward changes nothing
        late.advance(3600)
        held = await two.acquire("r", "b", 5, new_token_hash())
        assert isinstance(held, Refusal) and held.code == "lease_held"
        assert (await one.lease_view("r")).live and (await two.lease_view("r")).live

        clock.advance(5.5)  # the database's clock: store_meta.clock_offset_s
        assert await two.now() >= lease.expires_at
        assert not (await one.lease_view("r")).live
        assert not (await two.lease_view("r")).live
        renewed = await one.renew(token_hash, 5)
        assert isinstance(renewed, Refusal) and renewed.code == "lease_expired"
        successor = granted(await two.acquire("r", "b", 5, new_token_hash()))
        assert successor.epoch == 2


async def test_replicas_starting_together_migrate_a_fresh_database_once(
    store_url: str, clock: FakeClock
) -> None:
    stores = [open_store(store_url, clock, f"replica-{n}") for n in range(3)]
    await asyncio.gather(*(store.open() for store in stores))
    try:
        results = await asyncio.gather(*(acquire(store, "r") for store in stores))
        assert sum(not isinstance(r, Refusal) for r in results) == 1
    finally:
        await asyncio.gather(*(store.close() for store in stores))
    shipped = [(version, name) for version, name, _ in load_migrations("postgresql")]
    recorded = await backends.rows(
        store_url, "SELECT version, name FROM schema_migrations ORDER BY version"
    )
    assert recorded == shipped


async def test_fence_restore_never_lowers_an_epoch_another_replica_is_raising(
    store_url: str, clock: FakeClock
) -> None:
    """A replica raises a resource's epoch between fence-restore's read of the highest
    epoch and its write (forced: the replica holds the resource's row lock, as an
    acquire does, until fence-restore waits on it). The restore must land above what
    the replica issued, never set the resource back under it."""
    async with running_store(store_url, clock, instance_id="restorer") as restorer:
        await leased(restorer, "r")  # epoch 1
        replica = await asyncpg.connect(store_url)
        try:
            async with replica.transaction():
                # What an acquire does: the row lock first, then the new epoch.
                await replica.execute("UPDATE resources SET epoch = epoch WHERE resource = 'r'")
                restore = asyncio.create_task(restorer.fence_restore(1))
                await _until_waiting_on_a_lock(replica, restore)
                await replica.execute("UPDATE resources SET epoch = 5 WHERE resource = 'r'")
            floor = await restore
        finally:
            await replica.close()
        view = await restorer.lease_view("r")
        assert floor > 5
        assert view.next_epoch > 5, view


async def _until_waiting_on_a_lock(
    observer: asyncpg.Connection, task: asyncio.Task[object]
) -> None:
    """Bounded polling: until another session of this database waits on a lock."""
    for _ in range(500):
        assert not task.done(), "fence-restore finished without waiting on the row lock"
        waiting = await observer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("fence-restore never waited on the row lock")


async def _receipt(
    conn: asyncpg.Connection, store_id: str, effect: EffectRecord, key: str
) -> asyncpg.Record:
    """The one-statement receipt of a 200 that commits `effect` and its key."""
    row = await conn.fetchrow(
        "SELECT * FROM fenceproxy_receipt($1, $2, $3, 'DISPATCHING', 'COMMITTED', 200,"
        " 'answered 200', false, 'commit', $4, $5, $6, 86400.0, 200, '{}', 'ok'::bytea,"
        " NULL, 'dispatch', 'test', NULL)",
        store_id,
        effect.id,
        effect.resource,
        key,
        effect.fingerprint,
        effect.epoch,
    )
    assert row is not None
    return row


async def test_a_receipt_locks_its_resource_without_writing_a_row_version(
    replicas: tuple[Store, Store], store_url: str
) -> None:
    """The receipt takes its resource's lock as the admission does: a row version per
    fenced write would be written (and its WAL) for a row that does not change."""
    one, _ = replicas
    token_hash = await leased(one, "quiet")
    admitted = await one.admit(token_hash, new_effect("quiet", "k-quiet"))
    assert isinstance(admitted, Admitted), admitted
    conn = await asyncpg.connect(store_url)
    try:
        store_id = await conn.fetchval("SELECT store_id FROM store_identity")
        version = "SELECT xmin::text FROM resources WHERE resource = 'quiet'"
        before = await conn.fetchval(version)
        row = await _receipt(conn, store_id, admitted.effect, "k-quiet")
        assert row["applied"] is True
        assert await conn.fetchval(version) == before
        committed = await conn.fetchrow(
            "SELECT e.state, i.expires_at FROM effects e JOIN idempotency i"
            " ON i.effect_id = e.id WHERE e.id = $1",
            admitted.effect.id,
        )
        assert committed is not None and committed["state"] == "COMMITTED"
        assert committed["expires_at"] is not None
    finally:
        await conn.close()


async def test_a_receipt_for_another_store_writes_nothing(
    replicas: tuple[Store, Store], store_url: str
) -> None:
    """Not even the lock's row of a resource the store never had."""
    one, _ = replicas
    token_hash = await leased(one, "mine")
    admitted = await one.admit(token_hash, new_effect("mine", "k-mine"))
    assert isinstance(admitted, Admitted), admitted
    stranger = dataclasses.replace(admitted.effect, resource="never-seen")
    conn = await asyncpg.connect(store_url)
    try:
        store_id = await conn.fetchval("SELECT store_id FROM store_identity")
        row = await _receipt(conn, "another-store", stranger, "k-mine")
        assert (row["store_id"], row["now"], row["applied"]) == (store_id, None, False)
        assert (
            await conn.fetchval("SELECT count(*) FROM resources WHERE resource = 'never-seen'") == 0
        )
        assert (
            await conn.fetchval("SELECT state FROM effects WHERE id = $1", admitted.effect.id)
            == "DISPATCHING"
        )
    finally:
        await conn.close()


async def test_a_session_that_hides_notices_still_tells_its_history(
    store_url: str, clock: FakeClock
) -> None:
    """Every transaction's history position rides on a notice: connections whose
    client_min_messages hides notices (warning, as a role or a database may set it)
    still hear it, so their transactions are checked, not refused for telling nothing."""
    async with running_store(store_url, clock, query="&client_min_messages=warning") as store:
        token_hash = await leased(store, "hushed")
        admitted = await store.admit(token_hash, new_effect("hushed", "k-hushed"))
        assert isinstance(admitted, Admitted), admitted
        receipt = await store.finish_effect(
            admitted.effect.id,
            Event.ANSWERED_COMMITTED,
            200,
            "upstream answered 200",
            None,
            admitted=admitted.effect,
        )
        assert receipt.effect.state is EffectState.COMMITTED


async def test_asyncpg_hands_every_notice_to_the_store_connection(
    store_url: str, clock: FakeClock
) -> None:
    """The history position is kept by overriding a private method of asyncpg's
    connection (store/postgres.py says why): this fails if asyncpg stops calling it.
    Any other notice still reaches the connection's log listeners."""
    async with running_store(store_url, clock):
        pass  # the schema, with fenceproxy_history_position()
    conn = await asyncpg.connect(store_url, connection_class=StoreConnection)
    heard: list[str] = []
    try:
        conn.add_log_listener(lambda _conn, message: heard.append(message.message))
        await conn.execute("SELECT fenceproxy_history_position()")
        told = conn.take_told()
        assert told is not None
        judged, kept = told
        assert judged.timeline == kept.timeline >= 1 and judged.lsn >= kept.lsn > 0
        assert conn.take_told() is None
        await conn.execute("DO $$ BEGIN RAISE NOTICE 'another notice'; END $$")
        assert conn.take_told() is None
        for _ in range(100):  # a log listener is called soon, not at once
            if heard:
                break
            await asyncio.sleep(0.01)
        assert heard == ["another notice"]
    finally:
        await conn.close()


async def test_a_position_heard_before_a_begin_never_stands_in_for_its_own(
    store_url: str, clock: FakeClock
) -> None:
    """A position the connection heard before a transaction (here: a notice raised
    outside one, far ahead of any real position) is cleared when the BEGIN is sent: a
    BEGIN that tells nothing is refused, not judged on what an earlier message told."""
    store = open_store(store_url, clock, "instance-1", StorePool(1, 1))
    await store.open()
    try:
        await leased(store, "told")
        connector = store.connector
        assert isinstance(connector, PostgresConnector) and connector._pool is not None
        async with connector._pool.acquire() as conn:
            walfile = await conn.fetchval("SELECT pg_walfile_name(pg_current_wal_flush_lsn())")
            await conn.execute(
                "DO $$ BEGIN RAISE NOTICE '%', "
                f"'{NOTICE}{walfile} FF/FFFFFFF0 FF/FFFFFFF0 4000000000 0'; END $$"
            )
            assert store_connection_of(conn).told is not None
            await conn.execute(
                "CREATE OR REPLACE FUNCTION fenceproxy_history_position() RETURNS void"
                " LANGUAGE sql AS 'SELECT'"
            )
        with pytest.raises(StoreUnavailable, match="did not tell its WAL position"):
            await leased(store, "told-again")
    finally:
        await store.close()


# A key row before the commit: none, or held by the receipt's own effect or another one,
# with or without a response kept. The commit: a response or none, settled by nobody or
# by someone, on an effect with or without its own retain_s.
PRIOR_KEYS = (None, ("e-own", None), ("e-own", 201), ("e-other", None), ("e-other", 202))
COMMITS = ((200, None), (None, "operator"))
RETAINS = (None, 60.0)
KEY_ROW = (
    "SELECT fingerprint, effect_id, epoch, expires_at, response_status, response_headers,"
    " response_body, settled_by FROM idempotency WHERE resource = 'r' AND key = 'k'"
)


async def _effect_and_key(
    conn: asyncpg.Connection, retain_s: float | None, prior: tuple[str, int | None] | None
) -> None:
    for effect_id in ("e-own", "e-other"):
        await conn.execute(
            "INSERT INTO effects (id, route, resource, holder, epoch, idempotency_key,"
            " fingerprint, method, path, state, instance_id, created_at, deadline, retain_s)"
            " VALUES ($1, 'route', 'r', 'w', 3, 'k', 'fp-' || $1, 'POST', '/', 'DISPATCHING',"
            " 'i', 1.0, 2.0, $2)",
            effect_id,
            retain_s,
        )
    if prior is not None:
        holder, status = prior
        await conn.execute(
            "INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at,"
            " response_status, response_headers, response_body, settled_by)"
            " VALUES ('r', 'k', 'fp-old', $1, 2, NULL, $2::int,"
            " CASE WHEN $2::int IS NOT NULL THEN 'old headers' END,"
            " CASE WHEN $2::int IS NOT NULL THEN 'old body'::bytea END, 'sweep')",
            holder,
            status,
        )


async def test_the_receipts_key_commit_is_the_key_commit_functions(
    store_url: str, clock: FakeClock
) -> None:
    """fenceproxy_receipt writes the key commit's upsert itself (migration 0022: a call
    fewer per write) instead of calling fenceproxy_commit_key, which the step-by-step
    receipt calls. From the same rows, every branch of the upsert (no key row; the
    effect's own, with and without a kept response; another effect's), with a response
    or none, leaves the same key row either way, its expiry as store/steps.py computes
    it for the step-by-step path."""
    async with running_store(store_url, clock):
        pass  # the schema
    conn = await asyncpg.connect(store_url)
    try:
        store_id = await conn.fetchval("SELECT store_id FROM store_identity")
        for prior in PRIOR_KEYS:
            for status, settled_by in COMMITS:
                for retain_s in RETAINS:
                    response = (status, "new headers", b"new body") if status else (None,) * 3
                    written = []
                    for path in ("receipt", "commit_key"):
                        transaction = conn.transaction()
                        await transaction.start()
                        await _effect_and_key(conn, retain_s, prior)
                        if path == "receipt":
                            row = await conn.fetchrow(
                                "SELECT * FROM fenceproxy_receipt($1, 'e-own', 'r',"
                                " 'DISPATCHING', 'COMMITTED', 200, 'answered', false, 'commit',"
                                " 'k', 'fp-new', 3, $2, $3, $4, $5, $6, 'dispatch', 'test', NULL)",
                                store_id,
                                DEFAULT_RETAIN_S,
                                *response,
                                settled_by,
                            )
                            assert row is not None and row["applied"], row
                            expires_at = row["now"] + (
                                retain_s if retain_s is not None else DEFAULT_RETAIN_S
                            )
                        else:
                            await conn.execute(
                                "SELECT fenceproxy_commit_key('r', 'k', 'fp-new', 'e-own', 3,"
                                " $1, $2, $3, $4, $5)",
                                expires_at,
                                *response,
                                settled_by,
                            )
                        written.append(await conn.fetchrow(KEY_ROW))
                        await transaction.rollback()
                    case = (prior, status, settled_by, retain_s)
                    assert written[0] is not None and written[0] == written[1], case
    finally:
        await conn.close()
