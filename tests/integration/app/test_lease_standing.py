"""A lease's client judged by the configuration in force now.

Each test takes a lease under one policy, then starts the proxy again on the same
store with another (a client removed, its globs narrowed, `auth:` turned on): the old
token must no longer renew or write, and may still release. Both backends.
"""

from __future__ import annotations

from tests.integration.app.conftest import Fence, FenceFactory, assert_problem, json_body
from tests.integration.app.test_auth import AUTH, WORKER_KEY, _sha256, granted

WITHOUT_SUPPLIER_WORKERS = f"""\
auth:
  clients:
    - name: others
      key_sha256: "{_sha256("others-key-0123456789abcdef0123456789")}"
      resources: ["*"]
      may: [lease]
"""
NARROWED = f"""\
auth:
  clients:
    - name: supplier-workers
      key_sha256: "{_sha256(WORKER_KEY)}"
      resources: ["supplier:gadget"]
      may: [lease]
"""


async def restarted_with(make_fence: FenceFactory, old: Fence, top_level: str) -> Fence:
    """The same store, a proxy started on another policy (the old one closed first)."""
    await old.client.close()
    return await make_fence(top_level=top_level)


async def assert_cut_off(fence: Fence, token: str, code: str) -> None:
    """Renew and a fenced write refused with `code`, nothing sent upstream; release
    still allowed."""
    renewed = await fence.client.post(
        "/_fence/v1/leases/renew", json={"ttl_s": 30}, headers={"Fence-Token": token}
    )
    await assert_problem(renewed, 403, code)
    written = await fence.order("widget", token, "k-after")
    problem = await assert_problem(written, 403, code)
    assert problem["resource"] == "supplier:widget"
    assert await fence.upstream_orders() == 1  # only the write made before
    refusals = [r["code"] for r in await fence.rejections(resource="supplier:widget")]
    assert refusals.count(code) == 2, refusals
    released = await fence.client.post(
        "/_fence/v1/leases/release", json={}, headers={"Fence-Token": token}
    )
    assert released.status == 200, await released.text()


async def leased_and_written(fence: Fence, token: str) -> str:
    """The effect id of a write made while the lease stands."""
    written = await fence.order("widget", token, "k-before")
    assert written.status == 201, await written.text()
    return written.headers["Fence-Effect-Id"]


async def test_a_client_removed_from_auth_loses_its_lease(make_fence: FenceFactory) -> None:
    before = await make_fence(top_level=AUTH)
    token = (await granted(before, "supplier:widget"))["token"]
    effect_id = await leased_and_written(before, token)
    after = await restarted_with(make_fence, before, WITHOUT_SUPPLIER_WORKERS)
    await assert_cut_off(after, token, "forbidden")
    # What became of its write stays readable with the token, as release is allowed.
    outcome = await after.client.get(
        f"/_fence/v1/effects/{effect_id}", headers={"Fence-Token": token}
    )
    assert (await json_body(outcome))["state"] == "COMMITTED"


async def test_a_client_narrowed_out_of_its_globs_loses_its_lease(
    make_fence: FenceFactory,
) -> None:
    before = await make_fence(top_level=AUTH)
    token = (await granted(before, "supplier:widget"))["token"]
    await leased_and_written(before, token)
    after = await restarted_with(make_fence, before, NARROWED)
    await assert_cut_off(after, token, "forbidden_resource")


async def test_a_lease_taken_without_auth_is_refused_once_auth_is_on(
    make_fence: FenceFactory,
) -> None:
    before = await make_fence()
    token = (await before.acquire("supplier:widget"))["token"]
    await leased_and_written(before, token)
    after = await restarted_with(make_fence, before, AUTH)
    await assert_cut_off(after, token, "forbidden")


async def test_a_client_still_configured_keeps_its_lease(make_fence: FenceFactory) -> None:
    before = await make_fence(top_level=AUTH)
    token = (await granted(before, "supplier:widget"))["token"]
    after = await restarted_with(make_fence, before, AUTH)
    renewed = await after.client.post(
        "/_fence/v1/leases/renew", json={"ttl_s": 30}, headers={"Fence-Token": token}
    )
    assert (await json_body(renewed))["client"] == "supplier-workers"
    written = await after.order("widget", token, "k-1")
    assert written.status == 201, await written.text()
