"""The policy's `auth:` block changed by a reload (proxy/reloading.py): a client
added, removed or given a new key is seen from the next request on, a request
already under way finishes under the credentials it started with, and `auth:` is
never taken away by a reload. Both backends, the app in-process (conftest.py), its
policy file rewritten and read again through the admin API.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import ClientResponse

from proxy.runtime import RUNTIME
from tests.integration.app.conftest import (
    Fence,
    FenceFactory,
    Json,
    assert_problem,
    json_body,
    poll_until,
)
from tests.integration.app.test_auth import (
    AUTH,
    READER_KEY,
    WORKER_KEY,
    _sha256,
    acquire,
    bearer,
    granted,
)

NEWCOMER_KEY = "newcomer-key-0123456789abcdef0123456789"
ROTATED_KEY = "worker-key-rotated-0123456789abcdef012345"
NEWCOMER = f"""\
    - name: newcomer
      key_sha256: "{_sha256(NEWCOMER_KEY)}"
      resources: ["supplier:*"]
      may: [lease]
"""
WORKERS = f"""\
    - name: supplier-workers
      key_sha256: "{_sha256(WORKER_KEY)}"
      resources: ["supplier:*"]
      may: [lease]
"""


async def reload(fence: Fence, text: str) -> ClientResponse:
    """Write the policy file anew and make the app read it again."""
    assert fence.config_path is not None
    fence.config_path.write_text(text, encoding="utf-8")
    return await fence.client.post("/_fence/v1/admin/reload", json={}, headers=fence.admin)


async def reloaded(fence: Fence, text: str) -> Json:
    response = await reload(fence, text)
    body = await json_body(response)
    assert response.status == 200, body
    assert body["changed"] is True, body
    return body


def current(fence: Fence) -> str:
    assert fence.config_path is not None
    return fence.config_path.read_text(encoding="utf-8")


def edited(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


@pytest.fixture
async def guarded(make_fence: FenceFactory) -> Fence:
    return await make_fence(top_level=AUTH, reloadable=True)


async def renew(fence: Fence, token: str, key: str | None = None) -> ClientResponse:
    headers = {"Fence-Token": token, **(bearer(key) if key is not None else {})}
    return await fence.client.post("/_fence/v1/leases/renew", json={"ttl_s": 30}, headers=headers)


async def test_a_client_added_by_a_reload_is_let_in_by_the_next_request(guarded: Fence) -> None:
    before = await acquire(guarded, "supplier:widget", bearer(NEWCOMER_KEY))
    await assert_problem(before, 401, "unauthorized")
    await reloaded(guarded, edited(current(guarded), "  clients:\n", "  clients:\n" + NEWCOMER))
    lease = await granted(guarded, "supplier:widget", NEWCOMER_KEY)
    written = await guarded.order("widget", lease["token"], "k-newcomer")
    assert written.status == 201, await written.text()


async def test_a_client_removed_by_a_reload_is_refused_and_its_lease_stays_until_released(
    guarded: Fence,
) -> None:
    token = (await granted(guarded, "supplier:widget"))["token"]
    written = await guarded.order("widget", token, "k-before")
    assert written.status == 201, await written.text()
    await reloaded(guarded, edited(current(guarded), WORKERS, ""))
    # Its key names no client: refused as any unknown key.
    await assert_problem(
        await acquire(guarded, "supplier:gadget", bearer(WORKER_KEY)), 401, "unauthorized"
    )
    # The lease it holds is not ended by the reload...
    shown = await guarded.client.get(
        "/_fence/v1/leases", params={"resource": "supplier:widget"}, headers=guarded.admin
    )
    body = await json_body(shown)
    assert body["holder"] == "worker-a" and body["client"] == "supplier-workers", body
    # ...but its token no longer renews nor writes: the client has no standing.
    await assert_problem(await renew(guarded, token, WORKER_KEY), 403, "forbidden")
    refused = await guarded.order("widget", token, "k-after")
    await assert_problem(refused, 403, "forbidden")
    assert await guarded.upstream_orders() == 1
    released = await guarded.client.post(
        "/_fence/v1/leases/release", json={}, headers={"Fence-Token": token}
    )
    assert released.status == 200, await released.text()


async def test_a_rotated_key_is_refused_and_the_new_one_taken(guarded: Fence) -> None:
    token = (await granted(guarded, "supplier:widget"))["token"]
    await reloaded(guarded, edited(current(guarded), _sha256(WORKER_KEY), _sha256(ROTATED_KEY)))
    await assert_problem(
        await acquire(guarded, "supplier:gadget", bearer(WORKER_KEY)), 401, "unauthorized"
    )
    await granted(guarded, "supplier:gadget", ROTATED_KEY)
    # The client is the same: the lease it took with its old key still stands.
    renewed = await renew(guarded, token, ROTATED_KEY)
    assert renewed.status == 200, await renewed.text()
    written = await guarded.order("widget", token, "k-rotated")
    assert written.status == 201, await written.text()
    # The old key is no longer the proxy's: it is not taken for a credential anywhere.
    listing = await guarded.client.get(
        "/_fence/v1/effects", params={"resource": "supplier:widget"}, headers=bearer(READER_KEY)
    )
    assert listing.status == 200, await listing.text()
    stale = await guarded.client.get(
        "/_fence/v1/effects", params={"resource": "supplier:widget"}, headers=bearer(WORKER_KEY)
    )
    await assert_problem(stale, 401, "unauthorized")


async def test_a_request_under_way_keeps_the_credentials_it_started_with(guarded: Fence) -> None:
    """A write whose head arrived before the reload that removed its client, and whose
    body after it, is admitted as its client stood when it began; and the worker key
    it carried is still taken for the proxy's own, never forwarded upstream."""
    token = (await granted(guarded, "supplier:widget"))["token"]
    body_may_end = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield b'{"qty":'
        await body_may_end.wait()
        yield b" 1}"

    write = asyncio.create_task(
        guarded.client.post(
            "/orders/widget",
            data=body(),
            headers={
                "Content-Type": "application/json",
                "Fence-Token": token,
                "Idempotency-Key": "k-under-way",
                **bearer(WORKER_KEY),
            },
        )
    )
    runtime = guarded.app[RUNTIME]

    async def started() -> bool:
        return runtime.requests_in_flight == 1

    await poll_until(started, "the write's head to reach the proxy")
    await reloaded(guarded, edited(current(guarded), WORKERS, ""))
    body_may_end.set()
    answer = await write
    assert answer.status == 201, await answer.text()
    assert "authorization" not in (await guarded.headers_seen())["last_headers"]
    # The next write of the same lease is judged by the policy now served.
    await assert_problem(await guarded.order("widget", token, "k-next"), 403, "forbidden")


