"""Adapter acceptance table, rows (a)-(d), with workers as real OS processes.

Worker A and worker B are separate processes running worker.py; A is frozen
with a real SIGSTOP and thawed with a real SIGCONT sent by this test process
(os.kill, confirmed through /proc/<pid>/stat). A's write command is put into its
stdin pipe while it is stopped, so it is paused immediately before the
mutation: the next thing it does when continued is send the fenced write.

The resource is a routing rule (PUT /rules/{id}, last write wins upstream), so a
stale write that got through would silently replace B's rule.
"""

from __future__ import annotations

import time
from typing import Any

from tests.integration.processes.conftest import (
    Stack,
    WorkerProcess,
    assert_refused,
    assert_rejection_recorded,
)

RULE_ID = "checkout"
RESOURCE = f"rule:{RULE_ID}"
PATH = f"/rules/{RULE_ID}"
# A's lease: B, a new Python process started once A is stopped, must be refused at least
# once while it is live. At load 7, B's first ask came 0.5 to 1.2 s into a 2.5 s lease.
A_TTL_S = 4.0
B_TTL_S = 10.0
EVENT_TIMEOUT_S = 15.0
RULE_A = {"target": "pool-a", "by": "worker-a"}
RULE_B = {"target": "pool-b", "by": "worker-b"}


def assert_upstream_untouched(stack: Stack) -> None:
    assert stack.upstream_effects()["effects"] == []
    assert stack.upstream_rule(RULE_ID).status == 404
    assert stack.fence_token_seen() == 0
    assert stack.proxy_effects(RESOURCE) == []


def pause_a_before_mutation(stack: Stack) -> tuple[WorkerProcess, dict[str, Any]]:
    """Row (a): A holds a lease, is SIGSTOPped, and its write waits in its stdin."""
    a = stack.spawn_worker(
        "a", resource=RESOURCE, holder="worker-a", ttl_s=A_TTL_S, method="PUT", path=PATH
    )
    granted, _ = a.wait_event("acquired", EVENT_TIMEOUT_S)
    assert granted["epoch"] == 1
    a.pause()
    a.write(RULE_A, "rule-by-a")
    return a, granted


def expire_a_and_grant_b(
    stack: Stack, a_granted: dict[str, Any]
) -> tuple[WorkerProcess, dict[str, Any], list[dict[str, Any]]]:
    """Row (b): B asks while A's lease is live and keeps asking until it is granted."""
    b = stack.spawn_worker(
        "b",
        resource=RESOURCE,
        holder="worker-b",
        ttl_s=B_TTL_S,
        method="PUT",
        path=PATH,
        acquire_timeout_s=A_TTL_S + 10,
    )
    granted, refused = b.wait_event("acquired", A_TTL_S + EVENT_TIMEOUT_S)
    return b, granted, refused


def test_a_pause_holder_immediately_before_the_mutation(stack: Stack) -> None:
    """Signal used: SIGSTOP on worker A (a real OS process), after it acquired."""
    a, granted = pause_a_before_mutation(stack)

    assert a.state() == "T"
    view = stack.lease(RESOURCE)
    assert (view["epoch"], view["holder"], view["live"]) == (1, "worker-a", True)
    assert view["expires_at"] == granted["expires_at"]
    assert granted["expires_at"] > time.time()
    # The proxy still enforces A's valid lease against everyone else...
    competitor = stack.acquire(RESOURCE, "worker-c", ttl_s=1)
    assert_refused(competitor, 409, "lease_held")
    # ...and nothing has been committed, or even admitted: A is frozen before its write.
    assert_upstream_untouched(stack)
    assert not a.has_pending_output()
    assert a.state() == "T"


def test_b_expire_holder_and_grant_successor(stack: Stack) -> None:
    """Signal used: SIGSTOP on worker A, which stays stopped while B is granted."""
    a, a_granted = pause_a_before_mutation(stack)

    b, b_granted, refused = expire_a_and_grant_b(stack, a_granted)

    # While A's lease was live, B was refused; it got the lease only after A's expired.
    assert refused, "B should have been refused while A's lease was live"
    assert {(r["status"], r["code"]) for r in refused} == {(409, "lease_held")}
    assert all(r["retry_after"] is not None for r in refused)
    b_granted_at = b_granted["expires_at"] - b_granted["ttl_s"]
    assert b_granted_at >= a_granted["expires_at"] - 1e-3
    assert b_granted["epoch"] == 2
    # The store said epoch 2 before B acted on its grant: B's own first look...
    assert b_granted["view"]["epoch"] == 2
    assert b_granted["view"]["holder"] == "worker-b"
    assert b_granted["view"]["live"] is True
    # ...and ours, as soon as B reported it.
    view = stack.lease(RESOURCE)
    assert (view["epoch"], view["holder"], view["live"]) == (2, "worker-b", True)
    assert b_granted["token"] != a_granted["token"]
    assert a.state() == "T"
    assert_upstream_untouched(stack)
    held = assert_rejection_recorded(
        stack,
        RESOURCE,
        "lease_held",
        count=len(refused),
        secrets_=(a_granted["token"], b_granted["token"]),
    )
    # worker-b held nothing when it was refused: counted, its name not kept.
    assert [r["holder"] for r in held] == [None], held
    assert b.pid != a.pid


