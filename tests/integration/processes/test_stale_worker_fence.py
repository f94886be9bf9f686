"""The stale-worker fence, end to end against real processes.

Each case drives fenceproxy (its own process) in front of the demo upstream
(another process) and checks two things: what the proxy answered, and what the
upstream itself recorded (GET /_demo/effects, /rules/..., /_demo/headers-seen
asked on the upstream directly, never through the proxy). Every refusal must
also appear in the admin rejection log, without the token or the body.
"""

from __future__ import annotations

import re
import secrets
import time

from tests.integration.processes.conftest import (
    Stack,
    assert_refused,
    assert_rejection_recorded,
    http_call,
)

TOKEN_SHAPE = re.compile(r"fpt_[A-Za-z0-9_-]{43}\Z")
SKU = "widget"
ORDER_RESOURCE = f"supplier:{SKU}"
RULE_ID = "route-eu"
RULE_RESOURCE = f"rule:{RULE_ID}"


def tampered(token: str) -> str:
    """The same token with one character of its secret part changed (still well-formed)."""
    index = len("fpt_") + 10
    replacement = "A" if token[index] != "A" else "B"
    return token[:index] + replacement + token[index + 1 :]


def test_1_grant_returns_epoch_1_and_a_token(stack: Stack) -> None:
    assert stack.lease(ORDER_RESOURCE)["epoch"] == 0

    before = time.time()
    result = stack.acquire(ORDER_RESOURCE, "worker-a", ttl_s=2)

    assert result.status == 201, result
    lease = result.body
    assert lease["resource"] == ORDER_RESOURCE
    assert lease["holder"] == "worker-a"
    assert lease["epoch"] == 1
    assert lease["ttl_s"] == 2
    assert before + 1.5 < lease["expires_at"] < time.time() + 2.5
    assert TOKEN_SHAPE.match(lease["token"]), lease["token"]
    view = stack.lease(ORDER_RESOURCE)
    assert view["epoch"] == 1
    assert view["holder"] == "worker-a"
    assert view["live"] is True
    assert lease["token"] not in str(view)
    # A grant is not an effect: nothing reached the upstream.
    assert stack.upstream_effects()["effects"] == []


def test_2_current_holder_write_reaches_upstream_with_its_epoch(stack: Stack) -> None:
    lease = stack.acquire_ok(ORDER_RESOURCE, "worker-a", ttl_s=5)
    assert stack.upstream_effects()["orders"] == 0

    result = stack.place_order(SKU, lease["token"], "order-1", qty=2)

    assert result.status == 201, result
    assert result.headers["fence-epoch"] == "1"
    assert result.body["fence_epoch"] == "1"
    upstream = stack.upstream_effects()
    assert upstream["orders"] == 1
    (effect,) = upstream["effects"]
    assert effect["kind"] == "order"
    assert effect["target"] == SKU
    assert effect["fence_epoch"] == "1"
    assert effect["idempotency_key"] == "order-1"
    assert stack.fence_token_seen() == 0
    (receipt,) = stack.proxy_effects(ORDER_RESOURCE)
    assert receipt["state"] == "COMMITTED"
    assert receipt["epoch"] == 1
    assert receipt["upstream_status"] == 201


def test_3_second_acquire_while_live_is_lease_held(stack: Stack) -> None:
    first = stack.acquire_ok(ORDER_RESOURCE, "worker-a", ttl_s=5)

    second = stack.acquire(ORDER_RESOURCE, "worker-b", ttl_s=5)

    problem = assert_refused(second, 409, "lease_held")
    assert "token" not in problem
    retry_after = int(second.headers["retry-after"])
    assert 1 <= retry_after <= 5
    view = stack.lease(ORDER_RESOURCE)
    assert (view["epoch"], view["holder"], view["live"]) == (1, "worker-a", True)
    held = assert_rejection_recorded(
        stack, ORDER_RESOURCE, "lease_held", secrets_=(first["token"],)
    )
    # worker-b held nothing when it was refused: counted, its name not kept.
    assert [r["holder"] for r in held] == [None], held
    # The holder's lease was not disturbed: it still writes, at epoch 1.
    write = stack.place_order(SKU, first["token"], "order-1")
    assert write.status == 201, write
    upstream = stack.upstream_effects()
    assert upstream["orders"] == 1
    assert [e["fence_epoch"] for e in upstream["effects"]] == ["1"]
    assert stack.fence_token_seen() == 0


