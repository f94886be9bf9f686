"""Unknown outcomes with real processes: killed workers, a killed proxy, lost responses.

Every case runs the demo upstream, fenceproxy and (where a worker matters) worker.py
as separate OS processes, delivers real signals to them (os.kill: SIGKILL, SIGSTOP,
SIGCONT, SIGTERM) and judges by the upstream's OWN records: its order count
(GET /_demo/effects) and the mutations that reached it at all (read from its own
SQLite file). Each docstring names the signal used and the rule the case proves.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import pytest

from tests.integration.processes.conftest import (
    BackgroundCall,
    ReconcileBlock,
    Stack,
    WorkerProcess,
    assert_refused,
    assert_rejection_recorded,
    http_call,
    wait_until,
)

EVENT_TIMEOUT_S = 15.0
# Worker a's lease. It must outlast what comes between a's grant and the replacement's
# first ask, which must be refused: a's decision and send (its write admitted with the
# upstream timeout still left on the lease), the signals, and b's start, a new Python
# process. At load 9 that took up to 1.2 s of a 1.5 s lease, and once all of it.
SHORT_TTL_S = 4.0
LONG_TTL_S = 10.0
ORDER = {"qty": 3}


def order_path(sku: str) -> str:
    return f"/orders/{sku}"


def resource_of(sku: str) -> str:
    return f"supplier:{sku}"


def new_key(label: str) -> str:
    return f"{label}-{secrets.token_hex(6)}"


def compact(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"))


def only_effect(stack: Stack, resource: str) -> dict[str, Any]:
    effects = stack.proxy_effects(resource)
    assert len(effects) == 1, effects
    return effects[0]


def wait_effect(stack: Stack, effect_id: str, state: str, timeout_s: float) -> dict[str, Any]:
    """Poll the admin receipt until the effect is in `state`; the receipt with events."""
    seen: list[dict[str, Any]] = []

    def reached() -> bool:
        seen.append(stack.effect(effect_id))
        return bool(seen[-1]["state"] == state)

    wait_until(f"effect {effect_id} to be {state}", reached, timeout_s)
    return seen[-1]


def spawn_order_worker(
    stack: Stack,
    name: str,
    sku: str,
    *,
    ttl_s: float,
    acquire_timeout_s: float = 0.0,
    headers: dict[str, str] | None = None,
) -> WorkerProcess:
    return stack.spawn_worker(
        name,
        resource=resource_of(sku),
        holder=f"worker-{name}",
        ttl_s=ttl_s,
        method="POST",
        path=order_path(sku),
        acquire_timeout_s=acquire_timeout_s,
        headers=headers,
    )


def replacement_after_expiry(
    stack: Stack, sku: str, first: dict[str, Any]
) -> tuple[WorkerProcess, dict[str, Any]]:
    """Worker b asks at once and keeps asking (lease_held) until the first lease expires."""
    b = spawn_order_worker(
        stack, "b", sku, ttl_s=LONG_TTL_S, acquire_timeout_s=SHORT_TTL_S + EVENT_TIMEOUT_S
    )
    granted, refused = b.wait_event("acquired", SHORT_TTL_S + EVENT_TIMEOUT_S)
    assert granted["epoch"] == 2, granted
    # Granted only after the real expiry of the first lease, and refused until then.
    assert granted["expires_at"] - granted["ttl_s"] >= first["expires_at"] - 1e-3
    assert refused, "the replacement should have been refused while the first lease was live"
    assert {(r["status"], r["code"]) for r in refused} == {(409, "lease_held")}
    return b, granted


# -- 1. a worker dies between approving its operation and (not) hearing back ----------------


@pytest.mark.fence_stack(upstream_timeout_s=1.0)
def test_worker_sigkilled_before_sending_replacement_sends_same_key_once(stack: Stack) -> None:
    """Signal: SIGKILL on worker a after it acquired (epoch 1) and decided its operation
    (printed its Idempotency-Key) but before it sent anything. Proves: the dead worker's
    lease still guards the resource until its real expiry; the replacement (epoch 2)
    carries on the same operation under the same key; the upstream holds exactly one order,
    made under epoch 2."""
    sku = "kill-before-send"
    a = spawn_order_worker(stack, "a", sku, ttl_s=SHORT_TTL_S)
    a_granted, _ = a.wait_event("acquired", EVENT_TIMEOUT_S)
    assert a_granted["epoch"] == 1
    a.send(f"decide {compact(ORDER)} {new_key('order')}")
    decided, _ = a.wait_event("decided", EVENT_TIMEOUT_S)
    assert decided["epoch"] == 1

    a.kill()

    assert not any('"wrote"' in line for line in a.transcript)
    assert stack.upstream_mutations_received() == 0
    assert stack.proxy_effects(resource_of(sku)) == []
    view = stack.lease(resource_of(sku))
    # Death releases nothing: only the lease's own expiry (or a revoke) ends it.
    assert (view["epoch"], view["holder"]) == (1, "worker-a")

    b, _ = replacement_after_expiry(stack, sku, a_granted)
    b.send(f"write {decided['body']} {decided['idempotency_key']}")
    wrote, _ = b.wait_event("wrote", EVENT_TIMEOUT_S)

    assert (wrote["status"], wrote["fence_epoch"], wrote["replayed"]) == (201, "2", None), wrote
    upstream = stack.upstream_effects()
    assert upstream["orders"] == 1
    assert [(e["idempotency_key"], e["fence_epoch"]) for e in upstream["effects"]] == [
        (decided["idempotency_key"], "2")
    ]
    assert stack.upstream_mutations_received() == 1
    receipt = only_effect(stack, resource_of(sku))
    assert (receipt["holder"], receipt["epoch"], receipt["state"]) == ("worker-b", 2, "COMMITTED")


# Worker a must be stopped before the upstream answers: within the write's delay of its
# arrival, which the test polls for. Within the upstream timeout, so the answer, not a
# probe, settles the effect.
HELD_WRITE_MS = 1000


@pytest.mark.fence_stack(upstream_timeout_s=2.0)
def test_worker_sigkilled_after_its_write_committed_replacement_gets_replay(
    stack: Stack,
) -> None:
    """Signals: SIGSTOP on worker a while its write (Demo-Delay-Ms 1000) is held by the
    upstream, then SIGKILL once the upstream has committed it, so the 201 is lost with the
    process. Proves: the replacement (epoch 2) sending the same operation under the same
    Idempotency-Key gets a stored replay (Idempotent-Replayed: true, the original order),
    nothing reaches the upstream again, and it still holds exactly one order."""
    sku = "kill-after-commit"
    a = spawn_order_worker(
        stack, "a", sku, ttl_s=SHORT_TTL_S, headers={"Demo-Delay-Ms": str(HELD_WRITE_MS)}
    )
    a_granted, _ = a.wait_event("acquired", EVENT_TIMEOUT_S)
    a.send(f"decide {compact(ORDER)} {new_key('order')}")
    decided, _ = a.wait_event("decided", EVENT_TIMEOUT_S)
    a.send("send")
    wait_until(
        "a's write to reach the upstream", lambda: stack.upstream_mutations_received() == 1, 5
    )
    a.pause()
    wait_until("the upstream to commit a's order", lambda: stack.upstream_orders() == 1, 5)
    receipt = wait_effect(stack, only_effect(stack, resource_of(sku))["id"], "COMMITTED", 5)
    a.kill()

    assert not any('"wrote"' in line for line in a.transcript), "a must never see its 201"
    assert (receipt["holder"], receipt["epoch"]) == ("worker-a", 1)

    b, _ = replacement_after_expiry(stack, sku, a_granted)
    b.send(f"write {decided['body']} {decided['idempotency_key']}")
    wrote, _ = b.wait_event("wrote", EVENT_TIMEOUT_S)

    assert (wrote["status"], wrote["replayed"]) == (201, "true"), wrote
    # The replay is a's own receipt: its order, made under epoch 1.
    assert wrote["fence_epoch"] == "1"
    assert wrote["body"]["idempotency_key"] == decided["idempotency_key"]
    assert stack.upstream_orders() == 1
    assert http_call(stack.upstream_url, "GET", order_path(sku)).body["orders"] == [wrote["body"]]
    assert stack.upstream_mutations_received() == 1
    assert [e["id"] for e in stack.proxy_effects(resource_of(sku))] == [receipt["id"]]


# -- 2. a live stale worker ---------------------------------------------------------------


def test_stopped_worker_resumes_after_successor_wrote_and_is_refused(stack: Stack) -> None:
    """Signals: SIGSTOP on worker a (epoch 1) with its write queued in its stdin, held
    past its lease expiry; SIGCONT after the replacement (epoch 2) committed its order.
    Proves: the stale worker's write is refused 409 stale_epoch, recorded in the rejection
    log, and the upstream's order count is unchanged by it."""
    sku = "stale-live"
    a = spawn_order_worker(stack, "a", sku, ttl_s=SHORT_TTL_S)
    a_granted, _ = a.wait_event("acquired", EVENT_TIMEOUT_S)
    a.pause()
    a.write({"qty": 1, "by": "a"}, new_key("a"))

    b, b_granted = replacement_after_expiry(stack, sku, a_granted)
    b_key = new_key("b")
    b.write({"qty": 2, "by": "b"}, b_key)
    b_wrote, _ = b.wait_event("wrote", EVENT_TIMEOUT_S)
    assert (b_wrote["status"], b_wrote["fence_epoch"]) == (201, "2"), b_wrote
    assert stack.upstream_orders() == 1

    a.resume()
    a_wrote, _ = a.wait_event("wrote", EVENT_TIMEOUT_S)

    assert (a_wrote["status"], a_wrote["code"]) == (409, "stale_epoch"), a_wrote
    assert (a_wrote["body"]["epoch"], a_wrote["body"]["current_epoch"]) == (1, 2)
    upstream = stack.upstream_effects()
    assert upstream["orders"] == 1
    assert [(e["idempotency_key"], e["fence_epoch"]) for e in upstream["effects"]] == [(b_key, "2")]
    assert stack.upstream_mutations_received() == 1
    assert_rejection_recorded(
        stack,
        resource_of(sku),
        "stale_epoch",
        secrets_=(a_granted["token"], b_granted["token"]),
        holder="worker-a",
        epoch=1,
    )


