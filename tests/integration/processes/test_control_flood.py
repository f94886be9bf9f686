"""No number of connections without a valid credential keeps a worker that has one from
renewing, acquiring or writing, against a real `fenceproxy serve` with the default limits.

The report: with `auth:` on, 1,300 connections each sent a renew with a made-up,
well-formed token and a body that never came. The token was looked up only after the
body, the control API is not counted by `max_requests`, and a connection with a
request being handled was never evicted: every worker's renew, acquire and fenced write,
and /readyz, were `503 overloaded` for `body_timeout_s`.

Here the flood is held (every head sent) while a worker with a client's key and a live
lease renews, acquires and writes through a fenced route, each within its lease, and
the operator's /readyz answers. The upstream counts the order in its own store.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator

import pytest

from policies.model import Limits
from support.body_flood import BodyFlood, BodyFloodResult, accepted_from, request_head
from tests.integration.processes.conftest import HttpResult, Stack, http_call, wait_until

# Past the default max_connections (1280), as in the report.
FLOOD = 1300
assert Limits().max_connections < FLOOD
WORKER_KEY_ENV = "FENCEPROXY_KEY_FLOOD_WORKER"
WORKER_KEY = secrets.token_urlsafe(32)
AUTH = f"""\
auth:
  clients:
    - name: workers
      key_env: {WORKER_KEY_ENV}
      resources: ["supplier:*"]
      may: [lease]
"""
AUTH_STACK = pytest.mark.fence_stack(top_level=AUTH, env=((WORKER_KEY_ENV, WORKER_KEY),))
LEASE_S = 10.0


def made_up_token() -> str:
    return "fpt_" + secrets.token_urlsafe(32)


def renew_head(token: str) -> Callable[[int], bytes]:
    return lambda _: request_head("POST", "/_fence/v1/leases/renew", {"Fence-Token": token})


def made_up_renew(_: int) -> bytes:
    return renew_head(made_up_token())(0)


def acquire_with_a_made_up_key(_: int) -> bytes:
    headers = {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}
    return request_head("POST", "/_fence/v1/leases", headers)


def anonymous_acquire(_: int) -> bytes:
    return request_head("POST", "/_fence/v1/leases", {})


def made_up_fenced_write(number: int) -> bytes:
    headers = {"Fence-Token": made_up_token(), "Idempotency-Key": f"flood-{number}"}
    return request_head("POST", f"/orders/flood-{number}", headers)


class Worker:
    """A worker with the client's key (when `keyed`): what it asks, timed from `since`."""

    def __init__(self, stack: Stack, keyed: bool) -> None:
        self.stack = stack
        self.headers = {"Authorization": f"Bearer {WORKER_KEY}"} if keyed else {}

    def acquire(self, resource: str) -> HttpResult:
        return http_call(
            self.stack.proxy_url,
            "POST",
            "/_fence/v1/leases",
            json_body={"resource": resource, "holder": "worker", "ttl_s": LEASE_S},
            headers=self.headers,
        )

    def renew(self, token: str) -> HttpResult:
        return http_call(
            self.stack.proxy_url,
            "POST",
            "/_fence/v1/leases/renew",
            json_body={"ttl_s": LEASE_S},
            # With the client's key, as fenceproxy_client sends it: verified at once.
            headers={"Fence-Token": token, **self.headers},
        )


@pytest.fixture
def floods() -> Iterator[list[BodyFlood]]:
    started: list[BodyFlood] = []
    try:
        yield started
    finally:
        for flood in started:
            flood.stop()


