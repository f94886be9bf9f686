"""Idempotency keys and honest outcomes, counted from the upstream's own records."""

from __future__ import annotations

import asyncio

from aiohttp import ClientResponse

from proxy.runtime import RUNTIME
from tests.integration.app.conftest import (
    Fence,
    FenceFactory,
    Json,
    assert_problem,
    closed_port,
    json_body,
    poll_until,
)

RESOURCE = "supplier:widget"


async def idempotency_rows(fence: Fence) -> list[tuple[object, ...]]:
    return await fence.rows(
        "SELECT resource, key, effect_id FROM idempotency ORDER BY resource, key"
    )


async def wait_for_dispatching(fence: Fence, resource: str = RESOURCE) -> Json:
    """The one effect on `resource` once it is DISPATCHING (bounded polling)."""
    found: list[Json] = []

    async def dispatching() -> bool:
        found[:] = await fence.effects(resource=resource, state="DISPATCHING")
        return bool(found)

    await poll_until(dispatching, f"an effect on {resource} to be DISPATCHING")
    assert len(found) == 1
    return found[0]


async def test_retry_with_same_key_and_body_replays_the_stored_response(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)
    first = await fence.order("widget", lease["token"], "k-1", {"qty": 2})
    first_body = await first.read()
    assert first.status == 201
    assert "Idempotent-Replayed" not in first.headers

    retry = await fence.order("widget", lease["token"], "k-1", {"qty": 2})
    retry_body = await retry.read()

    assert retry.status == 201
    assert retry_body == first_body
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.headers["Content-Type"].startswith("application/json")
    assert retry.headers["Fence-Effect-Id"] == first.headers["Fence-Effect-Id"]
    assert retry.headers["Fence-Epoch"] == "1"
    assert await fence.upstream_orders() == 1
    assert len(await fence.effects()) == 1


async def test_replay_is_not_shown_to_a_stale_holder(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)
    assert (await fence.order("widget", lease["token"], "k-1")).status == 201
    await fence.revoke(RESOURCE)

    retry = await fence.order("widget", lease["token"], "k-1")

    problem = await assert_problem(retry, 409, "stale_epoch")
    assert "Idempotent-Replayed" not in retry.headers
    assert "id" not in problem and "sku" not in problem
    assert await fence.upstream_orders() == 1


async def test_same_key_with_a_different_body_is_refused(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)
    assert (await fence.order("widget", lease["token"], "k-1", {"qty": 1})).status == 201

    other = await fence.order("widget", lease["token"], "k-1", {"qty": 5})

    problem = await assert_problem(other, 422, "idempotency_key_reused")
    assert problem["effect_id"] == (await fence.effects())[0]["id"]
    assert await fence.upstream_orders() == 1
    assert [r["code"] for r in await fence.rejections()] == ["idempotency_key_reused"]


async def test_same_key_with_a_different_query_is_refused(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)
    headers = {"Fence-Token": lease["token"], "Idempotency-Key": "k-1"}
    first = await fence.client.post("/orders/widget", json={"qty": 1}, headers=headers)
    assert first.status == 201
    second = await fence.client.post("/orders/widget?x=1", json={"qty": 1}, headers=headers)
    await assert_problem(second, 422, "idempotency_key_reused")
    assert await fence.upstream_orders() == 1


async def test_key_is_scoped_per_resource(fence: Fence) -> None:
    widget = await fence.acquire("supplier:widget")
    gadget = await fence.acquire("supplier:gadget")

    first = await fence.order("widget", widget["token"], "shared-key")
    second = await fence.order("gadget", gadget["token"], "shared-key")

    assert first.status == second.status == 201
    assert "Idempotent-Replayed" not in second.headers
    upstream = await fence.demo_effects()
    assert upstream["orders"] == 2
    assert sorted(e["target"] for e in upstream["effects"]) == ["gadget", "widget"]
    assert await idempotency_rows(fence) == [
        ("supplier:gadget", "shared-key", second.headers["Fence-Effect-Id"]),
        ("supplier:widget", "shared-key", first.headers["Fence-Effect-Id"]),
    ]