# -- 3. the proxy dies while the upstream holds a slow write --------------------------------

SLOW_MS = 1500
SLOW_TIMEOUT_S = 3.0
# Longer than the write's delay plus the time the upstream is held stopped below, so an
# early 404 is never believed; a 200 settles the effect whenever it comes.
SLOW_SETTLE_S = 4.0


@pytest.mark.fence_stack(
    upstream_timeout_s=SLOW_TIMEOUT_S,
    reconcile=ReconcileBlock(settle_s=SLOW_SETTLE_S, attempts=6),
)
def test_proxy_sigkilled_mid_request_restart_blocks_until_probe_settles_committed(
    stack: Stack, record_property: Any
) -> None:
    """Signals: SIGKILL on the proxy while the upstream holds the write (Demo-Delay-Ms
    1500, upstream timeout 3 s); SIGSTOP on the upstream from the kill until the restarted
    proxy (same store, same FENCEPROXY_INSTANCE_ID) has been looked at, then SIGCONT, so
    the upstream commits the write strictly after that look however slow the restart.
    Proves: startup recovery turned the DISPATCHING effect into UNKNOWN (a "recover" event
    by this instance) before the listener opened; the resource is blocked (lease view,
    423 on acquire and on a retry of the key) until the probe settles it COMMITTED; the
    upstream holds exactly one order and a retry of the key afterwards is a replay.
    Prints restart-to-settled and kill-to-settled times."""
    sku = "proxy-crash"
    resource = resource_of(sku)
    lease = stack.acquire_ok(resource, "worker-a", ttl_s=SLOW_TIMEOUT_S + 1.5)
    key = new_key("slow")
    call = BackgroundCall(
        "slow write",
        lambda: stack.place_order(
            sku, lease["token"], key, extra_headers={"Demo-Delay-Ms": str(SLOW_MS)}
        ),
    )
    wait_until(
        "the write to reach the upstream", lambda: stack.upstream_mutations_received() == 1, 5
    )
    effect_id = only_effect(stack, resource)["id"]

    stack.kill_proxy()
    killed_at = time.monotonic()
    stack.pause_upstream()
    assert isinstance(call.outcome(5.0), OSError), "the caller cannot have had an answer"
    restarted_at = stack.restart_proxy()
    ready_at = time.monotonic()

    # The first look after the restart, while the upstream still holds the write.
    receipt = stack.effect(effect_id)
    assert receipt["state"] == "UNKNOWN", receipt
    assert receipt["instance_id"] == stack.instance_id
    recover = [e for e in receipt["events"] if e["kind"] == "recover"]
    assert [(e["conclusion"], e["actor"]) for e in recover] == [("unknown", stack.instance_id)]
    assert "restarted" in recover[0]["detail"], recover
    view = stack.lease(resource)
    assert (view["blocked"], view["in_doubt"]) == (True, [effect_id]), view
    blocked_retry = stack.place_order(sku, lease["token"], key)
    assert_refused(blocked_retry, 423, "resource_blocked")
    assert stack.release(lease["token"]).status == 200
    takeover = stack.acquire(resource, "worker-b", ttl_s=5)
    problem = assert_refused(takeover, 423, "resource_blocked")
    assert effect_id in problem["effect_ids"]
    assert stack.effect(effect_id)["state"] == "UNKNOWN"
    assert stack.upstream_orders_on_disk() == 0
    stack.resume_upstream()
    resumed_at = time.monotonic()

    settled = wait_effect(stack, effect_id, "COMMITTED", SLOW_SETTLE_S + 10)
    settled_at = time.monotonic()
    assert settled["settled_by"] == "probe", settled
    probes = [e for e in settled["events"] if e["kind"] == "probe"]
    assert (probes[-1]["conclusion"], probes[-1]["upstream_status"]) == ("committed", 200)
    assert all(p["conclusion"] == "inconclusive" for p in probes[:-1]), probes
    assert stack.upstream_orders() == 1
    view = stack.lease(resource)
    assert (view["blocked"], view["in_doubt"]) == (False, []), view

    successor = stack.acquire_ok(resource, "worker-b", ttl_s=5)
    assert successor["epoch"] == 2
    replay = stack.place_order(sku, successor["token"], key)
    assert (replay.status, replay.headers.get("idempotent-replayed")) == (200, "true"), replay
    assert (replay.body["state"], replay.body["settled_by"]) == ("COMMITTED", "probe")
    assert stack.upstream_orders() == 1
    assert stack.upstream_mutations_received() == 1

    figures = {
        "restart_to_ready_s": round(ready_at - restarted_at, 3),
        "upstream_held_s": round(resumed_at - killed_at, 3),
        "restart_to_settled_s": round(settled_at - restarted_at, 3),
        "kill_to_settled_s": round(settled_at - killed_at, 3),
        "dispatch_to_settled_s": round(probes[-1]["at"] - settled["created_at"], 3),
        "probes": len(probes),
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"\nproxy SIGKILL -> probe settled COMMITTED: {figures}")


