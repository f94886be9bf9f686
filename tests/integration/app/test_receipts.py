"""Effect receipts, the headers on both sides of the proxy, and the lease lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

from proxy.requests import fingerprint
from tests.integration.app.conftest import (
    Fence,
    FenceFactory,
    assert_problem,
    json_body,
    poll_until,
)

RESOURCE = "supplier:widget"
EFFECT_FIELDS = {
    "id",
    "route",
    "resource",
    "holder",
    "epoch",
    "idempotency_key",
    "fingerprint",
    "method",
    "path",
    "state",
    "instance_id",
    "created_at",
    "deadline",
    "finished_at",
    "upstream_status",
    "reason",
}


async def test_effect_receipt_records_the_whole_story(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE, holder="worker-a")
    fence.clock.advance(2)
    dispatched_at = fence.clock.now
    body = {"qty": 4}

    response = await fence.order("widget", lease["token"], "k-1", body)

    assert response.status == 201
    order = await json_body(response)
    effect_id = response.headers["Fence-Effect-Id"]
    assert re.fullmatch(r"eff_[0-9a-f]{32}", effect_id)
    effect = await fence.effect(effect_id)
    assert set(effect) >= EFFECT_FIELDS
    assert effect == {
        **effect,
        "id": effect_id,
        "route": "place-order",
        "resource": RESOURCE,
        "holder": "worker-a",
        "epoch": 1,
        "idempotency_key": "k-1",
        "fingerprint": fingerprint("POST", "/orders/widget", "", json.dumps(body).encode()),
        "method": "POST",
        "path": "/orders/widget",
        "state": "COMMITTED",
        "created_at": fence.clock.approx(dispatched_at),
        # In flight until its send window (0.5 s) and upstream timeout (1 s) are over.
        "deadline": effect["created_at"] + 1.5,
        "finished_at": fence.clock.approx(dispatched_at),
        "upstream_status": 201,
    }
    assert effect["finished_at"] >= effect["created_at"]
    assert effect["instance_id"]
    assert "201" in effect["reason"]
    listed = await fence.effects()
    assert [{name: e[name] for name in EFFECT_FIELDS} for e in listed] == [
        {name: effect[name] for name in EFFECT_FIELDS}
    ]
    assert order["idempotency_key"] == "k-1"  # forwarded unchanged


async def test_effect_lookup_of_unknown_id_is_404(fence: Fence) -> None:
    response = await fence.client.get("/_fence/v1/effects/eff_nothing", headers=fence.admin)
    await assert_problem(response, 404, "not_found")


async def test_effect_filters_by_resource_and_state(fence: Fence) -> None:
    widget = await fence.acquire("supplier:widget")
    gadget = await fence.acquire("supplier:gadget")
    ok_widget = await fence.order("widget", widget["token"], "k-1")
    refused_widget = await fence.order(
        "widget", widget["token"], "k-2", headers={"Demo-Status": "409"}
    )
    ok_gadget = await fence.order("gadget", gadget["token"], "k-1")
    assert (ok_widget.status, refused_widget.status, ok_gadget.status) == (201, 409, 201)
    ids = {
        "ok_widget": ok_widget.headers["Fence-Effect-Id"],
        "refused_widget": refused_widget.headers["Fence-Effect-Id"],
        "ok_gadget": ok_gadget.headers["Fence-Effect-Id"],
    }

    async def effect_ids(**query: str) -> set[str]:
        return {effect["id"] for effect in await fence.effects(**query)}

    assert await effect_ids() == set(ids.values())
    assert await effect_ids(resource="supplier:widget") == {
        ids["ok_widget"],
        ids["refused_widget"],
    }
    assert await effect_ids(resource="supplier:gadget") == {ids["ok_gadget"]}
    assert await effect_ids(state="COMMITTED") == {ids["ok_widget"], ids["ok_gadget"]}
    assert await effect_ids(state="NOT_COMMITTED") == {ids["refused_widget"]}
    assert await effect_ids(resource="supplier:gadget", state="NOT_COMMITTED") == set()
    assert await effect_ids(resource="supplier:nothing") == set()
    assert len(await fence.effects(limit="1")) == 1


async def test_fence_headers_on_the_workers_response(fence: Fence) -> None:
    await fence.acquire(RESOURCE)
    await fence.revoke(RESOURCE)
    lease = await fence.acquire(RESOURCE)  # epoch 3
    assert lease["epoch"] == 3

    response = await fence.order("widget", lease["token"], "k-1")

    assert response.status == 201
    assert response.headers["Fence-Epoch"] == "3"
    assert response.headers["Fence-Resource"] == RESOURCE
    effect = await fence.effect(response.headers["Fence-Effect-Id"])
    assert effect["epoch"] == 3


async def test_fence_headers_on_an_error_outcome(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)
    response = await fence.order("widget", lease["token"], "k-1", headers={"Demo-Status": "422"})
    assert response.status == 422
    assert response.headers["Fence-Epoch"] == "1"
    assert response.headers["Fence-Resource"] == RESOURCE
    assert response.headers["Fence-Effect-Id"].startswith("eff_")


async def test_token_never_reaches_the_upstream_and_hop_by_hop_headers_are_stripped(
    fence: Fence,
) -> None:
    lease = await fence.acquire(RESOURCE)
    rule_lease = await fence.acquire("rules:r1")
    headers = {
        "Connection": "keep-alive, X-Hop-Secret",
        "X-Hop-Secret": "hop",
        "Keep-Alive": "timeout=5",
        "Proxy-Authorization": "Basic c2VjcmV0",
        "TE": "trailers",
        "X-Forwarded-For": "203.0.113.7",
        "Forwarded": "for=203.0.113.7",
        "X-Custom": "kept",
        "Fence-Epoch": "999",
    }

    order = await fence.order("widget", lease["token"], "k-1", headers=headers)
    assert order.status == 201
    seen = (await fence.headers_seen())["last_headers"]

    assert "fence-token" not in seen
    assert lease["token"] not in json.dumps(seen)
    for hop in ("x-hop-secret", "keep-alive", "proxy-authorization", "te"):
        assert hop not in seen, hop
    assert seen["x-custom"] == "kept"
    assert seen["idempotency-key"] == "k-1"
    # The worker's own forwarding headers pass unchanged; the proxy adds none.
    assert seen["x-forwarded-for"] == "203.0.113.7"
    assert seen["forwarded"] == "for=203.0.113.7"
    # Fence-Epoch is the proxy's to set upstream: a worker's own copy is dropped.
    assert "fence-epoch" not in seen
    assert (await json_body(order))["fence_epoch"] is None

    rule = await fence.client.put(
        "/rules/r1", json={"route": "a"}, headers={"Fence-Token": rule_lease["token"]}
    )
    assert rule.status == 200
    seen = (await fence.headers_seen())["last_headers"]
    assert "fence-token" not in seen
    assert "x-forwarded-for" not in seen and "forwarded" not in seen
    assert (await fence.headers_seen())["fence_token_seen"] == 0


async def test_route_with_forward_fence_headers_sends_the_epoch(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence(forward_fence_headers=True)
    await fence.acquire(RESOURCE)
    await fence.revoke(RESOURCE)
    lease = await fence.acquire(RESOURCE)

    response = await fence.order(
        "widget", lease["token"], "k-1", headers={"Fence-Epoch": "999", "Fence-Resource": "x"}
    )

    assert response.status == 201
    assert (await json_body(response))["fence_epoch"] == "3"
    seen = (await fence.headers_seen())["last_headers"]
    assert seen["fence-epoch"] == "3"
    assert seen["fence-resource"] == RESOURCE
    assert seen["fence-effect-id"] == response.headers["Fence-Effect-Id"]
    assert "fence-token" not in seen
    orders = (await fence.demo_effects())["effects"]
    assert [o["fence_epoch"] for o in orders] == ["3"]


async def test_pass_through_get_needs_no_token(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)
    assert (await fence.order("widget", lease["token"], "k-1", {"qty": 3})).status == 201

    listing = await fence.client.get("/orders/widget")
    by_key = await fence.client.get("/orders/by-key/k-1")
    missing = await fence.client.get("/orders/by-key/nope")

    assert listing.status == 200
    orders = (await json_body(listing))["orders"]
    assert [(o["sku"], o["qty"]) for o in orders] == [("widget", 3)]
    assert by_key.status == 200
    assert (await json_body(by_key))["idempotency_key"] == "k-1"
    assert missing.status == 404  # the upstream's own answer, passed through
    assert "Fence-Epoch" not in listing.headers
    assert len(await fence.effects()) == 1  # reads are not effects


async def test_renew_extends_the_lease(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE, ttl_s=5)
    token = lease["token"]
    fence.clock.advance(3)

    renewed = await fence.client.post(
        "/_fence/v1/leases/renew", json={"ttl_s": 10}, headers={"Fence-Token": token}
    )

    body = await json_body(renewed)
    assert renewed.status == 200, body
    assert body["epoch"] == lease["epoch"]
    assert body["expires_at"] == fence.clock.approx(fence.clock.now + 10)
    assert "token" not in body
    fence.clock.advance(8)  # 11 s after the grant: the original lease would be over
    view = await fence.lease(RESOURCE)
    assert view["live"] is True
    assert (await fence.order("widget", token, "k-1")).status == 201


async def test_renewing_an_expired_lease_is_refused(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE, ttl_s=5)
    fence.clock.advance(5.5)

    renewed = await fence.client.post(
        "/_fence/v1/leases/renew", json={}, headers={"Fence-Token": lease["token"]}
    )

    problem = await assert_problem(renewed, 409, "lease_expired")
    assert problem["epoch"] == 1
    assert (await fence.lease(RESOURCE))["live"] is False
    write = await fence.order("widget", lease["token"], "k-1")
    await assert_problem(write, 409, "lease_expired")
    assert await fence.upstream_orders() == 0


async def test_release_then_another_holder_gets_the_next_epoch(fence: Fence) -> None:
    first = await fence.acquire(RESOURCE, holder="worker-a")
    held = await fence.acquire_response(RESOURCE, holder="worker-b")
    await assert_problem(held, 409, "lease_held")
    assert "Retry-After" in held.headers

    released = await fence.client.post(
        "/_fence/v1/leases/release", headers={"Fence-Token": first["token"]}
    )
    assert released.status == 200
    assert (await json_body(released))["released"] is True
    assert (await fence.lease(RESOURCE))["live"] is False

    second = await fence.acquire(RESOURCE, holder="worker-b")

    assert second["epoch"] == first["epoch"] + 1
    assert second["token"] != first["token"]
    view = await fence.lease(RESOURCE)
    assert (view["holder"], view["epoch"], view["live"]) == ("worker-b", 2, True)
    assert "token" not in view
    stale = await fence.order("widget", first["token"], "k-1")
    problem = await assert_problem(stale, 409, "stale_epoch")
    assert (problem["epoch"], problem["current_epoch"]) == (1, 2)
    assert (await fence.order("widget", second["token"], "k-1")).status == 201
    assert await fence.upstream_orders() == 1


async def test_revoke_makes_the_old_token_stale_at_once(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)

    revoked = await fence.revoke(RESOURCE, reason="worker paused")

    assert (revoked["revoked_epoch"], revoked["epoch"]) == (1, 2)
    write = await fence.order("widget", lease["token"], "k-1")
    problem = await assert_problem(write, 409, "stale_epoch")
    assert problem["current_epoch"] == 2
    renew = await fence.client.post(
        "/_fence/v1/leases/renew", json={}, headers={"Fence-Token": lease["token"]}
    )
    await assert_problem(renew, 409, "stale_epoch")
    assert await fence.upstream_orders() == 0
    successor = await fence.acquire(RESOURCE, holder="worker-b")
    assert successor["epoch"] == 3
    codes = [r["code"] for r in await fence.rejections(resource=RESOURCE)]
    assert codes == ["stale_epoch", "stale_epoch"]


async def test_epochs_survive_a_store_restart(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE, ttl_s=5)
    assert (await fence.order("widget", lease["token"], "k-1")).status == 201
    await fence.revoke(RESOURCE)  # epoch 2, no lease
    other = await fence.acquire("supplier:gadget", ttl_s=5)

    restarted = await fence.restart()
    restarted.clock.advance(6)

    assert (await restarted.lease(RESOURCE))["epoch"] == 2
    again = await restarted.acquire(RESOURCE)
    assert again["epoch"] == 3
    stale = await restarted.order("widget", lease["token"], "k-2")
    await assert_problem(stale, 409, "stale_epoch")
    gadget = await restarted.acquire("supplier:gadget", holder="worker-b")
    assert gadget["epoch"] == other["epoch"] + 1
    old_gadget = await restarted.order("gadget", other["token"], "k-3")
    await assert_problem(old_gadget, 409, "stale_epoch")
    # The committed response is still there to replay after the restart.
    replay = await restarted.order("widget", again["token"], "k-1")
    assert replay.status == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert len(await restarted.effects(state="COMMITTED")) == 1
    assert await restarted.upstream_orders() == 1


async def test_a_handler_cancelled_mid_send_records_its_receipt_first(
    make_fence: FenceFactory,
) -> None:
    """aiohttp's test server cancels a handler whose client goes away (`serve`'s does not:
    tests/integration/processes/test_shutdown.py). Cancelled while the upstream holds its
    write, the dispatch, which runs in the handler's own task, is cut off; its receipt
    is still written before the cancellation goes on: UNKNOWN (the write may have been
    applied), with why, not DISPATCHING until a sweep."""
    fence = await make_fence(timeout_s=5)
    lease = await fence.acquire(RESOURCE, holder="worker-a")
    sent = asyncio.create_task(
        fence.order("widget", lease["token"], "k-cut", headers={"Demo-Delay-Ms": "3000"})
    )

    async def upstream_holds_it() -> bool:
        seen = await fence.headers_seen()
        return bool(seen["last_headers"].get("idempotency-key") == "k-cut")

    await poll_until(upstream_holds_it, "the write to reach the upstream")
    sent.cancel()  # the worker goes away: its connection closes
    with contextlib.suppress(asyncio.CancelledError):
        await sent
    effects: list[dict[str, object]] = []

    async def receipt_written() -> bool:
        effects[:] = await fence.effects(resource=RESOURCE)
        return len(effects) == 1 and effects[0]["state"] != "DISPATCHING"

    await poll_until(receipt_written, "the cut dispatch's receipt", attempts=100)
    (effect,) = effects
    assert effect["state"] == "UNKNOWN", effect
    assert effect["reason"] == (
        "outcome unknown: the request's handler was cancelled before the answer arrived"
    ), effect