def test_c_resume_stale_holder_before_successor_writes(stack: Stack) -> None:
    """Signals used: SIGSTOP on worker A, then SIGCONT after B's grant, before B writes."""
    a, a_granted = pause_a_before_mutation(stack)
    b, b_granted, _ = expire_a_and_grant_b(stack, a_granted)

    a.resume()
    wrote, _ = a.wait_event("wrote", EVENT_TIMEOUT_S)

    assert (wrote["status"], wrote["code"]) == (409, "stale_epoch")
    assert wrote["body"]["epoch"] == 1
    assert wrote["body"]["current_epoch"] == 2
    assert wrote["fence_epoch"] is None
    assert_upstream_untouched(stack)
    assert stack.upstream_effects()["rule_writes"] == 0
    assert_rejection_recorded(
        stack,
        RESOURCE,
        "stale_epoch",
        secrets_=(a_granted["token"], b_granted["token"], "pool-a"),
        holder="worker-a",
        epoch=1,
    )
    # B, the current holder, is unaffected by A's attempt.
    b.write(RULE_B, "rule-by-b")
    b_wrote, _ = b.wait_event("wrote", EVENT_TIMEOUT_S)
    assert (b_wrote["status"], b_wrote["fence_epoch"]) == (200, "2")
    history = stack.upstream_rule_history(RULE_ID)
    assert [(h["rule"], h["fence_epoch"]) for h in history] == [(RULE_B, "2")]


def test_d_successor_writes_then_stale_holder_retries(stack: Stack) -> None:
    """Signals used: SIGSTOP on worker A; SIGCONT after B's write; A then retries."""
    a, a_granted = pause_a_before_mutation(stack)
    b, b_granted, _ = expire_a_and_grant_b(stack, a_granted)
    b.write(RULE_B, "rule-by-b")
    b_wrote, _ = b.wait_event("wrote", EVENT_TIMEOUT_S)
    assert (b_wrote["status"], b_wrote["fence_epoch"]) == (200, "2")

    a.resume()
    first, _ = a.wait_event("wrote", EVENT_TIMEOUT_S)
    a.write(RULE_A, "rule-by-a")  # the same request again
    retry, _ = a.wait_event("wrote", EVENT_TIMEOUT_S)
    a.write(RULE_A, "rule-by-a-2")  # or as a new operation
    fresh, _ = a.wait_event("wrote", EVENT_TIMEOUT_S)
    a.write(RULE_B, "rule-by-b")  # B's exact request: a stale holder gets no replay of it
    copied, _ = a.wait_event("wrote", EVENT_TIMEOUT_S)

    for attempt in (first, retry, fresh, copied):
        assert (attempt["status"], attempt["code"]) == (409, "stale_epoch"), attempt
        assert attempt["body"]["current_epoch"] == 2
        assert attempt["fence_epoch"] is None
    current = stack.upstream_rule(RULE_ID)
    assert current.status == 200
    assert current.body["rule"] == RULE_B
    history = stack.upstream_rule_history(RULE_ID)
    assert [(h["rule"], h["fence_epoch"]) for h in history] == [(RULE_B, "2")]
    upstream = stack.upstream_effects()
    assert upstream["rule_writes"] == 1
    assert [e["idempotency_key"] for e in upstream["effects"]] == ["rule-by-b"]
    assert stack.fence_token_seen() == 0
    (receipt,) = stack.proxy_effects(RESOURCE)
    assert (receipt["holder"], receipt["epoch"], receipt["state"]) == ("worker-b", 2, "COMMITTED")
    assert_rejection_recorded(
        stack,
        RESOURCE,
        "stale_epoch",
        count=4,
        secrets_=(a_granted["token"], b_granted["token"], "pool-a", "pool-b"),
        holder="worker-a",
        epoch=1,
    )
