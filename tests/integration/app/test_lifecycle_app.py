"""The effect lifecycle through the whole request path: what the worker is told when
something fails between admission and the receipt, and when evidence conflicts.

"Nothing was forwarded" may be said only when no byte left.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from core.lifecycle import Event
from proxy.logredact import MALFORMED_LINES
from proxy.runtime import RUNTIME
from store import CommitUnknown, StoreUnavailable
from tests.integration.app.conftest import (
    PROBE_BY_KEY,
    Fence,
    FenceFactory,
    assert_problem,
    json_body,
    poll_until,
)

RESOURCE = "supplier:widget"


async def raw_request(fence: Fence, head: bytes) -> bytes:
    """Send bytes as they are (aiohttp's client would normalise the target)."""
    server = fence.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_an_absolute_form_target_is_refused_before_anything_is_recorded(
    fence: Fence,
) -> None:
    lease = await fence.acquire(RESOURCE, "worker-a")
    head = (
        b"POST http://127.0.0.1/orders/widget HTTP/1.1\r\n"
        b"Host: 127.0.0.1\r\nFence-Token: " + lease["token"].encode() + b"\r\n"
        b"Idempotency-Key: k-1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    )
    answer = await raw_request(fence, head)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert b'"code": "invalid_request"' in answer
    assert await fence.effects() == []
    assert await fence.upstream_orders() == 0
    assert (await fence.lease(RESOURCE))["blocked"] is False


async def test_a_store_that_refuses_the_admission_is_503_with_retry_after(
    fence: Fence, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before dispatch (a read-only database, a full pool, a pooler's refusal): 503
    store_unavailable with Retry-After, and nothing forwarded, which is then true."""
    lease = await fence.acquire(RESOURCE, "worker-a")

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the database is read-only")

    monkeypatch.setattr(fence.store, "admit", refused)
    answer = await fence.order("widget", lease["token"], "k-1")
    body = await assert_problem(answer, 503, "store_unavailable")
    assert answer.headers["Retry-After"] == "1"
    assert "nothing was done" in body["detail"]
    assert await fence.upstream_orders() == 0


async def test_a_write_whose_commit_answer_was_lost_is_never_nothing_was_done(
    fence: Fence, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acquire whose COMMIT was sent and not answered may have granted the lease."""

    async def lost(*args: Any, **kwargs: Any) -> Any:
        raise CommitUnknown("PostgreSQL's answer to the COMMIT was lost")

    monkeypatch.setattr(fence.store, "acquire", lost)
    answer = await fence.acquire_response(RESOURCE, "worker-a")
    body = await assert_problem(answer, 503, "store_unavailable")
    assert "may or may not have been done" in body["detail"], body
    assert "nothing was done" not in body["detail"], body


async def test_a_receipt_that_cannot_be_recorded_is_never_nothing_was_forwarded(
    fence: Fence, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = await fence.acquire(RESOURCE, "worker-a")

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("cannot switch to state 15")  # what a killed connection raised

    monkeypatch.setattr(fence.store, "finish_effect", broken)
    answer = await fence.order("widget", lease["token"], "k-1")
    body = await assert_problem(answer, 503, "store_unavailable")
    assert answer.headers["Retry-After"] == "1"
    assert "may have taken effect" in body["detail"]
    assert "nothing was forwarded" not in body["detail"]
    assert body["upstream_status"] == 201
    assert await fence.upstream_orders() == 1
    monkeypatch.undo()
    # The effect is in doubt, and stays so until reconciled: the retry is refused.
    [effect] = await fence.effects()
    assert effect["state"] == "DISPATCHING"
    retry = await fence.order("widget", lease["token"], "k-1")
    await assert_problem(retry, 409, "request_in_progress")
    assert await fence.upstream_orders() == 1


async def test_a_late_contradicting_receipt_answers_conflict_and_blocks(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence(reconcile=PROBE_BY_KEY)
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    committed = await fence.order("widget", lease["token"], "k-1")
    assert committed.status == 201
    effect_id = committed.headers["Fence-Effect-Id"]

    # A second receipt for the same effect (a stalled replica's), saying the opposite.
    receipt = await fence.store.finish_effect(
        effect_id, Event.ANSWERED_NOT_COMMITTED, 409, "upstream answered 409", None
    )
    assert receipt.effect.state == "CONFLICTING"
    shown = await fence.effect(effect_id)
    assert shown["state"] == "CONFLICTING"
    assert shown["events"][-1]["conclusion"] == "conflict"
    retry = await fence.order("widget", lease["token"], "k-1")
    await assert_problem(retry, 423, "resource_blocked")
    assert await fence.upstream_orders() == 1

    resolve = await fence.client.post(
        f"/_fence/v1/effects/{effect_id}/resolve",
        json={"outcome": "committed", "reason": "order 1 is there", "operator": "alice"},
        headers=fence.admin,
    )
    assert resolve.status == 200, await json_body(resolve)
    replay = await fence.order("widget", lease["token"], "k-1")
    assert replay.status == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert await fence.upstream_orders() == 1


async def test_the_reconciler_survives_an_unexpected_failure(
    fence: Fence, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = fence.store
    real_recover = store.recover
    calls: list[str] = []

    async def failing_once(instance_id: str | None, margin_s: float) -> list[str]:
        calls.append("recover")
        if len(calls) == 1:
            raise RuntimeError("an unexpected bug in one round")
        return await real_recover(instance_id, margin_s)

    monkeypatch.setattr(store, "recover", failing_once)
    reconciler = fence.app[RUNTIME].reconciler
    assert reconciler is not None
    reconciler.wake.set()

    async def counted() -> bool:
        text = await (await fence.client.get("/_fence/metrics")).text()
        return 'fenceproxy_background_failures_total{loop="reconciler"} 1.0' in text

    await poll_until(counted, "the failed round to be counted")

    async def swept_again() -> bool:
        return len(calls) >= 2

    # The loop lives on (after its back-off) and sweeps again.
    await poll_until(swept_again, "the reconciler to sweep again")


@pytest.mark.parametrize("path", ["/rules/..", "/rules/."])
async def test_a_fenced_path_with_dot_or_empty_segments_is_refused(fence: Fence, path: str) -> None:
    # One object must be one resource: "a/../b", "./b" and "b" may not fence apart.
    lease = await fence.acquire("rules:r1", "worker-a")
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nFence-Token: {lease['token']}\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    ).encode()
    answer = await raw_request(fence, head)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert b'"code": "invalid_request"' in answer
    assert await fence.effects() == []


async def test_a_malformed_header_line_is_logged_without_its_value(
    fence: Fence, caplog: pytest.LogCaptureFixture
) -> None:
    # aiohttp's parser logs the raw line it could not parse: a Fence-Token or an admin
    # bearer token would land in the logs.
    head = (
        b"GET /_fence/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Fence-Token fpt_SECRETSECRETSECRET\r\nConnection: close\r\n\r\n"
    )
    with caplog.at_level(logging.INFO):
        answer = await raw_request(fence, head)
    assert answer.startswith(b"HTTP/1.1 400") or answer.startswith(b"HTTP/1.0 400"), answer
    assert caplog.records, "the malformed request is still logged"
    assert "SECRETSECRET" not in caplog.text


async def test_100_continue_comes_only_after_the_checks_that_need_no_body(fence: Fence) -> None:
    # A client that waits for 100 Continue before sending its body must learn of a
    # missing token at once, not be invited to upload first.
    head = (
        b"POST /orders/widget HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: k-1\r\n"
        b"Expect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
    )
    answer = await raw_request(fence, head)
    assert answer.startswith(b"HTTP/1.1 401"), answer
    assert b"100 Continue" not in answer

    lease = await fence.acquire(RESOURCE, "worker-a")
    server = fence.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(
            b"POST /orders/widget HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: k-1\r\n"
            b"Fence-Token: " + lease["token"].encode() + b"\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: 11\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        writer.write(b'{"qty": 1} ')
        await writer.drain()
        final = await asyncio.wait_for(reader.read(65536), 10)
        assert final.startswith(b"HTTP/1.1 201"), final
    finally:
        writer.close()
        await writer.wait_closed()
    assert await fence.upstream_orders() == 1


async def test_100_continue_on_the_lease_api_waits_for_the_token_check(fence: Fence) -> None:
    head = (
        b"POST /_fence/v1/leases/renew HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 2\r\n"
        b"Connection: close\r\n\r\n"
    )
    answer = await raw_request(fence, head)
    assert answer.startswith(b"HTTP/1.1 401"), answer
    assert b"100 Continue" not in answer


FORGED_TOKEN = "fpt_" + "Q" * 43  # well-formed, never issued


async def first_answer_head(fence: Fence, head: bytes) -> bytes:
    """The head of the first answer to `head` (an interim 100 Continue counts); the body
    the request announces is never sent."""
    server = fence.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize(
    ("target", "extra"),
    [
        ("/_fence/v1/leases/renew", b""),
        ("/_fence/v1/leases/release", b""),
        ("/orders/widget", b"Idempotency-Key: k-1\r\n"),
    ],
)
async def test_a_forged_token_is_refused_before_the_body_is_invited(
    fence: Fence, target: str, extra: bytes
) -> None:
    """Inviting the body of a token that was never issued here lets anyone make the
    proxy wait for (and read) an upload it will refuse anyway."""
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nFence-Token: {FORGED_TOKEN}\r\n".encode()
        + extra
        + b"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 11\r\n"
        b"Connection: close\r\n\r\n"
    )
    answer = await first_answer_head(fence, head)
    assert answer.startswith(b"HTTP/1.1 403"), answer
    assert b"application/problem+json" in answer


@pytest.mark.parametrize(
    ("target", "extra"),
    [
        ("/_fence/v1/leases/renew", b""),
        ("/_fence/v1/leases/release", b""),
        ("/orders/widget", b"Idempotency-Key: k-1\r\n"),
    ],
)
async def test_a_forged_token_is_refused_before_a_body_still_on_its_way(
    fence: Fence, target: str, extra: bytes
) -> None:
    """Without Expect the body is on its way, and may never come: the token is looked
    up first, the refusal is at once (not after the body timeout, 30 s here), and the
    connection is closed rather than left to drain the rest."""
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nFence-Token: {FORGED_TOKEN}\r\n".encode()
        + extra
        + b"Content-Type: application/json\r\nContent-Length: 11\r\n\r\n{"
    )
    server = fence.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(head)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)  # until the proxy closes
    finally:
        writer.close()
        await writer.wait_closed()
    assert answer.startswith(b"HTTP/1.1 403"), answer
    assert b'"code": "invalid_token"' in answer
    assert b"Connection: close" in answer


async def test_a_renew_with_an_ended_lease_s_token_still_gets_the_store_s_answer(
    fence: Fence,
) -> None:
    """A token issued here whose lease ended is looked up first too, found, and let
    through to the store's own decision (which records that its holder came back)."""
    lease = await fence.acquire(RESOURCE, "worker-a")
    released = await fence.client.post(
        "/_fence/v1/leases/release", json={}, headers={"Fence-Token": lease["token"]}
    )
    assert released.status == 200
    renewed = await fence.client.post(
        "/_fence/v1/leases/renew", json={"ttl_s": 5}, headers={"Fence-Token": lease["token"]}
    )
    body = await renewed.json()
    assert (renewed.status, body["code"]) == (409, "stale_epoch"), body


async def test_a_flood_of_malformed_requests_is_logged_at_a_bounded_rate(
    fence: Fence, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone can send junk: one ERROR line each would let them fill the disk and bury
    the lines that matter."""
    head = b"GET /_fence/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nNot A Header\r\n\r\n"
    with caplog.at_level(logging.INFO):
        for _ in range(MALFORMED_LINES + 5):
            answer = await raw_request(fence, head)
            assert b" 400 " in answer.split(b"\r\n", 1)[0], answer
    logged = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(logged) == MALFORMED_LINES, [r.getMessage() for r in logged]
