"""Retention of leases and resources with real processes: a worker whose resource's
rows were collected while it was frozen wakes up and writes nothing.

The proxy runs with `retention.leases_days` of about 1.7 s (days may be fractional),
so A's lease is past the horizon soon after it expires. A retention round runs when
a proxy starts (then every minute), so the test restarts the proxy rather than wait
a minute; it watches the proxy's SQLite file for the rows to go. Worker A (a real
OS process) is stopped with SIGSTOP before its write and continued with SIGCONT
after B holds the name again: its token names no lease any more, and the
upstream's own records show B's write alone.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time

import pytest

from tests.integration.processes.conftest import Stack, assert_rejection_recorded, wait_until

RULE_ID = "collected"
RESOURCE = f"rule:{RULE_ID}"
PATH = f"/rules/{RULE_ID}"
A_TTL_S = 1.0
HORIZON_DAYS = 0.00002
HORIZON_S = HORIZON_DAYS * 86400
EVENT_TIMEOUT_S = 15.0
RULE_A = {"target": "pool-a", "by": "worker-a"}
RULE_B = {"target": "pool-b", "by": "worker-b"}


def store_rows(stack: Stack, table: str) -> int:
    """Rows of the proxy's own store, read from its SQLite file (another reader)."""
    with contextlib.closing(sqlite3.connect(stack.tmp_path / "fence.db")) as db:
        (count,) = db.execute(f"SELECT count(*) FROM {table}").fetchone()
    rows: int = count
    return rows


@pytest.mark.fence_stack(retention=f"{{leases_days: {HORIZON_DAYS:.6f}}}")
def test_a_worker_woken_after_its_resource_was_collected_writes_nothing(stack: Stack) -> None:
    a = stack.spawn_worker(
        "a", resource=RESOURCE, holder="worker-a", ttl_s=A_TTL_S, method="PUT", path=PATH
    )
    a_granted, _ = a.wait_event("acquired", EVENT_TIMEOUT_S)
    a.pause()
    a.write(RULE_A, "rule-by-a")
    assert store_rows(stack, "resources") == 1
    # A's lease runs out, and then the horizon passes, while A is stopped.
    wait_until(
        "A's lease to be past the lease horizon",
        lambda: time.time() > a_granted["expires_at"] + HORIZON_S + 0.1,
        A_TTL_S + HORIZON_S + 5,
    )

    stack.sigterm_proxy()
    stack.wait_proxy_exit(10)
    stack.restart_proxy()
    wait_until(
        "the lease and resource rows to be collected",
        lambda: store_rows(stack, "resources") == 0,
        10,
    )

    assert store_rows(stack, "leases") == 0
    b_granted = stack.acquire_ok(RESOURCE, "worker-b", ttl_s=30)
    assert b_granted["epoch"] > a_granted["epoch"]
    a.resume()
    a_wrote, _ = a.wait_event("wrote", EVENT_TIMEOUT_S)

    assert (a_wrote["status"], a_wrote["code"]) == (403, "invalid_token")
    assert a_wrote["fence_epoch"] is None
    assert stack.upstream_mutations_received() == 0
    b_wrote = stack.put_rule(RULE_ID, b_granted["token"], RULE_B)
    assert b_wrote.status == 200, b_wrote
    history = stack.upstream_rule_history(RULE_ID)
    assert [(h["rule"], h["fence_epoch"]) for h in history] == [(RULE_B, str(b_granted["epoch"]))]
    assert_rejection_recorded(
        stack,
        RESOURCE,
        "invalid_token",
        count=1,
        secrets_=(a_granted["token"], b_granted["token"], "pool-a"),
    )
