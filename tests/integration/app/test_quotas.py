"""Quotas on acquires, on SQLite and PostgreSQL: a quota subject (the
holder, while there is no `auth:`) holding `quotas.live_leases` live leases, or
acquiring faster than `quotas.acquires_per_s` after its `burst`, gets `429
rate_limited` with `Retry-After`; nothing is granted, no epoch moves, other subjects
are unaffected, renew and release are never limited, and a flood of refusals adds
no row per request to the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import math

import pytest
from aiohttp import ClientResponse

from core.records import Refusal
from tests.integration.app import backends
from tests.integration.app.conftest import (
    FakeClock,
    Fence,
    FenceFactory,
    assert_problem,
    poll_until,
)
from tests.integration.app.test_store_contract import (
    granted,
    new_token_hash,
    running_store,
)

# A rate so slow that no token comes back while a test runs: the bucket is only ever
# what the burst left, whatever the wall clock does meanwhile.
NO_REFILL = "acquires_per_s: 0.001"


async def rate_limited(response: ClientResponse) -> int:
    """A 429 rate_limited answer; its Retry-After, which the body states too."""
    body = await assert_problem(response, 429, "rate_limited")
    retry_after = int(response.headers["Retry-After"])
    assert retry_after == body["retry_after_s"] >= 1, body
    return retry_after


async def release(fence: Fence, token: str) -> None:
    response = await fence.client.post("/_fence/v1/leases/release", headers={"Fence-Token": token})
    assert response.status == 200, await response.text()


async def renew(fence: Fence, token: str) -> None:
    response = await fence.client.post(
        "/_fence/v1/leases/renew", headers={"Fence-Token": token}, json={"ttl_s": 30}
    )
    assert response.status == 200, await response.text()


async def counted_in_the_end(fence: Fence, expected: int) -> None:
    """Wait until `expected` rate_limited refusals are counted in the store. Polled: the
    background flush may have taken some counts and not yet committed them when
    this test's own flush has."""

    async def all_counted() -> bool:
        await fence.store.flush_refusal_counts()
        [(total,)] = await fence.rows(
            "SELECT coalesce(sum(count), 0) FROM refusals WHERE code = 'rate_limited'"
        )
        assert total <= expected
        return bool(total == expected)

    await poll_until(all_counted, f"{expected} rate_limited refusals counted")


# --- live leases ---------------------------------------------------------------------------