# -- 4. the upstream commits and the response is lost ----------------------------------------


def test_lost_response_blocks_until_operator_resolves_then_retry_replays(stack: Stack) -> None:
    """Signal: none to a process; the upstream commits and aborts the TCP connection
    (Demo-Drop-Response: 1) on a route without a reconcile block. Proves: 504
    outcome_unknown; the resource stays blocked after the lease's real expiry (423 with
    the effect id); the installed `fenceproxy reconcile list/resolve` commands see and
    settle it; then a new holder takes over and a retry of the key is a replay that never
    reaches the upstream (its count stays 1); `effects show` keeps the operator's
    decision."""
    sku = "lost-response"
    resource = resource_of(sku)
    lease = stack.acquire_ok(resource, "worker-a", ttl_s=1.0)
    key = new_key("lost")

    lost = stack.place_order(sku, lease["token"], key, extra_headers={"Demo-Drop-Response": "1"})

    problem = assert_refused(lost, 504, "outcome_unknown")
    effect_id = problem["effect_id"]
    assert stack.upstream_orders() == 1
    stack.wait_not_live(resource)
    view = stack.lease(resource)
    assert (view["blocked"], view["in_doubt"]) == (True, [effect_id]), view
    refused = assert_refused(stack.acquire(resource, "worker-b", ttl_s=5), 423, "resource_blocked")
    assert refused["effect_ids"] == [effect_id]

    listing = stack.cli_json("reconcile", "list")
    assert listing["blocked_resources"] == [resource], listing
    (entry,) = [e for e in listing["in_doubt"] if e["id"] == effect_id]
    assert (entry["state"], entry["route"], entry["resource"]) == (
        "UNKNOWN",
        "place-order",
        resource,
    )
    assert (entry["holder"], entry["epoch"], entry["idempotency_key"]) == ("worker-a", 1, key)

    resolved = stack.cli(
        "reconcile",
        "resolve",
        effect_id,
        "--outcome",
        "committed",
        "--reason",
        "seen upstream",
        "--operator",
        "test",
    )
    assert resolved.returncode == 0, (resolved.stdout, resolved.stderr)

    assert stack.lease(resource)["blocked"] is False
    successor = stack.acquire_ok(resource, "worker-b", ttl_s=5)
    assert successor["epoch"] == 2
    retry = stack.place_order(sku, successor["token"], key)
    assert (retry.status, retry.headers.get("idempotent-replayed")) == (200, "true"), retry
    assert (retry.body["state"], retry.body["settled_by"]) == ("COMMITTED", "operator:test")
    assert stack.upstream_orders() == 1
    assert stack.upstream_mutations_received() == 1

    shown = stack.cli_json("effects", "show", effect_id)
    assert (shown["state"], shown["settled_by"]) == ("COMMITTED", "operator:test"), shown
    decisions = [e for e in shown["events"] if e["kind"] == "resolve"]
    assert [(e["actor"], e["conclusion"], e["detail"]) for e in decisions] == [
        ("operator:test", "committed", "seen upstream")
    ]