def test_4_expired_lease_without_replacement_is_lease_expired(stack: Stack) -> None:
    lease = stack.acquire_ok(ORDER_RESOURCE, "worker-a", ttl_s=1.5)
    ok = stack.place_order(SKU, lease["token"], "order-1")
    assert ok.status == 201, ok
    assert stack.upstream_effects()["orders"] == 1

    view = stack.wait_not_live(ORDER_RESOURCE)
    assert view["epoch"] == 1  # nobody took over
    late = stack.place_order(SKU, lease["token"], "order-2")

    problem = assert_refused(late, 409, "lease_expired")
    assert problem["epoch"] == 1
    upstream = stack.upstream_effects()
    assert upstream["orders"] == 1
    assert [e["idempotency_key"] for e in upstream["effects"]] == ["order-1"]
    assert stack.fence_token_seen() == 0
    assert_rejection_recorded(
        stack,
        ORDER_RESOURCE,
        "lease_expired",
        secrets_=(lease["token"],),
        holder="worker-a",
        epoch=1,
    )


def test_5_takeover_then_stale_write_is_refused_and_successor_value_survives(
    stack: Stack,
) -> None:
    a = stack.acquire_ok(RULE_RESOURCE, "worker-a", ttl_s=1)
    stack.wait_not_live(RULE_RESOURCE)
    b = stack.acquire_ok(RULE_RESOURCE, "worker-b", ttl_s=5)
    assert b["epoch"] == 2
    rule_b = {"target": "pool-b", "version": 2, "by": "worker-b"}
    written = stack.put_rule(RULE_ID, b["token"], rule_b, "rule-v2")
    assert written.status == 200, written

    stale = stack.put_rule(
        RULE_ID, a["token"], {"target": "pool-a", "version": 1, "by": "worker-a"}, "rule-v1"
    )

    problem = assert_refused(stale, 409, "stale_epoch")
    assert problem["epoch"] == 1
    assert problem["current_epoch"] == 2
    current = stack.upstream_rule(RULE_ID)
    assert current.status == 200
    assert current.body["rule"] == rule_b
    history = stack.upstream_rule_history(RULE_ID)
    assert [(h["rule"], h["fence_epoch"]) for h in history] == [(rule_b, "2")]
    assert stack.upstream_effects()["rule_writes"] == 1
    assert stack.fence_token_seen() == 0
    assert_rejection_recorded(
        stack,
        RULE_RESOURCE,
        "stale_epoch",
        secrets_=(a["token"], b["token"], "pool-a"),
        holder="worker-a",
        epoch=1,
    )


def test_6_takeover_before_successors_first_write_still_refuses_stale_writer(
    stack: Stack,
) -> None:
    a = stack.acquire_ok(RULE_RESOURCE, "worker-a", ttl_s=1)
    stack.wait_not_live(RULE_RESOURCE)
    b = stack.acquire_ok(RULE_RESOURCE, "worker-b", ttl_s=5)
    assert b["epoch"] == 2

    stale = stack.put_rule(RULE_ID, a["token"], {"target": "pool-a", "by": "worker-a"})

    problem = assert_refused(stale, 409, "stale_epoch")
    assert problem["current_epoch"] == 2
    assert stack.upstream_rule(RULE_ID).status == 404
    assert stack.upstream_effects()["effects"] == []
    assert stack.fence_token_seen() == 0
    assert_rejection_recorded(
        stack,
        RULE_RESOURCE,
        "stale_epoch",
        secrets_=(a["token"], b["token"], "pool-a"),
        holder="worker-a",
        epoch=1,
    )
    # The successor is unaffected: its first write lands at epoch 2.
    rule_b = {"target": "pool-b", "by": "worker-b"}
    assert stack.put_rule(RULE_ID, b["token"], rule_b).status == 200
    history = stack.upstream_rule_history(RULE_ID)
    assert [(h["rule"], h["fence_epoch"]) for h in history] == [(rule_b, "2")]


