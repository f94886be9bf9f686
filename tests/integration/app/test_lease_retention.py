"""Retention of leases and resources (policy `retention.leases_days`),
on SQLite and PostgreSQL.

Every acquire of a new name adds a resource row and a lease row; without retention
the store grows with every name ever leased. A lease goes `leases_s` after it expired
(it can never be live again); a resource row goes once nothing refers to it, and the
epoch floor is raised to its epoch in the same transaction, so that an epoch is never
issued twice for a name, collected or not. What a blocking rule reads (a live lease,
an effect in doubt, a retained key) keeps its resource.

Time moves with the FakeClock (the store's clock on both backends).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import asyncpg
import pytest

from core.lifecycle import Event
from core.records import EffectState, LeaseRecord, Refusal
from policies import Retention
from proxy.retention import RetentionCollector
from proxy.runtime import RUNTIME
from store import Admitted, Purged, Store
from tests.integration.app import backends
from tests.integration.app.conftest import FakeClock, FenceFactory, poll_until
from tests.integration.app.test_retention import RESPONSE, dispatched, order, settled
from tests.integration.app.test_store_contract import granted, new_token_hash, running_store

DAY = 86400.0
KEEP = Retention(effects_s=30 * DAY, rejections_s=7 * DAY, batch=1000, leases_s=30 * DAY)


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[Store]:
    async with running_store(store_url, clock) as opened:
        yield opened


async def leased(store: Store, resource: str, ttl_s: float = 60.0) -> tuple[LeaseRecord, str]:
    token = new_token_hash()
    return granted(await store.acquire(resource, "worker-a", ttl_s, token)), token


async def leased_and_released(store: Store, resource: str, times: int) -> list[str]:
    """`times` leases of `resource` one after the other, each released; their tokens."""
    tokens = []
    for _ in range(times):
        _, token = await leased(store, resource)
        assert not isinstance(await store.release(token), Refusal)
        tokens.append(token)
    return tokens


async def resource_epochs(store_url: str) -> dict[str, int]:
    rows = await backends.rows(store_url, "SELECT resource, epoch FROM resources")
    return {str(resource): int(epoch) for resource, epoch in rows}


async def epoch_floor(store_url: str) -> int:
    [(floor,)] = await backends.rows(store_url, "SELECT epoch_floor FROM store_meta")
    return int(floor)


# --- epochs never go back --------------------------------------------------------------------


async def test_a_collected_resource_is_leased_again_at_a_higher_epoch(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    tokens = await leased_and_released(store, "r:a", times=3)
    assert await resource_epochs(store_url) == {"r:a": 3}
    clock.advance(31 * DAY)

    assert await store.apply_retention(KEEP) == Purged(0, 0, leases=3, resources=1)

    assert await backends.count(store_url, "leases") == 0
    assert await resource_epochs(store_url) == {}
    assert await epoch_floor(store_url) == 3
    lease, token = await leased(store, "r:a")
    assert lease.epoch == 4
    # A name never leased starts above the floor too (the floor is the store's).
    assert (await leased(store, "r:new"))[0].epoch == 4
    # The old tokens name no lease any more: refused, nothing admitted under them.
    for old in tokens:
        refused = await store.admit(old, order("r:a", "k-1"))
        assert isinstance(refused, Refusal) and refused.code == "invalid_token", refused
        assert isinstance(await store.renew(old, 60), Refusal)
    assert isinstance(await store.admit(token, order("r:a", "k-1")), Admitted)


async def test_a_revocation_after_collection_advances_past_every_epoch_issued(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    await leased_and_released(store, "r:a", times=2)
    clock.advance(31 * DAY)
    assert await store.apply_retention(KEEP) == Purged(0, 0, leases=2, resources=1)

    _, new = await store.revoke("r:a", "operator")

    assert new > 2
    # The revocation's row refers to nothing: the next pass collects it, and the floor
    # remembers its epoch.
    assert await store.apply_retention(KEEP) == Purged(0, 0, resources=1)
    assert (await leased(store, "r:a"))[0].epoch == new + 1


async def test_the_floor_is_never_lowered_by_a_later_collection(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    await leased_and_released(store, "r:busy", times=5)
    await leased_and_released(store, "r:quiet", times=1)
    # The next lease of r:quiet lasts 20 days, so r:quiet outlives r:busy by 20 days.
    await leased(store, "r:quiet", ttl_s=20 * DAY)
    clock.advance(31 * DAY)
    assert await store.apply_retention(KEEP) == Purged(0, 0, leases=6, resources=1)
    assert await resource_epochs(store_url) == {"r:quiet": 2}
    assert await epoch_floor(store_url) == 5

    clock.advance(20 * DAY)
    assert await store.apply_retention(KEEP) == Purged(0, 0, leases=1, resources=1)

    assert await epoch_floor(store_url) == 5
    assert (await leased(store, "r:busy"))[0].epoch == 6


async def test_leases_within_the_horizon_stay_for_their_history(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    await leased_and_released(store, "r:a", times=2)
    clock.advance(29 * DAY)

    assert await store.apply_retention(KEEP) == Purged(0, 0)
    assert await backends.count(store_url, "leases") == 2
    assert await resource_epochs(store_url) == {"r:a": 2}


async def test_zero_keeps_leases_and_resources_forever(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    await leased_and_released(store, "r:a", times=2)
    clock.advance(100 * 365 * DAY)

    assert await store.apply_retention(Retention(30 * DAY, 7 * DAY, 1000, leases_s=0)) == Purged(
        0, 0
    )
    assert await backends.count(store_url, "leases") == 2
    assert await resource_epochs(store_url) == {"r:a": 2}


# --- what a blocking rule reads stays --------------------------------------------------------


async def test_resource_rows_stay_while_anything_refers_to_them(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    live, _ = await leased(store, "r:live", ttl_s=40 * DAY)
    in_flight = await dispatched(store, "r:dispatching", "k-1")
    # No key: only the effect itself refers to its resource.
    unknown = await dispatched(store, "r:unknown", None)
    await store.finish_effect(unknown, Event.LOST, None, "response lost", None)
    conflicting = await dispatched(store, "r:conflicting", "k-3")
    await store.finish_effect(conflicting, Event.LOST, None, "response lost", None)
    await store.record_probe(conflicting, Event.PROBE_COMMITTED, 200, "found", None)
    await store.finish_effect(conflicting, Event.NOT_SENT, None, "refused", None)
    # Settled, its key replays for 60 days: longer than its effect's 30 days here.
    retained = await settled(store, "r:key", Event.ANSWERED_COMMITTED, "k-4", retain_s=60 * DAY)
    before = await resource_epochs(store_url)
    clock.advance(31 * DAY)

    purged = await store.apply_retention(KEEP)

    # Every expired lease goes (all but the live one); no resource does.
    assert purged == Purged(0, 0, leases=4, resources=0)
    assert await resource_epochs(store_url) == before
    states = {e.id: e.state for e in await store.effects(limit=10)}
    assert states == {
        in_flight: EffectState.DISPATCHING,
        unknown: EffectState.UNKNOWN,
        conflicting: EffectState.CONFLICTING,
        retained: EffectState.COMMITTED,
    }
    # What those rules decide still holds: the live lease is held, the rest blocked or
    # replayed.
    held = await store.acquire("r:live", "worker-b", 60, new_token_hash())
    assert isinstance(held, Refusal) and held.code == "lease_held"
    for blocked in ("r:dispatching", "r:unknown", "r:conflicting"):
        refused = await store.acquire(blocked, "worker-b", 60, new_token_hash())
        assert isinstance(refused, Refusal), blocked
    _, token = await leased(store, "r:key")
    replay = await store.admit(token, order("r:key", "k-4", 60 * DAY))
    assert not isinstance(replay, Admitted | Refusal), replay
    assert (await store.lease_view("r:live")).epoch == live.epoch


async def test_a_resource_goes_once_its_last_effect_went_in_an_earlier_pass(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    """Effects kept longer than leases: the resource row outlives both, and the sweep
    finds it once the effects go, passes later."""
    await settled(store, "r:a", Event.ANSWERED_COMMITTED)
    effects_longer = Retention(60 * DAY, 7 * DAY, 1000, leases_s=30 * DAY)
    clock.advance(31 * DAY)
    assert await store.apply_retention(effects_longer) == Purged(0, 0, leases=1)
    assert await resource_epochs(store_url) == {"r:a": 1}

    clock.advance(30 * DAY)
    assert await store.apply_retention(effects_longer) == Purged(1, 0, resources=1)
    assert await resource_epochs(store_url) == {}
    assert (await leased(store, "r:a"))[0].epoch == 2


# --- bounded passes and bounded growth -------------------------------------------------------


async def test_a_pass_deletes_at_most_a_batch_of_leases_and_sweeps_a_batch_of_resources(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    for i in range(25):
        await leased_and_released(store, f"r:{i:02}", times=1)
    clock.advance(31 * DAY)
    small = Retention(30 * DAY, 7 * DAY, batch=10, leases_s=30 * DAY)

    first = await store.apply_retention(small)
    assert first.leases == 10 and first.resources <= 10
    assert await backends.count(store_url, "leases") == 15

    # Rounds of the collector (a minute apart in the proxy) until the sweep has been
    # round once more: what a pass left referenced, a later round of the sweep finds.
    deleted: list[Purged] = [first]
    collector = RetentionCollector(store, small, on_deleted=deleted.append)
    for _ in range(5):
        await collector.collect()
    assert all(p.leases <= 10 and p.resources <= 10 for p in deleted)
    assert sum(p.resources for p in deleted) == 25
    assert await backends.count(store_url, "leases") == 0
    assert await backends.count(store_url, "resources") == 0
    assert await epoch_floor(store_url) == 1


async def test_two_replicas_collecting_at_once_leave_no_epoch_behind(
    store_url: str, clock: FakeClock
) -> None:
    async with (
        running_store(store_url, clock, instance_id="replica-1") as one,
        running_store(store_url, clock, instance_id="replica-2") as two,
    ):
        for i in range(40):
            await leased_and_released(one, f"r:{i:02}", times=1 + i % 3)
        clock.advance(31 * DAY)
        small = Retention(30 * DAY, 7 * DAY, batch=7, leases_s=30 * DAY)

        async def passes(store: Store) -> None:
            for _ in range(200):
                if await backends.count(store_url, "resources") == 0:
                    return
                await store.apply_retention(small)

        await asyncio.gather(passes(one), passes(two), passes(one))
        assert await backends.count(store_url, "leases") == 0
        assert await backends.count(store_url, "resources") == 0
        assert await epoch_floor(store_url) == 3
        assert (await leased(two, "r:02"))[0].epoch == 4


async def test_acquires_racing_the_collector_on_another_replica_never_reuse_an_epoch(
    store_url: str, clock: FakeClock
) -> None:
    """Names leased and released over and over, alternately through two replicas, while
    a third keeps collecting them (a horizon of half a second, the clock moved two seconds
    a pass): every grant of a name is above every earlier one, whichever of a grant and
    a deletion of the row took the name's lock first.

    Every third grant of a name waits until the name was collected, so that every name's
    epochs cross a collection ten times however the tasks are scheduled. Waiting for a
    pass or two is not enough: a pass deletes at most `batch` leases and a name's row
    only once all its leases went, so a collector whose passes are scheduled less often
    than the grants (CPU load) may never catch up with any name: one run deleted no row
    in its 11 passes."""
    rounds = 30
    async with (
        running_store(store_url, clock, instance_id="replica-1") as one,
        running_store(store_url, clock, instance_id="replica-2") as two,
        running_store(store_url, clock, instance_id="replica-3") as collector,
    ):
        done = asyncio.Event()
        collected: list[int] = []
        passed = asyncio.Condition()
        # At most 4 x 30 leases are ever granted and a pass deletes 3 of them, or every
        # one that expired before it: past the pass under way when a name's worker stops
        # granting, at most 40 passes go by before one finds the name's leases all gone
        # and deletes its row. More are allowed for passes that deleted nothing because
        # another store on the same PostgreSQL database held the retention lock (an
        # advisory lock, the database's).
        most_passes = 200

        def a_pass_after(seen: int) -> Callable[[], bool]:
            return lambda: len(collected) > seen

        async def until_collected(store: Store, name: str) -> None:
            for _ in range(most_passes):
                if (await store.lease_view(name)).epoch == 0:  # no row: collected
                    return
                async with passed:
                    await passed.wait_for(a_pass_after(len(collected)))
            pytest.fail(f"{name} was not collected in {most_passes} passes")

        async def worker(name: str) -> list[int]:
            epochs = []
            for i in range(rounds):
                store = one if i % 2 else two
                lease, token = await leased(store, name, ttl_s=0.5)
                epochs.append(lease.epoch)
                # The collector may have taken the lease first (it expired half a second
                # in): then the token names no lease.
                released = await store.release(token)
                assert not isinstance(released, Refusal) or released.code == "invalid_token"
                if i % 3 == 0:
                    await until_collected(store, name)
            return epochs

        async def collect() -> None:
            while not done.is_set():
                clock.advance(2.0)
                purged = await collector.apply_retention(
                    Retention(30 * DAY, 7 * DAY, batch=3, leases_s=0.5)
                )
                async with passed:
                    collected.append(purged.resources)
                    passed.notify_all()
                await asyncio.sleep(0)

        collecting = asyncio.create_task(collect())
        try:
            names = [f"race:{i}" for i in range(4)]
            issued = await asyncio.gather(*(worker(name) for name in names))
        finally:
            done.set()
            await collecting

    for epochs in issued:
        assert epochs == sorted(set(epochs)), epochs
    # Each wait ended on a deletion of its name's row since the name's last grant.
    assert sum(collected) >= len(names) * len(range(0, rounds, 3))


async def store_bytes(store_url: str) -> int:
    """SQLite's pages; PostgreSQL's tables of this test's schema (their heaps: a B-tree
    page a VACUUM emptied is recycled only once no transaction anywhere on the server
    could still see it, which other work on a shared server can put off)."""
    if backends.backend_of(store_url) == "sqlite":
        [(pages,)] = await backends.rows(store_url, "PRAGMA page_count")
        [(size,)] = await backends.rows(store_url, "PRAGMA page_size")
        return int(pages) * int(size)
    [(total,)] = await backends.rows(
        store_url,
        "SELECT coalesce(sum(pg_relation_size(c.oid)), 0) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind = 'r'",
    )
    return int(total)


async def vacuumed(store_url: str) -> None:
    """On PostgreSQL, what autovacuum does: the space of deleted rows made reusable."""
    if backends.backend_of(store_url) == "postgresql":
        conn = await asyncpg.connect(store_url)
        try:
            await conn.execute("VACUUM")
        finally:
            await conn.close()


async def test_ten_thousand_distinct_leases_are_collected_and_the_store_stops_growing(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    """The store's growth from distinct names leased once each and released, never again
    (seeded in bulk, as acquire and release leave them; the tests above go through the
    API). After the horizon the lease and resource rows go, in bounded passes, and the
    next rounds of as many reuse the space the first freed (on PostgreSQL once vacuumed,
    as autovacuum does), so the store stays bounded however many names pass through."""
    many = 10_000
    collector = RetentionCollector(store, KEEP)
    long_ago = await store.now() - 31 * DAY
    sizes = []
    for round_ in range(3):
        await backends.seed_released_leases(
            store_url, many, prefix=f"round-{round_}:", epoch=round_ + 1, ended_at=long_ago
        )
        assert await backends.count(store_url, "resources") == many

        purged, passes = await collector.collect()

        assert (purged.leases, purged.resources) == (many, many)
        assert passes == many // KEEP.batch + 1  # full batches, then one that found none
        assert await backends.count(store_url, "leases") == 0
        assert await backends.count(store_url, "resources") == 0
        assert await epoch_floor(store_url) == round_ + 1
        await vacuumed(store_url)
        sizes.append(await store_bytes(store_url))

    assert sizes[2] <= sizes[1] * 1.1, sizes
    # No name's epochs were forgotten: each starts above every one issued.
    assert (await leased(store, "round-0:7"))[0].epoch == 4


# --- the collector in the app ----------------------------------------------------------------


async def test_the_app_collects_an_old_lease_and_its_resource_and_the_old_token_writes_nothing(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence()
    lease = await fence.acquire("supplier:widget", "worker-a", ttl_s=30)
    assert (await fence.order("widget", lease["token"], "k-1")).status == 201
    released = await fence.client.post(
        "/_fence/v1/leases/release", json={}, headers={"Fence-Token": lease["token"]}
    )
    assert released.status == 200
    fence.clock.advance(31 * DAY)
    collector = fence.app[RUNTIME].retention
    assert collector is not None
    collector.wake.set()

    async def collected() -> bool:
        text = await (await fence.client.get("/_fence/metrics")).text()
        return all(
            f'fenceproxy_retention_deleted_total{{record="{record}"}} 1.0' in text
            for record in ("effects", "leases", "resources")
        )

    await poll_until(collected, "the old lease and its resource to be collected")
    assert await fence.rows("SELECT count(*) FROM resources") == [(0,)]

    again = await fence.acquire("supplier:widget", "worker-b", ttl_s=30)
    assert again["epoch"] > lease["epoch"]
    # The first worker wakes with its old token: refused, nothing reaches the upstream.
    refused = await fence.order("widget", lease["token"], "k-2")
    assert refused.status == 403
    assert (await refused.json())["code"] == "invalid_token"
    assert await fence.upstream_orders() == 1
    assert (await fence.order("widget", again["token"], "k-3")).status == 201
    assert await fence.upstream_orders() == 2


# --- a seeded random walk: epochs never go back, whatever is collected when ----------------


@dataclass
class WalkLease:
    resource: str
    epoch: int
    token: str
    expires_at: float
    ended: bool = False


class Walk:
    """A seeded random sequence of what workers, operators, time and retention do to a
    few names, through the Store API; after every step the store's tables are checked
    against what the walk saw issued. The simulation (tests/simulation) does not
    collect: its seven names are busy with effects that retention would delete under
    its checks, so this walk is where collection meets the rest of the lifecycle."""

    NAMES = ("w:a", "w:b", "w:c", "w:d")
    KEYS = (None, "k-1", "k-2")
    STEPS_S = (10.0, 3600.0, 3 * DAY, 40 * DAY)

    def __init__(self, seed: int, store: Store, store_url: str, clock: FakeClock) -> None:
        self.rng = random.Random(seed)
        self.store = store
        self.store_url = store_url
        self.clock = clock
        self.issued: dict[str, int] = {}  # the highest epoch the store answered, per name
        self.leases: list[WalkLease] = []
        self.open: list[str] = []  # effects possibly in doubt
        self.collected = 0

    def fresh(self, lease: WalkLease, now: float) -> bool:
        return (
            lease.epoch == self.issued.get(lease.resource)
            and not lease.ended
            and now < lease.expires_at
        )

    def issue(self, resource: str, epoch: int) -> None:
        assert epoch > self.issued.get(resource, 0), (resource, epoch, self.issued)
        self.issued[resource] = epoch

    async def step(self) -> None:
        kind = self.rng.choice(
            ["acquire"] * 4
            + ["release", "revoke", "admit", "admit", "settle"]
            + ["recover", "advance", "advance", "retention", "retention"]
        )
        await getattr(self, kind)()

    async def acquire(self) -> None:
        resource = self.rng.choice(self.NAMES)
        token = new_token_hash()
        ttl_s = self.rng.choice((30.0, 600.0))
        result = await self.store.acquire(resource, "walker", ttl_s, token)
        if not isinstance(result, Refusal):
            lease, _ = result
            self.issue(resource, lease.epoch)
            self.leases.append(WalkLease(resource, lease.epoch, token, lease.expires_at))

    async def release(self) -> None:
        if self.leases:
            lease = self.rng.choice(self.leases)
            if not isinstance(await self.store.release(lease.token), Refusal):
                lease.ended = True

    async def revoke(self) -> None:
        resource = self.rng.choice(self.NAMES)
        _, new = await self.store.revoke(resource, "walk")
        self.issue(resource, new)

    async def admit(self) -> None:
        if not self.leases:
            return
        lease = self.rng.choice(self.leases)
        now = await self.store.now()
        key = self.rng.choice(self.KEYS)
        decision = await self.store.admit(lease.token, order(lease.resource, key))
        if not isinstance(decision, Admitted):
            return
        # Nothing is admitted under a lease that is not the name's newest, live one.
        assert self.fresh(lease, now), (lease, self.issued)
        event = self.rng.choice(
            [None, Event.LOST, Event.ANSWERED_COMMITTED, Event.ANSWERED_NOT_COMMITTED]
        )
        if event is None:
            self.open.append(decision.effect.id)  # left DISPATCHING
            return
        status = {Event.ANSWERED_COMMITTED: 201, Event.ANSWERED_NOT_COMMITTED: 409}.get(event)
        response = RESPONSE if event is Event.ANSWERED_COMMITTED else None
        await self.store.finish_effect(decision.effect.id, event, status, "walk", response)
        if event is Event.LOST:
            self.open.append(decision.effect.id)

    async def settle(self) -> None:
        if not self.open:
            return
        effect_id = self.rng.choice(self.open)
        effect = await self.store.effect(effect_id)
        if effect is None or effect.state is not EffectState.UNKNOWN:
            return
        event = self.rng.choice((Event.PROBE_COMMITTED, Event.PROBE_NOT_COMMITTED))
        await self.store.record_probe(effect_id, event, 200, "walk", None)
        self.open.remove(effect_id)

    async def recover(self) -> None:
        await self.store.recover(None, margin_s=2.0)

    async def advance(self) -> None:
        self.clock.advance(self.rng.choice(self.STEPS_S))

    async def retention(self) -> None:
        batch = self.rng.randint(1, 5)
        await self.store.collect_garbage()
        purged = await self.store.apply_retention(
            Retention(30 * DAY, 7 * DAY, batch, leases_s=30 * DAY)
        )
        self.collected += purged.resources

    async def check(self) -> None:
        """Every name's row holds the highest epoch issued for it; a name without one is
        under the floor; a name with a live lease or an effect in doubt has its row."""
        # One read (one connection) for the three: the walk checks after every step.
        found = await backends.rows(
            self.store_url,
            "SELECT 'row', resource, epoch FROM resources"
            " UNION ALL SELECT 'floor', '', epoch_floor FROM store_meta"
            " UNION ALL SELECT 'in doubt', resource, 0 FROM effects"
            " WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')",
        )
        rows = {str(r): int(e) for what, r, e in found if what == "row"}
        [floor] = [int(e) for what, _, e in found if what == "floor"]
        in_doubt = {str(r) for what, r, _ in found if what == "in doubt"}
        for resource, issued in self.issued.items():
            if resource in rows:
                assert rows[resource] == issued, (resource, rows, self.issued)
            else:
                assert floor >= issued, (resource, floor, self.issued)
        now = await self.store.now()
        for lease in self.leases:
            if self.fresh(lease, now):
                assert lease.resource in rows, lease
        assert in_doubt <= set(rows), (in_doubt, rows)


@pytest.mark.parametrize("seed", range(3))
async def test_a_random_walk_never_issues_an_epoch_twice_across_collection(
    seed: int, store: Store, store_url: str, clock: FakeClock
) -> None:
    walk = Walk(seed, store, store_url, clock)
    # Fewer on PostgreSQL, where each check and clock move is a connection of its own.
    steps = 300 if backends.backend_of(store_url) == "sqlite" else 120
    for _ in range(steps):
        await walk.step()
        await walk.check()
    # The walk did collect: the property was tested across deletions, not around them.
    assert walk.collected > 0
