"""The refusal record is bounded by what exists, not by requests, and
its tally never counts a refusal twice.

Every refusal, of any kind and from any source, is one more in a count of the record's
one row per (resource, code, route, epoch, holder, client); a name the store does not
know (a resource never leased, a holder that holds nothing, an epoch no lease had) is
kept as "none" there. So 10^5 refusals of each kind below grow the store by less than
1 MB beyond what the leases they name cost. On SQLite and PostgreSQL, driving the
store the way the proxy does (the app-level test goes through HTTP).

FENCEPROXY_REFUSAL_FLOOD sets how many refusals of each kind: 2000 in `make test`
(10^4 refusals in all; the record of a row per request grew SQLite by 1.5 MB and
PostgreSQL by 2.8 MB with them), 10^5 in `make refusal-flood` (the figures in
docs/reference/refusals.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from core.records import Refusal, Rejection
from store import NewEffect, Store
from store.queries import load_migrations
from store.sqlite import parse_sqlite_url
from tests.integration.app import backends
from tests.integration.app.conftest import FakeClock, Fence, assert_problem
from tests.integration.app.test_store_contract import granted, new_token_hash, running_store

FLOOD = int(os.environ.get("FENCEPROXY_REFUSAL_FLOOD", "2000"))
MEGABYTE = 1_000_000
DAY = 86400.0
# How many store calls run at once (the proxy runs one per request in flight).
CONCURRENCY = 64


async def store_bytes(store_url: str) -> int:
    """What the store occupies: SQLite's pages once the write-ahead log is checkpointed
    into the file, PostgreSQL's tables of this schema with their indexes and TOAST."""
    if backends.backend_of(store_url) == "sqlite":
        await backends.rows(store_url, "PRAGMA wal_checkpoint(TRUNCATE)")
        [(pages,)] = await backends.rows(store_url, "PRAGMA page_count")
        [(size,)] = await backends.rows(store_url, "PRAGMA page_size")
        return int(pages) * int(size)
    [(total,)] = await backends.rows(
        store_url,
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind = 'r'",
    )
    return int(total)


async def flood(times: int, refuse: Callable[[int], Awaitable[None]]) -> None:
    """`refuse(i)` for i in range(times), CONCURRENCY at a time."""
    for start in range(0, times, CONCURRENCY):
        await asyncio.gather(*(refuse(i) for i in range(start, min(times, start + CONCURRENCY))))


def write(resource: str, key: str) -> NewEffect:
    return NewEffect("place-order", resource, key, "fp", "POST", f"/orders/{key}", 1, 5.0, 60.0)


def as_refused(result: object) -> Refusal:
    assert isinstance(result, Refusal), result
    return result


async def counts_by_code(store: Store) -> dict[str, int]:
    counted: dict[str, int] = {}
    for rejection in await store.rejections(limit=1000):
        counted[rejection.code] = counted.get(rejection.code, 0) + rejection.count
    return counted


