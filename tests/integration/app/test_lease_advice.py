"""Lease lives as the store records them, and the advice built from them:
on both backends, with the test's clock, through the app's own API."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.app.conftest import (
    Fence,
    FenceFactory,
    Json,
    assert_problem,
    json_body,
)
from tests.integration.app.test_metrics import labels, scrape
from tests.integration.app.test_reconcile import fenceproxy

ADVICE = "/_fence/v1/lease-advice"


async def renew(fence: Fence, token: str, ttl_s: float) -> Any:
    return await fence.client.post(
        "/_fence/v1/leases/renew", json={"ttl_s": ttl_s}, headers={"Fence-Token": token}
    )


async def release(fence: Fence, token: str) -> Any:
    return await fence.client.post(
        "/_fence/v1/leases/release", json={}, headers={"Fence-Token": token}
    )


async def lease_row(fence: Fence, resource: str, epoch: int) -> dict[str, Any]:
    columns = (
        "granted_at, expires_at, ended_at, end_reason, granted_ttl_s, renewals, "
        "last_ttl_s, came_back_at"
    )
    (row,) = await fence.rows(
        f"SELECT {columns} FROM leases WHERE resource = ? AND epoch = ?", resource, epoch
    )
    return dict(zip(columns.split(", "), row, strict=True))


async def advice(fence: Fence, **query: str) -> Json:
    response = await fence.client.get(ADVICE, params=query, headers=fence.admin)
    body = await json_body(response)
    assert response.status == 200, body
    return body


async def test_a_released_lease_records_its_ttls_renewals_and_turn(fence: Fence) -> None:
    lease = await fence.acquire("job:1", "worker-a", ttl_s=10)
    assert (await renew(fence, lease["token"], 20)).status == 200
    assert (await renew(fence, lease["token"], 25)).status == 200
    fence.clock.advance(3)
    assert (await release(fence, lease["token"])).status == 200

    row = await lease_row(fence, "job:1", 1)
    assert (row["granted_ttl_s"], row["renewals"], row["last_ttl_s"]) == (10, 2, 25)
    assert row["end_reason"] == "released"
    assert row["came_back_at"] is None
    assert row["ended_at"] - row["granted_at"] == fence.clock.approx(3)
    (group,) = (await advice(fence, resource="job:*"))["groups"]
    assert group["turns"] == 1
    assert group["turn_s"]["max"] == fence.clock.approx(3)
    assert group["ttls_in_use_s"] == {"p50": 10, "min": 10}
    assert group["expired"] == {"total": 0, "holder_came_back": 0, "never_came_back": 0}


async def test_a_holder_that_comes_back_after_expiry_marks_a_false_expiry(fence: Fence) -> None:
    # Renews too late: refused lease_expired, and the lease is marked.
    late_renewer = await fence.acquire("job:renew", "worker-a", ttl_s=1)
    # Taken over after expiry, then the old holder's release: stale_epoch, marked.
    late_releaser = await fence.acquire("job:release", "worker-a", ttl_s=1)
    # Writes with an expired lease: refused lease_expired by the admission, marked.
    late_writer = await fence.acquire("supplier:widget", "worker-a", ttl_s=1.5)
    # Never comes back: expired, superseded, not marked.
    await fence.acquire("job:crash", "worker-a", ttl_s=1)
    # Released in time, then released again: stale, but it says nothing of liveness.
    tidy = await fence.acquire("job:tidy", "worker-a", ttl_s=10)
    assert (await release(fence, tidy["token"])).status == 200
    fence.clock.advance(2)

    await assert_problem(await renew(fence, late_renewer["token"], 5), 409, "lease_expired")
    await fence.acquire("job:release", "worker-b", ttl_s=30)
    await assert_problem(await release(fence, late_releaser["token"]), 409, "stale_epoch")
    await assert_problem(
        await fence.order("widget", late_writer["token"], "k-1"), 409, "lease_expired"
    )
    await fence.acquire("job:crash", "worker-b", ttl_s=30)
    await assert_problem(await release(fence, tidy["token"]), 409, "stale_epoch")
    # A second refusal of the same lease marks nothing new.
    await assert_problem(await renew(fence, late_renewer["token"], 5), 409, "lease_expired")

    marked = {
        resource: (await lease_row(fence, resource, 1))["came_back_at"] is not None
        for resource in ("job:renew", "job:release", "supplier:widget", "job:crash", "job:tidy")
    }
    assert marked == {
        "job:renew": True,
        "job:release": True,
        "supplier:widget": True,
        "job:crash": False,
        "job:tidy": False,
    }
    assert (await lease_row(fence, "job:crash", 1))["end_reason"] == "superseded"
    assert (await lease_row(fence, "job:release", 1))["end_reason"] == "superseded"

    body = await advice(fence)
    groups = {group["resource"]: group for group in body["groups"]}
    # job:renew is still open and expired; job:release and job:crash were superseded.
    assert groups["job:*"]["expired"] == {
        "total": 3,
        "holder_came_back": 2,
        "never_came_back": 1,
    }
    assert groups["supplier:*"]["expired"]["holder_came_back"] == 1
    assert groups["rules:*"]["turns"] == 0

    metrics = await scrape(fence)
    false_expiries = metrics["fenceproxy_lease_false_expiries_total"]
    assert false_expiries[labels(group="job:*")] == 2
    assert false_expiries[labels(group="supplier:*")] == 1
    ended = metrics["fenceproxy_leases_ended_total"]
    assert ended[labels(group="job:*", how="superseded")] == 2
    assert ended[labels(group="job:*", how="released")] == 1
    assert metrics["fenceproxy_lease_turn_seconds_count"][labels(group="job:*")] == 1


async def test_a_release_after_expiry_is_a_turn_and_a_false_expiry(fence: Fence) -> None:
    lease = await fence.acquire("job:slow", "worker-a", ttl_s=1)
    fence.clock.advance(4)
    assert (await release(fence, lease["token"])).status == 200
    row = await lease_row(fence, "job:slow", 1)
    assert row["came_back_at"] is not None
    (group,) = (await advice(fence, resource="job:slow"))["groups"]
    assert group["turns"] == 1
    assert group["expired"] == {"total": 1, "holder_came_back": 1, "never_came_back": 0}
    assert any("still working" in warning for warning in group["warnings"])


async def test_a_revocation_ends_the_lease_as_revoked(fence: Fence) -> None:
    await fence.acquire("job:r", "worker-a", ttl_s=10)
    await fence.revoke("job:r")
    row = await lease_row(fence, "job:r", 1)
    assert row["end_reason"].startswith("revoked")
    metrics = await scrape(fence)
    assert metrics["fenceproxy_leases_ended_total"][labels(group="job:*", how="revoked")] == 1


# The turns are exact only on the test's frozen clock: PostgreSQL's runs on.
@pytest.mark.parametrize("backend", ["sqlite"])
async def test_the_endpoint_and_the_cli_answer_alike(make_fence: FenceFactory) -> None:
    fence = await make_fence()
    assert fence.config_path is not None
    turns = [0.5, 1.0, 1.5, 2.0, 4.0]
    for number, turn in enumerate(turns):
        lease = await fence.acquire(f"rules:r{number}", "worker-a", ttl_s=10)
        fence.clock.advance(turn)
        assert (await release(fence, lease["token"])).status == 200
    query = {"targets": "0.5,0", "leases": "1,2,3", "margin": "3", "poll_interval": "0.5"}

    from_api = await advice(fence, **query)
    from_cli = (
        await fenceproxy(
            "lease-advice",
            *("--targets", "0.5,0", "--leases", "1,2,3", "--margin", "3"),
            *("--poll-interval", "0.5", "--json", "--config", str(fence.config_path)),
        )
    ).json()

    assert from_api == from_cli
    groups = {group["resource"]: group for group in from_api["groups"]}
    rules = groups["rules:*"]
    assert rules["turns"] == 5
    assert rules["turn_s"] == {"p50": 1.5, "p90": 4.0, "p99": 4.0, "max": 4.0}
    assert rules["shortest_lease_s"] == {"0.5": 1.5, "0": 4.0}
    assert rules["false_expiry_curve"] == [
        {"lease_s": 1.0, "share": 0.6},
        {"lease_s": 2.0, "share": 0.2},
        {"lease_s": 3.0, "share": 0.2},
    ]
    assert rules["suggested_ttl_s"] == 12.0
    assert rules["detection_delay_s"]["expected"] == 12.0 - 0.75 + 0.25
    assert [route["route"] for route in from_api["routes"]] == ["place-order", "put-rule"]

    table = await fenceproxy("lease-advice", "--config", str(fence.config_path))
    assert table.code == 0, table.err
    assert "rules:*: suggest ttl_s 8: false expiry 0 of 5 measured turns" in table.out
    assert "fewer than 20" in table.out


async def test_the_advice_needs_the_admin_token(fence: Fence) -> None:
    await assert_problem(await fence.client.get(ADVICE), 401, "unauthorized")


async def test_a_lease_of_0_seconds_is_a_point_of_the_curve(fence: Fence) -> None:
    """`leases=0` asks what share of turns a 0 s lease would cut short: all of them.
    Without any turn there is no curve, and the advice says why."""
    (empty,) = [
        group
        for group in (await advice(fence, leases="0", resource="rules:*"))["groups"]
        if group["resource"] == "rules:*"
    ]
    assert empty["turns"] == 0
    assert empty["false_expiry_curve"] == []
    assert any("0 measured turn(s)" in warning for warning in empty["warnings"]), empty

    lease = await fence.acquire("rules:r1", "worker-a", ttl_s=10)
    fence.clock.advance(2)
    assert (await release(fence, lease["token"])).status == 200
    (group,) = [
        group
        for group in (await advice(fence, leases="0,3", resource="rules:*"))["groups"]
        if group["resource"] == "rules:*"
    ]
    assert group["false_expiry_curve"] == [
        {"lease_s": 0.0, "share": 1.0},
        {"lease_s": 3.0, "share": 0.0},
    ]