def worker_is_served_during(
    stack: Stack,
    floods: list[BodyFlood],
    head: Callable[[int], bytes],
    keyed: bool,
    connections: int = FLOOD,
) -> BodyFloodResult:
    """Start the flood, then the worker's renew, acquire and fenced write, and the
    operator's /readyz: each must succeed, all within the lease taken before the flood."""
    worker = Worker(stack, keyed)
    taken = worker.acquire("supplier:held")
    assert taken.status == 201, taken
    token = taken.body["token"]
    flood = BodyFlood("127.0.0.1", stack.proxy_port, connections, head)
    floods.append(flood)
    started = time.monotonic()
    flood.start()
    wait_until(
        "the proxy to take the whole flood in",
        lambda: flood.taken_in(stack.proxy.pid),
        LEASE_S / 2,
    )
    renewed = worker.renew(token)
    assert renewed.status == 200, renewed
    acquired = worker.acquire("supplier:during")
    assert acquired.status == 201, acquired
    order = stack.place_order("held", token, "order-during-flood")
    assert order.status == 201, order
    ready = http_call(stack.proxy_url, "GET", "/_fence/readyz")
    assert ready.status == 200, ready
    elapsed = time.monotonic() - started
    assert elapsed < LEASE_S, f"the worker took {elapsed:.1f} s, past its {LEASE_S:g} s lease"
    assert stack.upstream_orders() == 1
    floods.remove(flood)
    result = flood.stop()
    # Whatever ended the flood's requests (refused, shed, cut by stop()), nothing
    # failed in the proxy: no 500, no traceback.
    wait_until(
        "the proxy to see the flood's connections closed",
        lambda: not accepted_from(stack.proxy.pid, stack.proxy_port, result.ports),
        LEASE_S,
    )
    assert "Traceback" not in stack.proxy.log_path.read_text(encoding="utf-8")
    return result


def answered(result: BodyFloodResult) -> list[int]:
    return [status for status in result.statuses() if status is not None]


@AUTH_STACK
def test_renews_with_made_up_tokens_are_refused_before_their_body(
    stack: Stack, floods: list[BodyFlood]
) -> None:
    result = worker_is_served_during(stack, floods, made_up_renew, keyed=True)
    # Every one answered without waiting for its body: 403 invalid_token, or 503 if
    # shed while its token was looked up (past limits.max_unverified_waits).
    assert len(answered(result)) == FLOOD
    assert set(answered(result)) <= {403, 503}, sorted(set(result.statuses()), key=str)


@AUTH_STACK
def test_renews_with_a_dead_token_cannot_hold_the_connections(
    stack: Stack, floods: list[BodyFlood]
) -> None:
    # Issued here, then released: looked up, found, not live, so no credential.
    worker = Worker(stack, keyed=True)
    dead = worker.acquire("supplier:dead")
    assert dead.status == 201, dead
    assert stack.release(dead.body["token"]).status == 200
    result = worker_is_served_during(stack, floods, renew_head(dead.body["token"]), keyed=True)
    # Past max_connections, the oldest of them made room (those whose head had not
    # come yet closed as idle, the others answered 503): never served.
    assert set(answered(result)) <= {503}, sorted(set(result.statuses()), key=str)
    assert result.closed_by_proxy >= FLOOD - Limits().max_connections


@AUTH_STACK
def test_acquires_without_a_valid_key_cannot_hold_the_connections(
    stack: Stack, floods: list[BodyFlood]
) -> None:
    result = worker_is_served_during(stack, floods, acquire_with_a_made_up_key, keyed=True)
    assert set(answered(result)) <= {401, 503}, sorted(set(result.statuses()), key=str)


def test_without_auth_anonymous_acquires_cannot_hold_the_connections(
    stack: Stack, floods: list[BodyFlood]
) -> None:
    result = worker_is_served_during(stack, floods, anonymous_acquire, keyed=False)
    assert set(answered(result)) <= {503}, sorted(set(result.statuses()), key=str)
    assert result.closed_by_proxy >= FLOOD - Limits().max_connections


@AUTH_STACK
def test_fenced_writes_with_made_up_tokens_are_refused_before_their_body(
    stack: Stack, floods: list[BodyFlood]
) -> None:
    result = worker_is_served_during(stack, floods, made_up_fenced_write, keyed=True)
    assert len(answered(result)) == FLOOD
    assert set(answered(result)) <= {403, 503}, sorted(set(result.statuses()), key=str)


def pass_through_read(number: int) -> bytes:
    return request_head("GET", f"/orders/flood-{number}", {})


@AUTH_STACK
def test_pass_through_bodies_that_never_come_cannot_take_the_workers_requests(
    stack: Stack, floods: list[BodyFlood]
) -> None:
    """Below max_connections (nothing to evict for room) and above max_requests: a
    pass-through route takes anyone's request, and read the body of each."""
    limits = Limits()
    connections = (limits.max_requests + limits.max_connections) // 2
    result = worker_is_served_during(
        stack, floods, pass_through_read, keyed=True, connections=connections
    )
    assert set(answered(result)) == {503}, sorted(set(result.statuses()), key=str)
    # Shed, oldest first, as the next came: at most the cap were still waiting.
    assert result.closed_by_proxy >= connections - limits.unverified_waits