async def test_a_flood_of_every_kind_of_refusal_grows_the_store_by_under_a_megabyte(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        # A day: PostgreSQL's clock flows on through the whole flood.
        held = granted(await store.acquire("supplier:held", "worker", DAY, new_token_hash()))
        released_token = new_token_hash()
        gone = granted(await store.acquire("supplier:gone", "worker", 300, released_token))
        assert not isinstance(await store.release(released_token), Refusal)
        before = await store_bytes(store_url)

        async def stale_write(i: int) -> None:
            # The proxy records an admission's refusal itself (no call of its own).
            refused = as_refused(await store.admit(released_token, write("supplier:gone", f"k{i}")))
            assert refused.code == "stale_epoch"

        async def stale_renew(i: int) -> None:
            refused = as_refused(await store.renew(released_token, 30))
            assert refused.code == "stale_epoch"
            await store.record_rejection(
                Rejection(
                    "stale_epoch",
                    "POST",
                    "/_fence/v1/leases/renew",
                    resource=refused.context.get("resource"),
                    epoch=refused.context.get("epoch"),
                )
            )

        async def unknown_effect(i: int) -> None:
            await store.record_rejection(
                Rejection(
                    "not_found",
                    "GET",
                    f"/_fence/v1/effects/eff_{i:012d}",
                    resource=held.resource,
                    holder=held.holder,
                    epoch=held.epoch,
                )
            )

        async def forbidden(i: int) -> None:
            await store.record_rejection(
                Rejection("forbidden", "GET", "/_fence/v1/effects", client="lease-only")
            )
            await store.record_rejection(
                Rejection(
                    "forbidden_resource",
                    "POST",
                    "/_fence/v1/leases",
                    resource=f"tenant:other:{i}",
                    client="lease-only",
                )
            )

        async def lease_held(i: int) -> None:
            refused = as_refused(await store.acquire("supplier:held", f"invented-{i}", 30, "x"))
            assert refused.code == "lease_held"
            await store.record_rejection(
                Rejection(
                    "lease_held",
                    "POST",
                    "/_fence/v1/leases",
                    resource="supplier:held",
                    holder=f"invented-{i}",
                    epoch=refused.context.get("epoch"),
                )
            )

        for kind in (stale_write, stale_renew, unknown_effect, forbidden, lease_held):
            await flood(FLOOD, kind)
            await store.flush_refusal_counts()
        grown = await store_bytes(store_url) - before
        print(f"{backends.backend_of(store_url)}: {5 * FLOOD} refusals grew the store {grown} B")
        assert grown < MEGABYTE, grown

        assert await counts_by_code(store) == {
            "stale_epoch": 2 * FLOOD,
            "not_found": FLOOD,
            "forbidden": FLOOD,
            "forbidden_resource": FLOOD,
            "lease_held": FLOOD,
        }
        # Still evidence: the refusals naming a lease say which, and who held it.
        stale = [r for r in await store.rejections(gone.resource) if r.code == "stale_epoch"]
        assert {(r.holder, r.epoch) for r in stale} <= {
            (gone.holder, gone.epoch),
            (None, gone.epoch),
        }
        assert sum(r.count for r in stale) == 2 * FLOOD
        # Invented holders hold nothing: counted against the resource that refused them.
        [held_refusals] = [
            r for r in await store.rejections(held.resource) if r.code == "lease_held"
        ]
        assert (held_refusals.holder, held_refusals.epoch, held_refusals.count) == (
            None,
            None,
            FLOOD,
        )


async def test_an_app_level_flood_of_refusals_through_http_stays_bounded(fence: Fence) -> None:
    lease = await fence.acquire("supplier:widget")
    await fence.revoke("supplier:widget")
    # The longest TTL the test policy allows: PostgreSQL's clock flows on meanwhile.
    await fence.acquire("supplier:held", ttl_s=60)
    await fence.store.flush_refusal_counts()
    before = await store_bytes(fence.store_url)
    times = 200

    for i in range(times):
        await assert_problem(
            await fence.order("widget", lease["token"], f"k-{i}"), 409, "stale_epoch"
        )
        response = await fence.client.post(
            "/_fence/v1/leases",
            json={"resource": "supplier:held", "holder": f"invented-{i}", "ttl_s": 30},
        )
        await assert_problem(response, 409, "lease_held")
    listed = await fence.rejections(limit="1000")

    grown = await store_bytes(fence.store_url) - before
    assert grown < 200_000, grown
    by_code = {(r["code"], r["resource"], r["holder"], r["epoch"]): r["count"] for r in listed}
    assert by_code == {
        ("stale_epoch", "supplier:widget", lease["holder"], lease["epoch"]): times,
        ("lease_held", "supplier:held", None, None): times,
    }


async def test_a_flush_cancelled_after_its_write_committed_counts_nothing_twice(
    store_url: str, clock: FakeClock
) -> None:
    """The proxy's shutdown cancels a flush mid-write: the write may have committed
    though the flush never hears so. What it wrote is never written again."""
    async with running_store(store_url, clock) as store:
        for _ in range(3):
            await store.record_rejection(Rejection("no_route", "DELETE", "/junk"))
        real_write = store.connector.write

        async def committed_then_cancelled(operation: Any, *args: Any, **kwargs: Any) -> Any:
            await real_write(operation, *args, **kwargs)
            raise asyncio.CancelledError

        store.connector.write = committed_then_cancelled  # type: ignore[method-assign]
        flushing = asyncio.create_task(store.flush_refusal_counts())
        await asyncio.wait([flushing])
        assert flushing.cancelled()
        store.connector.write = real_write  # type: ignore[method-assign]
        await store.record_rejection(Rejection("no_route", "DELETE", "/junk"))
        await store.flush_refusal_counts()

        assert await counts_by_code(store) == {"no_route": 4}


async def test_a_flush_cancelled_at_any_moment_counts_each_refusal_once(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        for round_number in range(20):
            for _ in range(3):
                await store.record_rejection(Rejection("no_route", "DELETE", "/junk"))
            flushing = asyncio.create_task(store.flush_refusal_counts())
            for _ in range(round_number % 5):
                await asyncio.sleep(0)
            flushing.cancel()
            await asyncio.wait([flushing])
        await store.flush_refusal_counts()

        assert await counts_by_code(store) == {"no_route": 60}


async def test_two_replicas_flushing_at_once_keep_the_bound(
    store_url: str, clock: FakeClock
) -> None:
    """Junk that names nothing that exists is one row per (code, route, client) however
    many replicas count it and however their flushes interleave."""
    async with (
        running_store(store_url, clock, instance_id="replica-1") as one,
        running_store(store_url, clock, instance_id="replica-2") as two,
    ):
        for _ in range(5):
            for store in (one, two):
                for i in range(300):
                    await store.record_rejection(
                        Rejection("no_route", "DELETE", f"/junk/{store.instance_id}/{i}")
                    )
                    await store.record_rejection(
                        Rejection(
                            "lease_held",
                            "POST",
                            "/_fence/v1/leases",
                            resource=f"never:leased:{i}",
                            holder=f"invented-{i}",
                            epoch=i,
                        )
                    )
            await asyncio.gather(one.flush_refusal_counts(), two.flush_refusal_counts())

        rows = await backends.rows(store_url, "SELECT code, count FROM refusals ORDER BY code")
        assert rows == [("lease_held", 3000), ("no_route", 3000)]


# The migrations that fold the former per-request `rejections` and counted
# `refusal_counts` into `refusals`, per backend.
BOUNDED_REFUSALS_MIGRATION = {"sqlite": 16, "postgresql": 14}
OLD_REFUSALS = """
    INSERT INTO resources (resource, epoch) VALUES ('r:1', 2);
    INSERT INTO leases (resource, epoch, holder, token_hash, granted_at, expires_at)
    VALUES ('r:1', 2, 'w', 'token-hash', 1, 2);
    INSERT INTO rejections (at, code, method, path, route, resource, holder, epoch, fingerprint)
    VALUES (10, 'stale_epoch', 'POST', '/a', 'rt', 'r:1', 'w', 2, 'fp'),
           (11, 'stale_epoch', 'POST', '/b', 'rt', 'r:1', 'w', 2, 'fp'),
           (12, 'lease_held', 'POST', '/l', NULL, 'r:1', 'invented', NULL, NULL),
           (14, 'lease_held', 'POST', '/l', NULL, 'r:junk', 'invented', 5, NULL);
    INSERT INTO refusal_counts (code, route, resource, method, path, first_seen, last_seen, count)
    VALUES ('no_route', '', '', 'GET', '/x', 1, 5, 3), ('no_route', '', '', 'GET', '/y', 2, 6, 4),
           ('lease_held', '', 'r:1', 'POST', '/l', 1, 20, 7);
"""


async def store_before_bounded_refusals(store_url: str) -> None:
    """The store as the migrations before the bounded record left it, with refusals of
    both former kinds in it."""
    backend = backends.backend_of(store_url)
    shipped = load_migrations(backend)
    before = [(v, name, sql) for v, name, sql in shipped if v < BOUNDED_REFUSALS_MIGRATION[backend]]
    if backend == "sqlite":
        path, _ = parse_sqlite_url(store_url)
        with contextlib.closing(sqlite3.connect(path)) as sqlite_conn, sqlite_conn:
            sqlite_conn.execute(
                "CREATE TABLE schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            for version, name, sql in before:
                sqlite_conn.executescript(sql)
                sqlite_conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, 0)", (version, name)
                )
            sqlite_conn.executescript(OLD_REFUSALS)
        return
    pg_conn = await asyncpg.connect(store_url)
    try:
        await pg_conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,"
            " name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for version, name, sql in before:
            await pg_conn.execute(sql)
            await pg_conn.execute("INSERT INTO schema_migrations VALUES ($1, $2)", version, name)
        await pg_conn.execute(OLD_REFUSALS)
    finally:
        await pg_conn.close()


async def test_the_migration_folds_former_refusals_into_kinds_of_what_exists(
    store_url: str, clock: FakeClock
) -> None:
    await store_before_bounded_refusals(store_url)

    async with running_store(store_url, clock) as store:
        listed = await store.rejections()

    kinds = {(r.code, r.resource, r.route, r.holder, r.epoch): (r.count, r.path) for r in listed}
    assert kinds == {
        ("stale_epoch", "r:1", "rt", "w", 2): (2, "/b"),
        ("lease_held", "r:1", None, None, None): (1 + 7, "/l"),
        ("lease_held", None, None, None, None): (1, "/l"),
        ("no_route", None, None, None, None): (7, "/y"),
    }