async def test_a_subject_at_its_live_lease_cap_is_refused_until_one_ends(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence(quotas="{live_leases: 2, acquires_per_s: 0}")
    # r3 was leased once by another worker and expired: its epoch is 1.
    await fence.acquire("rules:r3", holder="worker-b", ttl_s=1)
    fence.clock.advance(2)
    first = await fence.acquire("rules:r1", holder="worker-a", ttl_s=30)
    await fence.acquire("rules:r2", holder="worker-a", ttl_s=10)

    retry_after = await rate_limited(await fence.acquire_response("rules:r3", holder="worker-a"))

    # Until the first of its leases (r2's, 10 s) expires.
    if fence.backend == "sqlite":
        assert retry_after == 10
    else:
        assert 1 <= retry_after <= 10
    # Nothing granted, the epoch unchanged.
    view = await fence.lease("rules:r3")
    assert (view["epoch"], view["holder"], view["live"]) == (1, "worker-b", False)
    assert await fence.rows("SELECT count(*) FROM leases WHERE holder = ?", "worker-a") == [(2,)]
    # Another subject is not held back by worker-a's leases.
    assert (await fence.acquire("rules:r3", holder="worker-b"))["epoch"] == 2
    # Once worker-a gives one back, it may take another.
    await release(fence, first["token"])
    assert (await fence.acquire("rules:r4", holder="worker-a"))["epoch"] == 1


async def test_expired_leases_no_longer_count_against_the_cap(make_fence: FenceFactory) -> None:
    fence = await make_fence(quotas="{live_leases: 1, acquires_per_s: 0}")
    await fence.acquire("rules:r1", holder="worker-a", ttl_s=5)
    await rate_limited(await fence.acquire_response("rules:r2", holder="worker-a"))
    fence.clock.advance(6)
    assert (await fence.acquire("rules:r2", holder="worker-a"))["epoch"] == 1


async def test_live_leases_zero_is_no_cap(make_fence: FenceFactory) -> None:
    fence = await make_fence(quotas="{live_leases: 0, acquires_per_s: 0}")
    for i in range(5):
        await fence.acquire(f"rules:r{i}", holder="worker-a")


async def test_concurrent_acquires_of_one_subject_never_exceed_its_cap(
    store_url: str, clock: FakeClock
) -> None:
    """Acquires of different resources hold different resource locks: on PostgreSQL
    only the subject's own lock (lock_quota_subject) keeps two of them from both
    finding room under the cap. Two stores (two replicas' pools) on one database."""
    async with (
        running_store(store_url, clock, instance_id="replica-1") as one,
        running_store(store_url, clock, instance_id="replica-2") as two,
    ):
        results = await asyncio.gather(
            *(
                (one, two)[i % 2].acquire(f"r{i}", "worker-a", 30, new_token_hash(), 3)
                for i in range(24)
            )
        )
    grants = [result for result in results if not isinstance(result, Refusal)]
    refusals = [result for result in results if isinstance(result, Refusal)]
    assert len(grants) == 3
    assert {refusal.code for refusal in refusals} == {"rate_limited"}


async def test_the_store_counts_only_live_leases_of_the_holder(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        kept = granted(await store.acquire("r1", "w", 30, new_token_hash(), 2))
        released_hash = new_token_hash()
        granted(await store.acquire("r2", "w", 30, released_hash, 2))
        assert isinstance(await store.acquire("r3", "w", 30, new_token_hash(), 2), Refusal)
        # Released and revoked leases are not live.
        await store.release(released_hash)
        granted(await store.acquire("r3", "w", 30, new_token_hash(), 2))
        await store.revoke("r3", "test")
        granted(await store.acquire("r4", "w", 30, new_token_hash(), 2))
        # Someone else's leases are not w's.
        granted(await store.acquire("r5", "v", 30, new_token_hash(), 2))
        refusal = await store.acquire("r6", "w", 30, new_token_hash(), 2)
        assert isinstance(refusal, Refusal) and refusal.context["live_leases"] == 2
        # r1 expires first (its 30 s began earlier than r4's on PostgreSQL's clock).
        expected = kept.expires_at - await store.now()
        assert refusal.context["retry_after_s"] == pytest.approx(math.ceil(expected), abs=1)


# --- the acquire rate ----------------------------------------------------------------------


async def test_a_burst_then_rate_limited_and_other_subjects_unaffected(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence(quotas=f"{{{NO_REFILL}, burst: 3}}")
    leases = [await fence.acquire(f"rules:r{i}", holder="worker-a") for i in range(3)]

    # One token every 1000 s: the next one is 1000 s away.
    assert await rate_limited(await fence.acquire_response("rules:r3", holder="worker-a")) == 1000
    assert (await fence.lease("rules:r3"))["epoch"] == 0
    assert (await fence.acquire("rules:r3", holder="worker-b"))["epoch"] == 1
    # Renew and release are not acquires: a worker can always keep or give back a lease.
    for lease in leases:
        await renew(fence, lease["token"])
        await release(fence, lease["token"])
    # Releasing gives no acquire back: the rate counts acquires, not leases.
    await rate_limited(await fence.acquire_response("rules:r4", holder="worker-a"))


async def test_a_refused_acquire_still_takes_from_the_rate(make_fence: FenceFactory) -> None:
    fence = await make_fence(quotas=f"{{{NO_REFILL}, burst: 2}}")
    await fence.acquire("rules:r1", holder="worker-b")
    response = await fence.acquire_response("rules:r1", holder="worker-a")
    await assert_problem(response, 409, "lease_held")
    await fence.acquire("rules:r2", holder="worker-a")
    await rate_limited(await fence.acquire_response("rules:r3", holder="worker-a"))


async def test_acquires_per_s_zero_is_no_rate_limit(make_fence: FenceFactory) -> None:
    fence = await make_fence(quotas="{acquires_per_s: 0, burst: 1}")
    for i in range(5):
        await fence.acquire(f"rules:r{i}", holder="worker-a")


async def test_a_flood_of_rate_limited_acquires_adds_no_row_each(make_fence: FenceFactory) -> None:
    fence = await make_fence(quotas=f"{{{NO_REFILL}, burst: 1}}")
    holders = [f"flood-{i}" for i in range(5)]
    statuses: list[int] = []
    for start in range(0, 600, 50):
        answers = await asyncio.gather(
            *(
                fence.acquire_response(f"rules:f{i}", holder=holders[i % 5])
                for i in range(start, start + 50)
            )
        )
        statuses += [answer.status for answer in answers]
        for answer in answers:
            answer.release()
    assert sorted(set(statuses)) == [201, 429] and statuses.count(201) == 5

    await counted_in_the_end(fence, 595)
    assert await fence.rows("SELECT count(*) FROM leases") == [(5,)]
    # Bounded by what exists: a row for each of the 5 resources leased, one for the rest.
    [(kinds,)] = await fence.rows("SELECT count(*) FROM refusals")
    assert kinds <= 5 + 1
    # Listed like any counted refusal, without a holder.
    listed = await fence.rejections()
    assert {(r["code"], r["holder"]) for r in listed} == {("rate_limited", None)}


async def test_the_live_lease_refusal_is_counted_too(make_fence: FenceFactory) -> None:
    fence = await make_fence(quotas="{live_leases: 1, acquires_per_s: 0}")
    await fence.acquire("rules:r1", holder="worker-a")
    for _ in range(20):
        await rate_limited(await fence.acquire_response("rules:r2", holder="worker-a"))
    await counted_in_the_end(fence, 20)
    assert await backends.count(fence.store_url, "refusals") == 1


async def test_acquires_of_made_up_resources_refused_at_the_cap_leave_no_row_each(
    make_fence: FenceFactory,
) -> None:
    """A refused acquire writes nothing about a resource the store did not know: no
    `resources` row for the name (on PostgreSQL the lock's upsert inserts one, which
    committed with the refusal), and the refusal's resource is "none" (docs/reference/
    refusals.md), so a flood of made-up names grows neither table."""
    fence = await make_fence(quotas="{live_leases: 1, acquires_per_s: 0}")
    await fence.acquire("rules:held", holder="worker-a", ttl_s=30)
    await rate_limited(await fence.acquire_response("rules:warm-up", holder="worker-a"))
    await counted_in_the_end(fence, 1)
    resources_before = await backends.count(fence.store_url, "resources")
    refusals_before = await backends.count(fence.store_url, "refusals")
    times = 30

    for i in range(times):
        await rate_limited(await fence.acquire_response(f"rules:made-up-{i}", holder="worker-a"))
    await counted_in_the_end(fence, 1 + times)

    assert await backends.count(fence.store_url, "resources") == resources_before
    assert await backends.count(fence.store_url, "refusals") == refusals_before
    made_up = "resource LIKE 'rules:made-up%'"
    assert await backends.count(fence.store_url, "resources", made_up) == 0
    listed = await fence.rejections()
    assert [(r["code"], r["resource"], r["count"]) for r in listed] == [
        ("rate_limited", None, 1 + times)
    ], listed


# --- with auth: the client is the subject --------------------------------------------------

CLIENT_KEY = "quota-client-key-0123456789abcdef0123"
OTHER_KEY = "other-client-key-0123456789abcdef0123"
CLIENTS = f"""\
auth:
  clients:
    - name: workers
      key_sha256: "{hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}"
      resources: ["rules:*"]
      may: [lease]
    - name: others
      key_sha256: "{hashlib.sha256(OTHER_KEY.encode()).hexdigest()}"
      resources: ["rules:*"]
      may: [lease]
"""


async def test_with_auth_a_client_is_the_subject_whatever_holders_it_names(
    make_fence: FenceFactory,
) -> None:
    """A client cannot dodge its cap by naming a new holder each time, and one
    client's leases do not count against another that names the same holder."""
    fence = await make_fence(quotas="{live_leases: 2, acquires_per_s: 0}", top_level=CLIENTS)

    async def acquire(key: str, resource: str, holder: str) -> ClientResponse:
        return await fence.client.post(
            "/_fence/v1/leases",
            json={"resource": resource, "holder": holder, "ttl_s": 30},
            headers={"Authorization": f"Bearer {key}"},
        )

    for resource, holder in (("rules:r1", "h-1"), ("rules:r2", "h-2")):
        response = await acquire(CLIENT_KEY, resource, holder)
        assert response.status == 201, await response.text()

    await rate_limited(await acquire(CLIENT_KEY, "rules:r3", "h-3"))
    response = await acquire(OTHER_KEY, "rules:r3", "h-1")
    assert response.status == 201, await response.text()
    assert await fence.rows(
        "SELECT client, count(*) FROM leases GROUP BY client ORDER BY client"
    ) == [("others", 1), ("workers", 2)]
