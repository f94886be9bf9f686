"""A holder reads its own effect without the admin token: GET /_fence/v1/effects/{id}
with a Fence-Token of any lease issued on the effect's resource, current or ended (a
worker told outcome_unknown waits for the settlement, and may have lost its lease
meanwhile). Any other token, or none, reads nothing and changes nothing."""

from __future__ import annotations

from tests.integration.app.conftest import Fence, Json, assert_problem, json_body

RESOURCE = "supplier:widget"


async def committed_effect(fence: Fence) -> tuple[str, str]:
    """A committed order on RESOURCE: (its effect id, the token that placed it)."""
    lease = await fence.acquire(RESOURCE)
    placed = await fence.order("widget", lease["token"], "k-1")
    assert placed.status == 201, await placed.text()
    (effect,) = await fence.effects(resource=RESOURCE)
    return str(effect["id"]), str(lease["token"])


async def read(fence: Fence, effect_id: str, headers: dict[str, str]) -> Json:
    response = await fence.client.get(f"/_fence/v1/effects/{effect_id}", headers=headers)
    body = await json_body(response)
    assert response.status == 200, body
    return body


async def test_the_current_holder_reads_its_effect_as_the_admin_does(fence: Fence) -> None:
    effect_id, token = await committed_effect(fence)
    as_holder = await read(fence, effect_id, {"Fence-Token": token})
    assert as_holder == await fence.effect(effect_id)
    assert as_holder["state"] == "COMMITTED"
    assert token not in str(as_holder)


async def test_an_ended_lease_of_the_resource_still_reads_it(fence: Fence) -> None:
    """Released, then superseded by another holder's lease: the old token still proves
    its bearer held the resource."""
    effect_id, token = await committed_effect(fence)
    released = await fence.client.post(
        "/_fence/v1/leases/release", json={}, headers={"Fence-Token": token}
    )
    assert released.status == 200
    later = await fence.acquire(RESOURCE, holder="worker-b")
    assert (await read(fence, effect_id, {"Fence-Token": token}))["id"] == effect_id
    assert (await read(fence, effect_id, {"Fence-Token": later["token"]}))["id"] == effect_id


async def test_a_lease_on_another_resource_reads_nothing(fence: Fence) -> None:
    effect_id, _ = await committed_effect(fence)
    other = await fence.acquire("supplier:gadget")
    response = await fence.client.get(
        f"/_fence/v1/effects/{effect_id}", headers={"Fence-Token": other["token"]}
    )
    problem = await assert_problem(response, 403, "wrong_resource")
    assert effect_id not in str(problem) and RESOURCE not in str(problem)


async def test_a_token_never_issued_or_malformed_reads_nothing(fence: Fence) -> None:
    effect_id, token = await committed_effect(fence)
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for bad in (forged, "not-a-token"):
        response = await fence.client.get(
            f"/_fence/v1/effects/{effect_id}", headers={"Fence-Token": bad}
        )
        await assert_problem(response, 403, "invalid_token")


async def test_without_a_token_the_admin_token_is_needed(fence: Fence) -> None:
    effect_id, token = await committed_effect(fence)
    response = await fence.client.get(f"/_fence/v1/effects/{effect_id}")
    await assert_problem(response, 401, "unauthorized")
    # An Authorization header means an admin call: it is judged as one, token or not.
    response = await fence.client.get(
        f"/_fence/v1/effects/{effect_id}",
        headers={"Authorization": "Bearer wrong", "Fence-Token": token},
    )
    await assert_problem(response, 401, "unauthorized")


async def test_the_holder_of_a_missing_effect_gets_not_found(fence: Fence) -> None:
    _, token = await committed_effect(fence)
    response = await fence.client.get("/_fence/v1/effects/eff_nope", headers={"Fence-Token": token})
    await assert_problem(response, 404, "not_found")