async def test_upstream_4xx_is_not_committed_and_frees_the_key(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)

    refused = await fence.order("widget", lease["token"], "k-1", headers={"Demo-Status": "400"})

    assert refused.status == 400
    assert (await json_body(refused))["error"] == "demo_status"
    assert refused.headers["Fence-Effect-Id"].startswith("eff_")
    effect = await fence.effect(refused.headers["Fence-Effect-Id"])
    assert (effect["state"], effect["upstream_status"]) == ("NOT_COMMITTED", 400)
    assert await idempotency_rows(fence) == []
    assert await fence.upstream_orders() == 0

    retry = await fence.order("widget", lease["token"], "k-1")

    assert retry.status == 201
    assert "Idempotent-Replayed" not in retry.headers
    assert retry.headers["Fence-Effect-Id"] != effect["id"]
    assert await fence.upstream_orders() == 1
    states = sorted(e["state"] for e in await fence.effects(resource=RESOURCE))
    assert states == ["COMMITTED", "NOT_COMMITTED"]


async def test_unreachable_upstream_is_not_sent_and_frees_the_key(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence(upstream_url=f"http://127.0.0.1:{closed_port()}")
    lease = await fence.acquire(RESOURCE)

    first = await fence.order("widget", lease["token"], "k-1")

    problem = await assert_problem(first, 502, "upstream_unreachable")
    effect = await fence.effect(problem["effect_id"])
    assert effect["state"] == "NOT_SENT"
    assert effect["upstream_status"] is None
    assert await idempotency_rows(fence) == []
    view = await fence.lease(RESOURCE)
    assert (view["blocked"], view["in_doubt"]) == (False, [])

    # The key is free: the retry is a new effect, not a replay or "in progress".
    second = await fence.order("widget", lease["token"], "k-1")
    problem_again = await assert_problem(second, 502, "upstream_unreachable")
    assert problem_again["effect_id"] != effect["id"]
    assert [e["state"] for e in await fence.effects()] == ["NOT_SENT", "NOT_SENT"]
    assert await fence.upstream_orders() == 0


async def test_upstream_5xx_is_unknown_and_blocks_the_resource(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE, ttl_s=10)

    failed = await fence.order("widget", lease["token"], "k-1", headers={"Demo-Status": "503"})

    problem = await assert_problem(failed, 504, "outcome_unknown")
    effect_id = problem["effect_id"]
    assert failed.headers["Fence-Effect-Id"] == effect_id
    effect = await fence.effect(effect_id)
    assert (effect["state"], effect["upstream_status"]) == ("UNKNOWN", 503)
    view = await fence.lease(RESOURCE)
    assert (view["blocked"], view["in_doubt"]) == (True, [effect_id])

    # The holder itself can write nothing more, under any key.
    for key in ("k-1", "k-2"):
        blocked = await fence.order("widget", lease["token"], key)
        assert (await assert_problem(blocked, 423, "resource_blocked"))["resource"] == RESOURCE

    # Nobody takes over once the lease has expired either.
    fence.clock.advance(11)
    takeover = await fence.acquire_response(RESOURCE, holder="worker-b")
    await assert_problem(takeover, 423, "resource_blocked")
    assert (await fence.lease(RESOURCE))["epoch"] == 1
    assert await fence.upstream_orders() == 0
    assert [e["id"] for e in await fence.effects()] == [effect_id]


async def test_lost_response_is_unknown_not_failure(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)

    lost = await fence.order("widget", lease["token"], "k-1", headers={"Demo-Drop-Response": "1"})

    problem = await assert_problem(lost, 504, "outcome_unknown")
    assert await fence.upstream_orders() == 1  # the write did land upstream
    effect = await fence.effect(problem["effect_id"])
    assert effect["state"] == "UNKNOWN"
    assert effect["upstream_status"] is None
    assert (await fence.lease(RESOURCE))["blocked"] is True
    # Retrying the same key must not send the order a second time.
    retry = await fence.order("widget", lease["token"], "k-1")
    await assert_problem(retry, 423, "resource_blocked")
    assert await fence.upstream_orders() == 1


async def test_same_key_while_dispatching_is_request_in_progress(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence(timeout_s=5)
    lease = await fence.acquire(RESOURCE)
    held: asyncio.Task[ClientResponse] = asyncio.create_task(
        fence.order("widget", lease["token"], "k-1", headers={"Demo-Delay-Ms": "800"})
    )
    try:
        dispatching = await wait_for_dispatching(fence)

        second = await fence.order("widget", lease["token"], "k-1")

        problem = await assert_problem(second, 409, "request_in_progress")
        assert problem["effect_id"] == dispatching["id"]
    finally:
        first = await held
    assert first.status == 201
    assert await fence.upstream_orders() == 1
    # Once the first is done, the same request is a replay.
    third = await fence.order("widget", lease["token"], "k-1")
    assert third.status == 201
    assert third.headers["Idempotent-Replayed"] == "true"
    assert await fence.upstream_orders() == 1


async def test_other_key_while_dispatching_is_effect_in_flight(make_fence: FenceFactory) -> None:
    fence = await make_fence(timeout_s=5, max_in_flight=1)
    lease = await fence.acquire(RESOURCE)
    held: asyncio.Task[ClientResponse] = asyncio.create_task(
        fence.order("widget", lease["token"], "k-1", headers={"Demo-Delay-Ms": "800"})
    )
    try:
        dispatching = await wait_for_dispatching(fence)

        second = await fence.order("widget", lease["token"], "k-2", {"qty": 9})

        problem = await assert_problem(second, 409, "effect_in_flight")
        assert problem["in_flight"] == [dispatching["id"]]
        assert await idempotency_rows(fence) == [(RESOURCE, "k-1", dispatching["id"])]
    finally:
        first = await held
    assert first.status == 201
    assert await fence.upstream_orders() == 1
    # Nothing is dispatching now: the refused request goes through when sent again.
    again = await fence.order("widget", lease["token"], "k-2", {"qty": 9})
    assert again.status == 201
    assert await fence.upstream_orders() == 2


async def test_in_flight_limit_two_admits_a_second_request(make_fence: FenceFactory) -> None:
    fence = await make_fence(timeout_s=5, max_in_flight=2)
    lease = await fence.acquire(RESOURCE)
    held: asyncio.Task[ClientResponse] = asyncio.create_task(
        fence.order("widget", lease["token"], "k-1", headers={"Demo-Delay-Ms": "800"})
    )
    try:
        await wait_for_dispatching(fence)
        second = await fence.order("widget", lease["token"], "k-2")
        assert second.status == 201
    finally:
        first = await held
    assert first.status == 201
    assert await fence.upstream_orders() == 2


async def test_garbage_collection_frees_expired_keys(fence: Fence) -> None:
    store = fence.app[RUNTIME].store
    lease = await fence.acquire(RESOURCE, ttl_s=30)
    assert (await fence.order("widget", lease["token"], "k-1", {"qty": 1})).status == 201

    assert await store.collect_garbage() == 0  # still within retain_s (60)
    assert len(await idempotency_rows(fence)) == 1

    fence.clock.advance(61)
    assert await store.collect_garbage() == 1
    assert await idempotency_rows(fence) == []

    # The key now names a new operation: a different body is not "reused".
    renewed = await fence.acquire(RESOURCE, ttl_s=30)
    assert renewed["epoch"] == 2
    response = await fence.order("widget", renewed["token"], "k-1", {"qty": 7})
    assert response.status == 201
    assert "Idempotent-Replayed" not in response.headers
    upstream = await fence.demo_effects()
    assert upstream["orders"] == 2
    assert len(await idempotency_rows(fence)) == 1


async def test_garbage_collection_keeps_keys_of_unknown_effects(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)
    failed = await fence.order("widget", lease["token"], "k-1", headers={"Demo-Status": "503"})
    await assert_problem(failed, 504, "outcome_unknown")

    fence.clock.advance(61)

    assert await fence.store.collect_garbage() == 0
    assert len(await idempotency_rows(fence)) == 1


async def test_lease_shorter_than_upstream_timeout_is_refused(fence: Fence) -> None:
    short = await fence.acquire(RESOURCE, ttl_s=0.5)  # upstream timeout_s is 1

    response = await fence.order("widget", short["token"], "k-1")

    problem = await assert_problem(response, 409, "lease_too_short")
    assert problem["epoch"] == 1
    # What the client needs to size its lease: the route's timeout, and what was left.
    assert problem["needed_s"] == 1
    assert 0 < problem["remaining_s"] <= 0.5
    assert await fence.upstream_orders() == 0
    assert await fence.effects() == []
    assert await idempotency_rows(fence) == []


async def test_lease_running_out_before_upstream_timeout_is_refused(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE, ttl_s=5)
    # 1.5 s left (less whatever PostgreSQL's own clock runs on meanwhile): enough for
    # the upstream timeout of 1 s.
    fence.clock.advance(3.5)
    assert (await fence.order("widget", lease["token"], "k-1")).status == 201

    fence.clock.advance(0.9)  # 0.6 s left, the upstream timeout is 1 s
    response = await fence.order("widget", lease["token"], "k-2")

    await assert_problem(response, 409, "lease_too_short")
    assert await fence.upstream_orders() == 1
