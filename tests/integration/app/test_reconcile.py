"""Effects whose outcome is unknown: blocked, probed, resolved, recovered.

The proxy app runs on a real store (SQLite and PostgreSQL, see conftest.py) in front
of the real demo upstream, in process; the upstream counts its own orders. The
Reconciler runs in the background inside the app on the store's clock: settle windows
and deadlines pass when the test advances the fake clock, and every wait for the
background loop is bounded polling. A second "replica" is a second Store on the same
SQLite file or PostgreSQL database.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.lifecycle import DEADLINE_MARGIN_S
from proxy.tokens import token_hash
from store import Admitted, NewEffect, Store, open_store
from tests.integration.app.conftest import (
    PROBE_BY_KEY,
    Fence,
    FenceFactory,
    Json,
    assert_problem,
    json_body,
    poll_until,
)

RESOURCE = "supplier:widget"
DROP = {"Demo-Drop-Response": "1"}
FAIL_503 = {"Demo-Status": "503"}
SETTLE_S = 2.0  # PROBE_BY_KEY's settle_s
FENCEPROXY = str(Path(sys.executable).parent / "fenceproxy")
CLI_TIMEOUT_S = 30.0
# How far test_sweep_... moves the clock: past the deadline + margin of an effect
# with a 1 s upstream timeout.
SWEEP_ADVANCE_S = 1 + DEADLINE_MARGIN_S + 0.5


async def wait_for_effect(
    fence: Fence, effect_id: str, what: str, check: Callable[[Json], bool]
) -> Json:
    """GET the effect until `check` holds (bounded polling); returns it with its events."""
    seen: list[Json] = []

    async def holds() -> bool:
        seen[:] = [await fence.effect(effect_id)]
        return check(seen[0])

    await poll_until(holds, f"{effect_id}: {what}")
    return seen[0]


def events_of(effect: Json, kind: str) -> list[Json]:
    return [event for event in effect["events"] if event["kind"] == kind]


def probed(effect: Json) -> bool:
    # Not probe_attempts: an early "not found" inside the settle window is not counted.
    return bool(events_of(effect, "probe"))


def settled(effect: Json) -> bool:
    return bool(effect["state"] != "UNKNOWN")


async def unknown_effect(fence: Fence, token: str, key: str, headers: dict[str, str]) -> str:
    """Send an order that ends UNKNOWN (504 outcome_unknown); returns its effect id."""
    response = await fence.order("widget", token, key, headers=headers)
    problem = await assert_problem(response, 504, "outcome_unknown")
    assert problem["resource"] == RESOURCE
    effect_id = problem["effect_id"]
    assert isinstance(effect_id, str)
    assert response.headers["Fence-Effect-Id"] == effect_id
    return effect_id


async def key_rows(fence: Fence, key: str) -> list[tuple[Any, ...]]:
    return await fence.rows(
        "SELECT effect_id FROM idempotency WHERE resource = ? AND key = ?", RESOURCE, key
    )


def new_effect(
    resource: str, key: str, upstream_timeout_s: float = 1.0, send_window_s: float = 0.0
) -> NewEffect:
    return NewEffect(
        route="place-order",
        resource=resource,
        idempotency_key=key,
        fingerprint=f"fp-{key}",
        method="POST",
        path=f"/orders/{resource.partition(':')[2]}",
        max_in_flight=1,
        upstream_timeout_s=upstream_timeout_s,
        retain_s=60,
        send_window_s=send_window_s,
    )


async def dispatching(store: Store, token: str, new: NewEffect) -> str:
    """Record an effect as DISPATCHING through `store` and never finish it (a crash)."""
    admitted = await store.admit(token_hash(token), new)
    assert isinstance(admitted, Admitted), admitted
    assert admitted.effect.instance_id == store.instance_id
    return admitted.effect.id


async def resolve(fence: Fence, effect_id: str, payload: Json) -> Any:
    return await fence.client.post(
        f"/_fence/v1/effects/{effect_id}/resolve", json=payload, headers=fence.admin
    )


async def probe_now(fence: Fence, effect_id: str) -> Any:
    return await fence.client.post(f"/_fence/v1/effects/{effect_id}/probe", headers=fence.admin)


# --- (a) a lost response, settled COMMITTED by the background probe -------------------------


async def test_lost_response_is_settled_committed_by_probe_and_replays(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence(reconcile=PROBE_BY_KEY)
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)

    effect_id = await unknown_effect(fence, lease["token"], "k-1", DROP)
    assert await fence.upstream_orders() == 1  # the write happened; the answer was lost

    effect = await wait_for_effect(fence, effect_id, "settled by a probe", settled)
    assert effect["state"] == "COMMITTED"
    assert effect["settled_by"] == "probe"
    probes = events_of(effect, "probe")
    assert probes[-1]["upstream_status"] == 200
    assert probes[-1]["conclusion"] == "committed"
    view = await fence.lease(RESOURCE)
    assert view["blocked"] is False
    assert view["in_doubt"] == []

    fence.clock.advance(31)  # worker-a's lease has expired
    successor = await fence.acquire(RESOURCE, "worker-b", ttl_s=30)
    assert successor["epoch"] == 2

    retry = await fence.order("widget", successor["token"], "k-1")
    body = await json_body(retry)
    assert retry.status == 200, body
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.headers["Fence-Effect-Id"] == effect_id
    assert body["replayed"] is True
    assert body["effect_id"] == effect_id
    assert body["state"] == "COMMITTED"
    assert body["settled_by"] == "probe"
    assert "committed" in body["detail"]
    assert "by reconciliation" in body["detail"]
    assert await fence.upstream_orders() == 1


# --- (b) the settle window: "not found" too early proves nothing ------------------------------


async def test_not_found_before_settle_s_does_not_free_the_key(make_fence: FenceFactory) -> None:
    fence = await make_fence(reconcile=PROBE_BY_KEY)
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)

    effect_id = await unknown_effect(fence, lease["token"], "k-1", FAIL_503)
    assert await fence.upstream_orders() == 0

    early = await wait_for_effect(fence, effect_id, "a first probe", probed)
    assert early["state"] == "UNKNOWN"
    first = events_of(early, "probe")
    assert len(first) == 1
    assert first[0]["upstream_status"] == 404
    assert first[0]["conclusion"] == "inconclusive"
    assert early["next_probe_at"] >= early["created_at"] + SETTLE_S
    assert await key_rows(fence, "k-1") == [(effect_id,)]
    blocked = await fence.order("widget", lease["token"], "k-1")
    await assert_problem(blocked, 423, "resource_blocked")
    assert await fence.upstream_orders() == 0

    fence.clock.advance(SETTLE_S + 0.5)
    effect = await wait_for_effect(fence, effect_id, "settled after settle_s", settled)
    assert effect["state"] == "NOT_COMMITTED"
    assert effect["settled_by"] == "probe"
    last = events_of(effect, "probe")[-1]
    assert (last["upstream_status"], last["conclusion"]) == (404, "not_committed")
    assert await key_rows(fence, "k-1") == []

    retry = await fence.order("widget", lease["token"], "k-1")
    body = await json_body(retry)
    assert retry.status == 201, body
    assert "Idempotent-Replayed" not in retry.headers
    assert retry.headers["Fence-Effect-Id"] != effect_id
    assert await fence.upstream_orders() == 1


async def test_the_settle_window_counts_from_the_latest_send(make_fence: FenceFactory) -> None:
    """A write may be sent as late as its send window after its admission, and land as
    late after that: an effect with no receipt, swept UNKNOWN, is probed, and a "not
    found" asked settle_s after its admission, but not settle_s after the latest send,
    proves nothing yet."""
    settle_s, window_s, timeout_s = 5.0, 3.0, 1.0
    fence = await make_fence(reconcile=PROBE_BY_KEY.replace("settle_s: 2", f"settle_s: {settle_s}"))
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    replica = open_store(fence.store_url, fence.clock, "replica-2:8080")
    await replica.open()
    try:
        new = new_effect(RESOURCE, "k-1", upstream_timeout_s=timeout_s, send_window_s=window_s)
        effect_id = await dispatching(replica, lease["token"], new)
    finally:
        await replica.close()

    # Past the sweep (deadline + margin) and settle_s after the admission, but not
    # settle_s after the latest send.
    fence.clock.advance(window_s + timeout_s + DEADLINE_MARGIN_S + 0.5)
    early = await wait_for_effect(fence, effect_id, "swept and probed", probed)
    assert early["state"] == "UNKNOWN", early
    [probe] = events_of(early, "probe")
    assert (probe["upstream_status"], probe["conclusion"]) == (404, "inconclusive"), probe
    assert early["next_probe_at"] >= early["created_at"] + window_s + settle_s
    assert await key_rows(fence, "k-1") == [(effect_id,)]

    fence.clock.advance(2.0)
    effect = await wait_for_effect(fence, effect_id, "settled after the window", settled)
    assert effect["state"] == "NOT_COMMITTED", effect
    assert await key_rows(fence, "k-1") == []


# --- (c) no reconcile block: an operator decides --------------------------------------------


async def test_without_a_probe_unknown_waits_for_an_operator(make_fence: FenceFactory) -> None:
    fence = await make_fence()
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    effect_id = await unknown_effect(fence, lease["token"], "k-1", DROP)
    assert await fence.upstream_orders() == 1

    waiting = await wait_for_effect(
        fence,
        effect_id,
        "a no_probe event",
        lambda e: any(ev["conclusion"] == "no_probe" for ev in e["events"]),
    )
    assert waiting["state"] == "UNKNOWN"
    # Nothing was asked of the upstream: no attempt counted, no "gave up" as if probes ran.
    assert waiting["probe_attempts"] == 0
    assert [ev["conclusion"] for ev in waiting["events"]].count("gave_up") == 0
    fence.clock.advance(31)  # the lease has expired: still no takeover
    takeover = await fence.acquire_response(RESOURCE, "worker-b", ttl_s=30)
    refusal = await assert_problem(takeover, 423, "resource_blocked")
    assert effect_id in refusal["effect_ids"]

    bad = await resolve(
        fence, effect_id, {"outcome": "maybe", "reason": "unsure", "operator": "alice"}
    )
    await assert_problem(bad, 400, "invalid_request")
    assert (await fence.effect(effect_id))["state"] == "UNKNOWN"

    reason = "order for k-1 found in the supplier portal"
    done = await resolve(
        fence, effect_id, {"outcome": "committed", "reason": reason, "operator": "alice"}
    )
    resolved = await json_body(done)
    assert done.status == 200, resolved
    assert resolved["state"] == "COMMITTED"
    assert resolved["settled_by"] == "operator:alice"
    effect = await fence.effect(effect_id)
    decisions = events_of(effect, "resolve")
    assert len(decisions) == 1
    assert decisions[0]["actor"] == "operator:alice"
    assert decisions[0]["detail"] == reason
    assert decisions[0]["conclusion"] == "committed"

    successor = await fence.acquire(RESOURCE, "worker-b", ttl_s=30)
    retry = await fence.order("widget", successor["token"], "k-1")
    body = await json_body(retry)
    assert retry.status == 200, body
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert body["settled_by"] == "operator:alice"
    assert await fence.upstream_orders() == 1

    second = {"outcome": "not_committed", "reason": "second thoughts", "operator": "bob"}
    again = await resolve(fence, effect_id, second)
    await assert_problem(again, 409, "effect_settled")
    assert (await fence.effect(effect_id))["state"] == "COMMITTED"


# --- (d) upstream_idempotent: the holder may resend the same operation ------------------------


async def test_resend_of_the_same_operation_settles_the_unknown_effect(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence(upstream_idempotent=True)
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    body = {"qty": 2}
    failed = await fence.order("widget", lease["token"], "k-1", body, headers=FAIL_503)
    earlier = (await assert_problem(failed, 504, "outcome_unknown"))["effect_id"]

    other_body = await fence.order("widget", lease["token"], "k-1", {"qty": 3})
    await assert_problem(other_body, 423, "resource_blocked")
    other_key = await fence.order("widget", lease["token"], "k-2", body)
    await assert_problem(other_key, 423, "resource_blocked")
    assert await fence.upstream_orders() == 0

    resent = await fence.order("widget", lease["token"], "k-1", body)
    answer = await json_body(resent)
    assert resent.status == 201, answer
    assert "Idempotent-Replayed" not in resent.headers
    resend_id = resent.headers["Fence-Effect-Id"]
    assert resend_id != earlier
    assert await fence.upstream_orders() == 1

    effect = await fence.effect(earlier)
    assert effect["state"] == "COMMITTED"
    assert effect["settled_by"] == f"resend:{resend_id}"
    resends = events_of(effect, "resend")
    assert len(resends) == 1
    assert resends[0]["upstream_status"] == 201
    assert resends[0]["conclusion"] == "committed"
    assert resend_id in resends[0]["detail"]
    assert (await fence.lease(RESOURCE))["blocked"] is False


# --- (e) startup recovery --------------------------------------------------------------------


async def test_restart_turns_its_own_dispatching_effects_unknown_before_serving(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence()
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    own = await dispatching(fence.store, lease["token"], new_effect(RESOURCE, "k-1"))
    # Another replica's request on another resource, well within its deadline.
    other_lease = await fence.acquire("supplier:gadget", "worker-c", ttl_s=30)
    replica = open_store(fence.store_url, fence.clock, "replica-2:8080")
    await replica.open()
    try:
        gadget = new_effect("supplier:gadget", "g")
        theirs = await dispatching(replica, other_lease["token"], gadget)
    finally:
        await replica.close()
    assert (await fence.effect(own))["state"] == "DISPATCHING"

    restarted = await fence.restart()  # no clock advance: no deadline has passed

    # Before any request reaches the new app, the records already say UNKNOWN.
    rows = await fence.rows("SELECT id, state FROM effects WHERE id IN (?, ?)", own, theirs)
    assert dict(rows) == {own: "UNKNOWN", theirs: "DISPATCHING"}
    kinds = await fence.rows("SELECT kind FROM effect_events WHERE effect_id = ? ORDER BY id", own)
    assert kinds[:1] == [("recover",)]

    effect = await restarted.effect(own)
    assert effect["state"] == "UNKNOWN"
    recover = events_of(effect, "recover")
    assert len(recover) == 1
    assert recover[0]["conclusion"] == "unknown"
    assert "restarted" in recover[0]["detail"]
    assert (await restarted.effect(theirs))["state"] == "DISPATCHING"
    view = await restarted.lease(RESOURCE)
    assert view["blocked"] is True
    assert view["in_doubt"] == [own]
    retry = await restarted.order("widget", lease["token"], "k-1")
    await assert_problem(retry, 423, "resource_blocked")


# --- (f) the sweep of overdue DISPATCHING effects ----------------------------------------------


async def test_sweep_marks_another_instances_overdue_effect_unknown(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence()
    leases = {
        name: (await fence.acquire(f"supplier:{name}", "worker-a", ttl_s=30))["token"]
        for name in ("overdue", "margin", "window", "live")
    }
    replica = open_store(fence.store_url, fence.clock, "replica-2:8080")
    await replica.open()
    try:
        overdue = await dispatching(
            replica, leases["overdue"], new_effect("supplier:overdue", "k", upstream_timeout_s=1)
        )
        # Past its deadline at the sweep (by 0.1 s, plus however long PostgreSQL's own
        # clock runs until the sweep, at most SWEEP_INTERVAL_S and a little more), but
        # not past deadline + margin.
        margin = await dispatching(
            replica,
            leases["margin"],
            new_effect("supplier:margin", "k", upstream_timeout_s=SWEEP_ADVANCE_S - 0.1),
        )
        # The same upstream timeout as the overdue one, but a send window too: it may
        # still be sent that much later, and is in flight that much longer.
        window = await dispatching(
            replica,
            leases["window"],
            new_effect(
                "supplier:window", "k", upstream_timeout_s=1, send_window_s=SWEEP_ADVANCE_S - 1.1
            ),
        )
        live = await dispatching(
            replica, leases["live"], new_effect("supplier:live", "k", upstream_timeout_s=20)
        )
    finally:
        await replica.close()

    fence.clock.advance(SWEEP_ADVANCE_S)

    swept = await wait_for_effect(
        fence,
        overdue,
        "swept to UNKNOWN",
        lambda e: e["state"] == "UNKNOWN" and bool(events_of(e, "recover")),
    )
    assert "deadline" in events_of(swept, "recover")[0]["detail"]
    # The same sweep transaction saw these and left them alone.
    assert (await fence.effect(margin))["state"] == "DISPATCHING"
    assert (await fence.effect(window))["state"] == "DISPATCHING"
    assert (await fence.effect(live))["state"] == "DISPATCHING"
    assert events_of(await fence.effect(margin), "recover") == []
    assert (await fence.lease("supplier:overdue"))["blocked"] is True
    # Still in flight, but blocked all the same: a write that may still land blocks a
    # successor (one definition of "blocked", the one acquire uses).
    assert (await fence.lease("supplier:margin"))["blocked"] is True


# --- (g) the admin probe ----------------------------------------------------------------------


async def test_admin_probe_runs_now_and_only_on_unknown_effects(make_fence: FenceFactory) -> None:
    fence = await make_fence(reconcile=PROBE_BY_KEY)
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    effect_id = await unknown_effect(fence, lease["token"], "k-1", FAIL_503)
    # The background's first probe; its next one waits for the settle window (2 s; the
    # test does not advance the clock), so every probe below is the admin's.
    await wait_for_effect(fence, effect_id, "a first probe", probed)

    early = await probe_now(fence, effect_id)
    answer = await json_body(early)
    assert early.status == 200, answer
    assert answer["conclusion"] == "inconclusive"
    assert answer["effect"]["state"] == "UNKNOWN"
    # Both "not found" answers came inside the settle window: neither used an attempt.
    assert answer["effect"]["probe_attempts"] == 0

    # The write lands late at the supplier.
    late = await fence.upstream.post(
        "/orders/widget", json={"qty": 1}, headers={"Idempotency-Key": "k-1"}
    )
    assert late.status == 201
    found = await probe_now(fence, effect_id)
    answer = await json_body(found)
    assert found.status == 200, answer
    assert answer["effect_id"] == effect_id
    assert answer["conclusion"] == "committed"
    assert answer["effect"]["state"] == "COMMITTED"
    effect = await fence.effect(effect_id)
    assert effect["state"] == "COMMITTED"
    assert [e["upstream_status"] for e in events_of(effect, "probe")] == [404, 404, 200]

    settled_probe = await probe_now(fence, effect_id)
    await assert_problem(settled_probe, 409, "effect_settled")
    assert len(events_of(await fence.effect(effect_id), "probe")) == 3


# --- (h) the CLI against the same store ----------------------------------------------------------


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, (self.code, self.out, self.err)
        return json.loads(self.out)


async def fenceproxy(*args: str) -> CliResult:
    """Run the installed console script in its own process (bounded)."""
    env = {k: v for k, v in os.environ.items() if k != "FENCEPROXY_CONFIG"}
    process = await asyncio.create_subprocess_exec(
        FENCEPROXY,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return CliResult(process.returncode, out.decode(), err.decode())


async def test_cli_lists_and_resolves_effects_in_doubt(make_fence: FenceFactory) -> None:
    fence = await make_fence()
    assert fence.config_path is not None
    config = str(fence.config_path)
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    effect_id = await unknown_effect(fence, lease["token"], "k-1", FAIL_503)
    # Let the background record its (no_probe) attempt first, so nothing races the CLI.
    await wait_for_effect(fence, effect_id, "a probe attempt", probed)

    listing = (await fenceproxy("reconcile", "list", "--json", "--config", config)).json()
    assert listing["blocked_resources"] == [RESOURCE]
    [entry] = listing["in_doubt"]
    assert entry["id"] == effect_id
    assert entry["state"] == "UNKNOWN"
    assert (entry["route"], entry["resource"], entry["holder"], entry["epoch"]) == (
        "place-order",
        RESOURCE,
        "worker-a",
        1,
    )
    assert entry["idempotency_key"] == "k-1"
    assert entry["probe_attempts"] == 0  # the route has no probe: nothing was asked
    assert entry["last_event"] is not None

    resolved = (
        await fenceproxy(
            "reconcile",
            "resolve",
            effect_id,
            "--outcome",
            "not-committed",
            "--reason",
            "r",
            "--operator",
            "alice",
            "--json",
            "--config",
            config,
        )
    ).json()
    assert resolved["state"] == "NOT_COMMITTED"
    assert resolved["settled_by"] == "operator:alice"

    shown = (await fenceproxy("effects", "show", effect_id, "--json", "--config", config)).json()
    assert shown["state"] == "NOT_COMMITTED"
    [decision] = events_of(shown, "resolve")
    assert (decision["actor"], decision["detail"], decision["conclusion"]) == (
        "operator:alice",
        "r",
        "not_committed",
    )
    effect = await fence.effect(effect_id)  # the running app reads the same records
    assert events_of(effect, "resolve")[0]["actor"] == "operator:alice"
    empty = (await fenceproxy("reconcile", "list", "--json", "--config", config)).json()
    assert empty == {"blocked_resources": [], "in_doubt": []}

    # Not committed: the key is free, and the holder's retry is really sent.
    retry = await fence.order("widget", lease["token"], "k-1")
    assert retry.status == 201, await retry.text()
    assert "Idempotent-Replayed" not in retry.headers
    assert await fence.upstream_orders() == 1