async def test_auth_is_not_taken_away_by_a_reload(guarded: Fence) -> None:
    without = current(guarded).split("auth:\n")[0]
    refused = await reload(guarded, without)
    problem = await assert_problem(refused, 409, "reload_refused")
    assert "auth" in problem["detail"] and "restart" in problem["detail"], problem
    # Nothing changed: a request without a key is still refused.
    anonymous = await guarded.client.post(
        "/_fence/v1/leases", json={"resource": "supplier:widget", "holder": "worker-a"}
    )
    await assert_problem(anonymous, 401, "unauthorized")
    await granted(guarded, "supplier:widget")


async def test_auth_turned_on_by_a_reload_cuts_off_keyless_leases(make_fence: FenceFactory) -> None:
    fence = await make_fence(reloadable=True)
    token = (await fence.acquire("supplier:widget"))["token"]
    await reloaded(fence, current(fence) + AUTH)
    anonymous = await fence.acquire_response("supplier:gadget")
    await assert_problem(anonymous, 401, "unauthorized")
    await assert_problem(await renew(fence, token), 403, "forbidden")
    await granted(fence, "supplier:gadget")


async def test_a_client_whose_key_variable_is_unset_refuses_the_reload(guarded: Fence) -> None:
    unset = f"FENCEPROXY_TEST_UNSET_{uuid.uuid4().hex.upper()}"
    text = edited(
        current(guarded),
        "  clients:\n",
        f"  clients:\n    - {{name: later, key_env: {unset}, resources: ['*'], may: [read]}}\n",
    )
    problem = await assert_problem(await reload(guarded, text), 409, "reload_refused")
    assert unset in problem["detail"] and "nothing was changed" in problem["detail"], problem
    await granted(guarded, "supplier:widget")


async def test_reloads_of_auth_under_load_fail_no_request(guarded: Fence) -> None:
    """Workers keep acquiring, renewing and writing with a key every policy keeps,
    while the file switches between adding and removing another client and rotating
    a third's key: no request of theirs fails, and each write reaches the upstream."""
    original = current(guarded)
    versions = [
        edited(original, "  clients:\n", "  clients:\n" + NEWCOMER),
        edited(original, _sha256(READER_KEY), _sha256(ROTATED_KEY)),
    ]
    stop = asyncio.Event()
    answers: list[tuple[str, int, str]] = []

    async def worker(number: int) -> None:
        while not stop.is_set():
            lease = await acquire(guarded, f"supplier:load-{number}", bearer(WORKER_KEY))
            answers.append(("acquire", lease.status, await lease.text()))
            if lease.status != 201:
                return
            token = (await json_body(lease))["token"]
            renewed = await renew(guarded, token, WORKER_KEY)
            answers.append(("renew", renewed.status, await renewed.text()))
            written = await guarded.order(f"load-{number}", token, uuid.uuid4().hex)
            answers.append(("write", written.status, await written.text()))
            released = await guarded.client.post(
                "/_fence/v1/leases/release", json={}, headers={"Fence-Token": token}
            )
            answers.append(("release", released.status, await released.text()))

    def answered_since(seen: int) -> Callable[[], Awaitable[bool]]:
        async def answered() -> bool:
            return len(answers) >= seen + 4

        return answered

    workers = [asyncio.create_task(worker(n)) for n in range(4)]
    try:
        for round_ in range(8):
            await reloaded(guarded, versions[round_ % 2])
            # Requests answered under each policy, and some begun under the one before.
            await poll_until(answered_since(len(answers)), "the workers' requests after a reload")
    finally:
        stop.set()
        await asyncio.gather(*workers)
    failed = [answer for answer in answers if answer[1] not in (200, 201)]
    assert not failed, failed[:3]
    writes = sum(1 for kind, _, _ in answers if kind == "write")
    assert writes >= 8
    assert await guarded.upstream_orders() == writes