# -- 5. epochs survive a restart --------------------------------------------------------------


def test_restart_keeps_epochs_old_tokens_stay_refused(stack: Stack) -> None:
    """Signals: SIGKILL on the proxy, restart; later SIGTERM on the proxy, restart (same
    store, same FENCEPROXY_INSTANCE_ID). Proves: a lease granted before a restart is still
    the current one after it; once superseded (by an admin revoke, or by expiry and a new
    acquire) its token is refused 409 stale_epoch across restarts; every new acquisition
    gets an epoch higher than any before the restart; no refused write reaches the
    upstream."""
    sku = "epochs"
    resource = resource_of(sku)
    first = stack.acquire_ok(resource, "worker-a", ttl_s=30)
    assert first["epoch"] == 1

    stack.kill_proxy()
    stack.restart_proxy()

    view = stack.lease(resource)
    assert (view["epoch"], view["holder"], view["live"]) == (1, "worker-a", True)
    written = stack.place_order(sku, first["token"], new_key("a"))
    assert (written.status, written.headers.get("fence-epoch")) == (201, "1"), written
    revoked = stack.revoke(resource, "process test")
    assert revoked.status == 200, revoked
    assert revoked.body["epoch"] == 2, revoked
    refused = assert_refused(
        stack.place_order(sku, first["token"], new_key("a")), 409, "stale_epoch"
    )
    assert refused["current_epoch"] == 2
    second = stack.acquire_ok(resource, "worker-b", ttl_s=1.0)
    assert second["epoch"] == 3

    sent = stack.sigterm_proxy()
    assert stack.wait_proxy_exit(15.0) == 0
    assert time.monotonic() - sent < 15.0
    stack.restart_proxy()

    stack.wait_not_live(resource)
    third = stack.acquire_ok(resource, "worker-c", ttl_s=5)
    assert third["epoch"] == 4
    for token, epoch in ((second["token"], 3), (first["token"], 1)):
        problem = assert_refused(stack.place_order(sku, token, new_key("old")), 409, "stale_epoch")
        assert (problem["epoch"], problem["current_epoch"]) == (epoch, 4)
    assert stack.upstream_orders() == 1
    assert stack.upstream_mutations_received() == 1


