"""Graceful shutdown and crash durability of the proxy process, with real signals.

The proxy is a real OS process (`fenceproxy serve --grace S`) in front of the demo
upstream (another process). This test process sends it SIGTERM or SIGKILL with
os.kill, starts it again on the same store with the same FENCEPROXY_INSTANCE_ID, and
judges by the upstream's own records and by the store as the installed `fenceproxy`
CLI reads it. Each docstring names the signal used and the rule the case proves.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.integration.processes.conftest import (
    BackgroundCall,
    HttpResult,
    Stack,
    assert_refused,
    http_call,
    wait_until,
)

# The write SIGTERM finds in flight: the listener must be closed and seen refusing a
# connection before it ends (seconds to spare on a loaded machine), and the grace must
# outlast it, with room to tell an exit after the write from one after the grace.
IN_FLIGHT_MS = 3000
IN_FLIGHT_TIMEOUT_S = 5.0
GRACE_S = 8.0
LISTENER_CLOSED_WITHIN_S = 2.0


def new_key(label: str) -> str:
    return f"{label}-{secrets.token_hex(6)}"


def wait_received(stack: Stack, count: int) -> None:
    wait_until(
        f"{count} write(s) to reach the upstream",
        lambda: stack.upstream_mutations_received() == count,
        5.0,
    )


@pytest.mark.fence_stack(upstream_timeout_s=IN_FLIGHT_TIMEOUT_S, grace_s=GRACE_S)
def test_sigterm_lets_the_in_flight_write_finish_and_refuses_new_connections(
    stack: Stack,
) -> None:
    """Signal: SIGTERM on the proxy while the upstream holds a write (Demo-Delay-Ms 3000,
    --grace 8). Proves: the listener closes at once (a new TCP connection is refused while
    the write is still in flight), the in-flight write completes (the client gets its 201,
    the upstream holds one order, the receipt is COMMITTED in the store), and the process
    exits 0 within the grace."""
    sku = "sigterm-in-flight"
    resource = f"supplier:{sku}"
    lease = stack.acquire_ok(resource, "worker-a", ttl_s=IN_FLIGHT_TIMEOUT_S + 5)
    call = BackgroundCall(
        "in-flight write",
        lambda: stack.place_order(
            sku, lease["token"], new_key("term"), extra_headers={"Demo-Delay-Ms": str(IN_FLIGHT_MS)}
        ),
    )
    wait_received(stack, 1)

    sent_at = stack.sigterm_proxy()

    wait_until(
        "the listener to close",
        lambda: not stack.proxy_accepts_connections(),
        LISTENER_CLOSED_WITHIN_S,
    )
    with pytest.raises(ConnectionRefusedError):
        http_call(stack.proxy_url, "GET", "/_fence/healthz", timeout_s=1.0)
    # Refused while the earlier request was still being served, not merely after the exit.
    assert not call.done(), "the in-flight write ended before the listener was checked"
    assert stack.proxy.is_running()
    assert stack.upstream_orders() == 0

    answer = call.outcome(GRACE_S + 2)
    assert isinstance(answer, HttpResult), f"the in-flight write failed: {answer!r}"
    assert answer.status == 201, answer
    status = stack.wait_proxy_exit(GRACE_S + 2)
    exited_after_s = time.monotonic() - sent_at
    assert status == 0, stack.proxy.log_tail()
    assert exited_after_s < GRACE_S, exited_after_s
    said = stack.proxy.log_tail(200)
    assert (
        f"stopping: listener closed; 1 proxied request(s) in flight, waiting up to {GRACE_S:g} s"
        in said
    ), said
    assert "cut off" not in said, said
    assert stack.upstream_orders() == 1
    shown = stack.cli_json("effects", "show", answer.headers["fence-effect-id"])
    assert (shown["state"], shown["upstream_status"]) == ("COMMITTED", 201), shown


# The upstream holds it past the exit: SIGTERM, the 0.5 s grace, the exit and the reads
# of the effect and the log all come before it commits, on a loaded machine too.
HELD_PAST_GRACE_MS = 4000


@pytest.mark.fence_stack(upstream_timeout_s=5.0, grace_s=0.5)
def test_sigterm_past_the_grace_leaves_the_effect_unknown_at_next_start(stack: Stack) -> None:
    """Signal: SIGTERM on the proxy (--grace 0.5) while the upstream holds a write for
    4 s (upstream timeout 5 s), then a restart on the same store with the same
    FENCEPROXY_INSTANCE_ID. Proves: the process exits without waiting for the write; at
    the next start the effect is UNKNOWN (never left DISPATCHING, never guessed settled)
    with a recovery event, and the resource is blocked (lease view, 423 on acquire) even
    though the upstream did commit it meanwhile."""
    sku = "sigterm-past-grace"
    resource = f"supplier:{sku}"
    # Released below, after the exit, a CLI run and the restart: live until then.
    lease = stack.acquire_ok(resource, "worker-a", ttl_s=30.0)
    key = new_key("grace")
    call = BackgroundCall(
        "slow write",
        lambda: stack.place_order(
            sku, lease["token"], key, extra_headers={"Demo-Delay-Ms": str(HELD_PAST_GRACE_MS)}
        ),
    )
    wait_received(stack, 1)
    (dispatching,) = stack.proxy_effects(resource)
    assert dispatching["state"] == "DISPATCHING"

    sent_at = stack.sigterm_proxy()
    stack.wait_proxy_exit(0.5 + 4.0)
    exited_after_s = time.monotonic() - sent_at
    said = stack.proxy.log_tail(200)
    assert "1 proxied request(s) in flight, waiting up to 0.5 s" in said, said
    assert f"the 0.5 s grace is over; POST /orders/{sku} was cut off" in said, said
    assert stack.upstream_orders() == 0, "the write should still be held by the upstream"
    answer = call.outcome(5.0)
    assert not (isinstance(answer, HttpResult) and answer.status == 201), answer
    # What the store holds while no proxy runs (the CLI reads it directly): DISPATCHING if
    # the exit left it for recovery, UNKNOWN if the exiting process recorded it itself.
    while_down = stack.cli_json("effects", "show", dispatching["id"])
    assert while_down["state"] in ("DISPATCHING", "UNKNOWN"), while_down

    stack.restart_proxy()

    receipt = stack.effect(dispatching["id"])
    assert (receipt["state"], receipt["settled_by"]) == ("UNKNOWN", None), receipt
    recovered = [e for e in receipt["events"] if e["kind"] == "recover"]
    if while_down["state"] == "DISPATCHING":
        assert [e["conclusion"] for e in recovered] == ["unknown"], receipt["events"]
    else:
        assert "unknown" in while_down["reason"], while_down
    view = stack.lease(resource)
    assert (view["blocked"], view["in_doubt"]) == (True, [dispatching["id"]]), view
    assert stack.release(lease["token"]).status == 200
    refused = assert_refused(stack.acquire(resource, "worker-b", ttl_s=5), 423, "resource_blocked")
    assert refused["effect_ids"] == [dispatching["id"]]
    assert_refused(stack.place_order(sku, lease["token"], key), 409, "stale_epoch")
    # The upstream did apply it: which is exactly why nobody may guess "not committed".
    wait_until("the held write to commit upstream", lambda: stack.upstream_orders() == 1, 5.0)
    assert stack.effect(dispatching["id"])["state"] == "UNKNOWN"
    assert stack.lease(resource)["blocked"] is True
    assert stack.upstream_mutations_received() == 1
    print(
        f"\nSIGTERM with --grace 0.5: exited after {exited_after_s:.3f} s; effect "
        f"{while_down['state']} in the store while down ({while_down['reason']})"
    )


BURST = 12


def test_sigkill_loses_no_acknowledged_write(stack: Stack) -> None:
    """Signal: SIGKILL on the proxy right after a concurrent burst of 12 writes (12
    resources) were all answered 201, then a restart on the same store. Proves: every
    acknowledged effect is COMMITTED in the store (`fenceproxy effects list`, the installed
    CLI), the upstream holds exactly 12 orders, and a retry of every key is a replay of
    the original answer that never reaches the upstream."""
    leases = {
        f"burst-{n}": stack.acquire_ok(f"supplier:burst-{n}", f"worker-{n}", ttl_s=30)
        for n in range(BURST)
    }
    keys = {sku: new_key(sku) for sku in leases}

    def write(sku: str) -> HttpResult:
        return stack.place_order(sku, leases[sku]["token"], keys[sku], qty=2)

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        answers = dict(zip(leases, pool.map(write, leases), strict=True))
    assert {sku: a.status for sku, a in answers.items()} == dict.fromkeys(leases, 201), answers

    stack.kill_proxy()
    stack.restart_proxy()

    listed: list[dict[str, Any]] = stack.cli_json("effects", "list", "--limit", "100")
    states = {e["id"]: e["state"] for e in listed}
    acknowledged = {a.headers["fence-effect-id"] for a in answers.values()}
    assert {states.get(effect_id) for effect_id in acknowledged} == {"COMMITTED"}, listed
    assert stack.upstream_orders() == BURST
    for sku, answer in answers.items():
        replay = write(sku)
        assert replay.headers.get("idempotent-replayed") == "true", replay
        assert (replay.status, replay.body) == (answer.status, answer.body)
    assert stack.upstream_orders() == BURST
    assert stack.upstream_mutations_received() == BURST


@pytest.mark.fence_stack(upstream_timeout_s=5.0)
def test_a_worker_that_goes_away_mid_send_leaves_the_write_to_finish_and_be_recorded(
    stack: Stack,
) -> None:
    """Signal: the worker's connection closed (its own 0.5 s timeout) while the upstream
    holds its write for 1.5 s. Proves: `serve` does not cancel a handler whose client
    went away, so a dispatch, which runs in its handler's task, still reads the
    upstream's answer and records its receipt: COMMITTED with 201, not UNKNOWN."""
    sku = "worker-went-away"
    resource = f"supplier:{sku}"
    lease = stack.acquire_ok(resource, "worker-a", ttl_s=30.0)
    with pytest.raises(TimeoutError):
        http_call(
            stack.proxy_url,
            "POST",
            f"/orders/{sku}",
            json_body={"qty": 1},
            headers={
                "Fence-Token": lease["token"],
                "Idempotency-Key": new_key("away"),
                "Demo-Delay-Ms": "1500",
            },
            timeout_s=0.5,
        )
    # The client gave up on its own clock: the proxy may not have admitted the write yet.
    wait_received(stack, 1)
    (effect,) = stack.proxy_effects(resource)
    wait_until(
        "the held write's receipt",
        lambda: stack.effect(effect["id"])["state"] != "DISPATCHING",
        5.0,
    )
    receipt = stack.effect(effect["id"])
    assert (receipt["state"], receipt["upstream_status"]) == ("COMMITTED", 201), receipt
    assert stack.upstream_orders() == 1