def test_7_admin_revocation_fences_the_holder_at_once(stack: Stack) -> None:
    lease = stack.acquire_ok(ORDER_RESOURCE, "worker-a", ttl_s=30)
    assert stack.place_order(SKU, lease["token"], "order-1").status == 201

    revoked = stack.revoke(ORDER_RESOURCE, "operator: worker-a is misbehaving")
    assert revoked.status == 200, revoked
    assert (revoked.body["revoked_epoch"], revoked.body["epoch"]) == (1, 2)
    revoked_view = stack.lease(ORDER_RESOURCE)
    assert revoked_view["epoch"] == 2
    assert revoked_view["live"] is False

    after = stack.place_order(SKU, lease["token"], "order-2")

    problem = assert_refused(after, 409, "stale_epoch")
    assert problem["current_epoch"] == 2
    # No waiting was involved: the lease itself would still be valid for a long while.
    assert lease["expires_at"] - time.time() > 20
    upstream = stack.upstream_effects()
    assert upstream["orders"] == 1
    assert [e["idempotency_key"] for e in upstream["effects"]] == ["order-1"]
    assert stack.fence_token_seen() == 0
    assert_rejection_recorded(
        stack,
        ORDER_RESOURCE,
        "stale_epoch",
        secrets_=(lease["token"],),
        holder="worker-a",
        epoch=1,
    )
    # The next grant is above the revoked epoch.
    assert stack.acquire_ok(ORDER_RESOURCE, "worker-b", ttl_s=5)["epoch"] == 3


def test_7b_revocation_needs_the_admin_token(stack: Stack) -> None:
    lease = stack.acquire_ok(ORDER_RESOURCE, "worker-a", ttl_s=30)

    for headers in ({}, {"Authorization": "Bearer not-the-admin-token"}):
        refused = http_call(
            stack.proxy_url,
            "POST",
            "/_fence/v1/admin/revoke",
            json_body={"resource": ORDER_RESOURCE, "reason": "forged"},
            headers=headers,
        )
        assert_refused(refused, 401, "unauthorized")
    view = stack.lease(ORDER_RESOURCE)
    assert (view["epoch"], view["live"]) == (1, True)
    assert stack.place_order(SKU, lease["token"], "order-1").status == 201


def test_8_made_up_and_tampered_tokens_are_invalid(stack: Stack) -> None:
    lease = stack.acquire_ok(ORDER_RESOURCE, "worker-a", ttl_s=30)
    real = lease["token"]
    made_up = "fpt_" + secrets.token_urlsafe(32)
    forged = tampered(real)
    assert TOKEN_SHAPE.match(made_up) and TOKEN_SHAPE.match(forged) and forged != real

    for token in (made_up, forged):
        assert_refused(stack.place_order(SKU, token, "order-x"), 403, "invalid_token")
        assert_refused(stack.put_rule(RULE_ID, token, {"by": "forger"}), 403, "invalid_token")

    assert stack.upstream_effects()["effects"] == []
    assert stack.fence_token_seen() == 0
    assert_rejection_recorded(
        stack, ORDER_RESOURCE, "invalid_token", count=2, secrets_=(real, made_up, forged)
    )
    # Never leased: counted, and not named on the record (anyone can name resources).
    assert stack.rejections(RULE_RESOURCE) == []
    assert_rejection_recorded(stack, None, "invalid_token", count=2, secrets_=(real, forged))
    # The real token was never the problem: it writes, and a client-sent Fence-Epoch
    # header cannot claim another epoch upstream.
    ok = stack.place_order(SKU, real, "order-1", extra_headers={"Fence-Epoch": "99"})
    assert ok.status == 201, ok
    assert [e["fence_epoch"] for e in stack.upstream_effects()["effects"]] == ["1"]