# -- 6. "not found" before settle_s proves nothing ---------------------------------------------

SETTLE_S = 3.0


@pytest.mark.fence_stack(reconcile=ReconcileBlock(settle_s=SETTLE_S, attempts=6))
def test_not_found_before_settle_window_keeps_key_blocked(stack: Stack) -> None:
    """Signal: none to a process; the upstream answers 503 and commits nothing
    (Demo-Status: 503), so the effect is UNKNOWN and the probe's GET /orders/by-key answers
    404 at once. Proves the settle rule: a 404 earlier than settle_s after dispatch is
    recorded "inconclusive" and frees nothing (a retry of the key is 423 resource_blocked
    and never sent); only after settle_s does the probe settle NOT_COMMITTED, and then the
    retry is sent and commits exactly one order."""
    sku = "settle"
    resource = resource_of(sku)
    lease = stack.acquire_ok(resource, "worker-a", ttl_s=20)
    key = new_key("settle")

    first = stack.place_order(sku, lease["token"], key, extra_headers={"Demo-Status": "503"})

    effect_id = assert_refused(first, 504, "outcome_unknown")["effect_id"]
    early: list[dict[str, Any]] = []

    def inconclusive_probe_seen() -> bool:
        receipt = stack.effect(effect_id)
        early.append(receipt)
        return any(
            e["kind"] == "probe" and e["conclusion"] == "inconclusive" for e in receipt["events"]
        )

    wait_until("an inconclusive probe", inconclusive_probe_seen, SETTLE_S + 5)
    receipt = early[-1]
    assert receipt["state"] == "UNKNOWN", receipt
    probe = next(e for e in receipt["events"] if e["kind"] == "probe")
    assert probe["upstream_status"] == 404, probe
    assert probe["at"] - receipt["created_at"] < SETTLE_S

    retry = stack.place_order(sku, lease["token"], key)
    problem = assert_refused(retry, 423, "resource_blocked")
    assert problem["effect_ids"] == [effect_id]
    still = stack.effect(effect_id)
    assert still["state"] == "UNKNOWN", "the retry must be refused while the effect is UNKNOWN"
    assert stack.upstream_mutations_received() == 1  # only the 503 one
    assert stack.upstream_orders() == 0

    settled = wait_effect(stack, effect_id, "NOT_COMMITTED", SETTLE_S + 10)
    assert settled["settled_by"] == "probe", settled
    conclusive = [e for e in settled["events"] if e["conclusion"] == "not_committed"]
    assert conclusive and conclusive[-1]["at"] >= settled["created_at"] + SETTLE_S, settled

    sent = stack.place_order(sku, lease["token"], key)
    assert sent.status == 201, sent
    assert sent.headers.get("idempotent-replayed") is None
    assert sent.headers["fence-effect-id"] != effect_id
    assert stack.upstream_orders() == 1
    assert stack.upstream_mutations_received() == 2