def test_8b_an_epoch_1_token_never_passes_after_revocations(stack: Stack) -> None:
    """There is no epoch inside the token to invent: the epoch-1 token stays dead."""
    old = stack.acquire_ok(ORDER_RESOURCE, "worker-a", ttl_s=30)
    for reason in ("first revocation", "second revocation"):
        assert stack.revoke(ORDER_RESOURCE, reason).status == 200
    assert stack.lease(ORDER_RESOURCE)["epoch"] == 3

    refusals = [
        stack.place_order(SKU, old["token"], "order-1"),
        # Claiming the current epoch in a header changes nothing.
        stack.place_order(SKU, old["token"], "order-2", extra_headers={"Fence-Epoch": "3"}),
    ]
    new = stack.acquire_ok(ORDER_RESOURCE, "worker-c", ttl_s=30)
    assert new["epoch"] == 4
    assert new["token"] != old["token"]
    # Even while a live lease exists at epoch 4, the old token is refused.
    refusals.append(stack.place_order(SKU, old["token"], "order-3"))
    for refused in refusals:
        assert assert_refused(refused, 409, "stale_epoch")["epoch"] == 1
    assert_refused(stack.place_order(SKU, tampered(old["token"]), "order-4"), 403, "invalid_token")

    assert stack.upstream_effects()["effects"] == []
    assert stack.fence_token_seen() == 0
    assert_rejection_recorded(
        stack,
        ORDER_RESOURCE,
        "stale_epoch",
        count=3,
        secrets_=(old["token"], new["token"]),
        holder="worker-a",
        epoch=1,
    )
    assert_rejection_recorded(
        stack, ORDER_RESOURCE, "invalid_token", secrets_=(old["token"], new["token"])
    )
    # The current holder's token works, at epoch 4.
    assert stack.place_order(SKU, new["token"], "order-5").status == 201
    assert [e["fence_epoch"] for e in stack.upstream_effects()["effects"]] == ["4"]


def test_9_token_for_another_resource_is_wrong_resource(stack: Stack) -> None:
    x = stack.acquire_ok("supplier:sku-x", "worker-a", ttl_s=30)

    other_sku = stack.place_order("sku-y", x["token"], "order-1")
    other_kind = stack.put_rule(RULE_ID, x["token"], {"by": "worker-a"})

    assert_refused(other_sku, 403, "wrong_resource")
    assert_refused(other_kind, 403, "wrong_resource")
    assert stack.upstream_effects()["effects"] == []
    assert stack.lease("supplier:sku-y")["epoch"] == 0
    assert stack.fence_token_seen() == 0
    # Neither resource was ever leased: counted, and not named on the record (a name
    # the store does not know; the lease named is of another resource).
    assert_rejection_recorded(stack, None, "wrong_resource", count=2, secrets_=(x["token"],))
    # On its own resource the token is fine.
    assert stack.place_order("sku-x", x["token"], "order-2").status == 201
    assert [e["target"] for e in stack.upstream_effects()["effects"]] == ["sku-x"]


def test_10_released_token_is_stale(stack: Stack) -> None:
    lease = stack.acquire_ok(ORDER_RESOURCE, "worker-a", ttl_s=30)
    assert stack.place_order(SKU, lease["token"], "order-1").status == 201

    released = stack.release(lease["token"])
    assert released.status == 200, released
    view = stack.lease(ORDER_RESOURCE)
    assert (view["epoch"], view["live"]) == (1, False)

    reuse = stack.place_order(SKU, lease["token"], "order-2")

    problem = assert_refused(reuse, 409, "stale_epoch")
    assert problem["epoch"] == 1
    upstream = stack.upstream_effects()
    assert upstream["orders"] == 1
    assert [e["idempotency_key"] for e in upstream["effects"]] == ["order-1"]
    assert stack.fence_token_seen() == 0
    assert_rejection_recorded(
        stack,
        ORDER_RESOURCE,
        "stale_epoch",
        secrets_=(lease["token"],),
        holder="worker-a",
        epoch=1,
    )
    # Released means free at once: the next holder gets epoch 2 without waiting.
    assert stack.acquire_ok(ORDER_RESOURCE, "worker-b", ttl_s=5)["epoch"] == 2
