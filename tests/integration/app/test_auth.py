"""Clients with keys and rights (the policy's `auth:` block).

The proxy app runs on both stores in front of the demo upstream (conftest.py). The
clients' keys are given as `key_sha256` (one test as `key_env`), and every call
presents a key as a real client would: `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from typing import Any

import aiohttp
import pytest

from proxy.auth import KeyProblem
from tests.integration.app.conftest import (
    ADMIN_TOKEN,
    PROBE_BY_KEY,
    Fence,
    FenceFactory,
    Json,
    assert_problem,
    closed_port,
    json_body,
)

WORKER_KEY = "worker-key-0123456789abcdef0123456789"
READER_KEY = "reader-key-0123456789abcdef0123456789"
ONCALL_KEY = "oncall-key-0123456789abcdef0123456789"
RULES_READER_KEY = "rules-reader-key-0123456789abcdef012345"
SECOND_ADMIN_TOKEN = "admin-secret-next-0123456789abcdef0123"
DROP = {"Demo-Drop-Response": "1"}


def _sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


AUTH = f"""\
auth:
  clients:
    - name: supplier-workers
      key_sha256: "{_sha256(WORKER_KEY)}"
      resources: ["supplier:*"]
      may: [lease]
    - name: auditor
      key_sha256: "{_sha256(READER_KEY)}"
      resources: ["*"]
      may: [read]
    - name: oncall
      key_sha256: "{_sha256(ONCALL_KEY)}"
      resources: ["supplier:*"]
      may: [operate]
    - name: rules-auditor
      key_sha256: "{_sha256(RULES_READER_KEY)}"
      resources: ["rules:*"]
      may: [read]
"""


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def guarded(make_fence: FenceFactory) -> Fence:
    return await make_fence(top_level=AUTH)


async def acquire(
    fence: Fence, resource: str, headers: dict[str, str] | None = None
) -> aiohttp.ClientResponse:
    return await fence.client.post(
        "/_fence/v1/leases",
        json={"resource": resource, "holder": "worker-a", "ttl_s": 30},
        headers=headers or {},
    )


async def granted(fence: Fence, resource: str, key: str = WORKER_KEY) -> Json:
    response = await acquire(fence, resource, bearer(key))
    body = await json_body(response)
    assert response.status == 201, body
    return body


async def lease_view(fence: Fence, resource: str, key: str = ADMIN_TOKEN) -> Json:
    response = await fence.client.get(
        "/_fence/v1/leases", params={"resource": resource}, headers=bearer(key)
    )
    body = await json_body(response)
    assert response.status == 200, body
    return body


async def lease_rows(fence: Fence, resource: str) -> list[tuple[Any, ...]]:
    return await fence.rows("SELECT epoch, holder, client FROM leases WHERE resource = ?", resource)


async def unknown_order(fence: Fence, sku: str, token: str, key: str) -> str:
    response = await fence.order(sku, token, key, headers=DROP)
    problem = await assert_problem(response, 504, "outcome_unknown")
    effect_id: str = problem["effect_id"]
    return effect_id


# -- acquiring -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("not-a-key-of-anyone"),
        {"Authorization": f"Basic {WORKER_KEY}"},
        {"Authorization": "Bearer"},
    ],
    ids=["no-key", "wrong-key", "not-bearer", "empty-bearer"],
)
async def test_an_acquire_without_a_clients_key_is_401_and_changes_nothing(
    guarded: Fence, headers: dict[str, str]
) -> None:
    response = await acquire(guarded, "supplier:victim", headers)
    await assert_problem(response, 401, "unauthorized")
    assert await lease_rows(guarded, "supplier:victim") == []
    view = await lease_view(guarded, "supplier:victim")
    assert (view["epoch"], view["holder"]) == (0, None)


async def test_an_acquire_outside_the_clients_globs_is_403_and_changes_nothing(
    guarded: Fence,
) -> None:
    response = await acquire(guarded, "rules:r1", bearer(WORKER_KEY))
    problem = await assert_problem(response, 403, "forbidden_resource")
    assert (problem["client"], problem["resource"]) == ("supplier-workers", "rules:r1")
    assert await lease_rows(guarded, "rules:r1") == []
    assert (await lease_view(guarded, "rules:r1"))["epoch"] == 0


async def test_a_client_without_the_lease_right_cannot_acquire(guarded: Fence) -> None:
    response = await acquire(guarded, "supplier:widget", bearer(READER_KEY))
    await assert_problem(response, 403, "forbidden")
    assert await lease_rows(guarded, "supplier:widget") == []


async def test_a_lease_records_the_client_that_took_it(guarded: Fence) -> None:
    lease = await granted(guarded, "supplier:widget")
    assert (lease["holder"], lease["client"]) == ("worker-a", "supplier-workers")
    assert await lease_rows(guarded, "supplier:widget") == [(1, "worker-a", "supplier-workers")]
    view = await lease_view(guarded, "supplier:widget", READER_KEY)
    assert (view["holder"], view["client"], view["epoch"]) == ("worker-a", "supplier-workers", 1)


async def test_the_admin_token_takes_a_lease_on_any_resource_as_admin(guarded: Fence) -> None:
    lease = await granted(guarded, "rules:r1", ADMIN_TOKEN)
    assert lease["client"] == "admin"
    assert await lease_rows(guarded, "rules:r1") == [(1, "worker-a", "admin")]


async def test_the_token_alone_renews_releases_and_writes(guarded: Fence) -> None:
    """The lease's token is the capability: none of these present a client's key."""
    lease = await granted(guarded, "supplier:widget")
    token = {"Fence-Token": lease["token"]}
    renewed = await guarded.client.post("/_fence/v1/leases/renew", json={}, headers=token)
    assert renewed.status == 200, await renewed.text()
    assert (await json_body(renewed))["client"] == "supplier-workers"
    order = await guarded.order("widget", lease["token"], "k-1")
    assert order.status == 201, await order.text()
    released = await guarded.client.post("/_fence/v1/leases/release", json={}, headers=token)
    assert released.status == 200, await released.text()


async def test_without_auth_the_lease_api_stays_open_and_records_no_client(fence: Fence) -> None:
    lease = await fence.acquire("supplier:widget")
    assert lease["client"] is None
    assert (await fence.lease("supplier:widget"))["client"] is None
    assert await lease_rows(fence, "supplier:widget") == [(1, "worker-a", None)]


# -- reading -----------------------------------------------------------------------------


async def test_the_lease_view_needs_read_on_the_resource(guarded: Fence) -> None:
    await granted(guarded, "supplier:widget")
    anonymous = await guarded.client.get(
        "/_fence/v1/leases", params={"resource": "supplier:widget"}
    )
    await assert_problem(anonymous, 401, "unauthorized")
    worker = await guarded.client.get(
        "/_fence/v1/leases", params={"resource": "supplier:widget"}, headers=bearer(WORKER_KEY)
    )
    await assert_problem(worker, 403, "forbidden")
    elsewhere = await guarded.client.get(
        "/_fence/v1/leases",
        params={"resource": "supplier:widget"},
        headers=bearer(RULES_READER_KEY),
    )
    await assert_problem(elsewhere, 403, "forbidden_resource")


async def test_listings_show_a_scoped_client_only_its_resources(guarded: Fence) -> None:
    supplier = await granted(guarded, "supplier:widget")
    rules = await granted(guarded, "rules:r1", ADMIN_TOKEN)
    assert (await guarded.order("widget", supplier["token"], "k-1")).status == 201
    rule = await guarded.client.put(
        "/rules/r1", json={"route_to": "eu"}, headers={"Fence-Token": rules["token"]}
    )
    assert rule.status == 200, await rule.text()
    # A refusal on each resource, and one about no resource at all.
    assert (await guarded.order("widget", None, "k-2")).status == 401
    assert (await guarded.client.put("/rules/r1", json={})).status == 401
    assert (await guarded.client.get("/_fence/v1/nothing-here")).status == 404

    async def listed(path: str, field: str, key: str, **query: str) -> set[Any]:
        response = await guarded.client.get(path, params=query, headers=bearer(key))
        body = await json_body(response)
        assert response.status == 200, body
        return {row["resource"] for row in body[field]}

    effects, rejections = "/_fence/v1/effects", "/_fence/v1/rejections"
    assert await listed(effects, "effects", RULES_READER_KEY) == {"rules:r1"}
    assert await listed(effects, "effects", READER_KEY) == {"rules:r1", "supplier:widget"}
    assert await listed(rejections, "rejections", RULES_READER_KEY) == {"rules:r1"}
    assert await listed(rejections, "rejections", READER_KEY) == {
        "rules:r1",
        "supplier:widget",
        None,
    }
    assert await listed(effects, "effects", RULES_READER_KEY, limit="1") == {"rules:r1"}
    outside = await guarded.client.get(
        effects, params={"resource": "supplier:widget"}, headers=bearer(RULES_READER_KEY)
    )
    await assert_problem(outside, 403, "forbidden_resource")
    [order] = await guarded.effects(resource="supplier:widget")
    shown = await guarded.client.get(
        f"/_fence/v1/effects/{order['id']}", headers=bearer(RULES_READER_KEY)
    )
    await assert_problem(shown, 403, "forbidden_resource")


async def test_the_in_doubt_listing_is_filtered_too(guarded: Fence) -> None:
    lease = await granted(guarded, "supplier:widget")
    await unknown_order(guarded, "widget", lease["token"], "k-1")

    async def in_doubt(key: str) -> Json:
        response = await guarded.client.get("/_fence/v1/reconcile", headers=bearer(key))
        body = await json_body(response)
        assert response.status == 200, body
        return body

    everything = await in_doubt(READER_KEY)
    assert everything["blocked_resources"] == ["supplier:widget"]
    assert len(everything["in_doubt"]) == 1
    assert await in_doubt(RULES_READER_KEY) == {"blocked_resources": [], "in_doubt": []}


# -- operating -----------------------------------------------------------------------------


async def test_a_read_only_client_cannot_revoke_and_an_operator_can(guarded: Fence) -> None:
    await granted(guarded, "supplier:widget")
    payload = {"resource": "supplier:widget", "reason": "stuck worker"}
    refused = await guarded.client.post(
        "/_fence/v1/admin/revoke", json=payload, headers=bearer(READER_KEY)
    )
    await assert_problem(refused, 403, "forbidden")
    assert (await lease_view(guarded, "supplier:widget"))["epoch"] == 1
    revoked = await guarded.client.post(
        "/_fence/v1/admin/revoke", json=payload, headers=bearer(ONCALL_KEY)
    )
    body = await json_body(revoked)
    assert revoked.status == 200, body
    assert (body["revoked_epoch"], body["epoch"]) == (1, 2)
    [(reason,)] = await guarded.rows(
        "SELECT end_reason FROM leases WHERE resource = ?", "supplier:widget"
    )
    assert reason == "revoked by oncall: stuck worker"


async def test_an_operator_acts_only_on_its_resources(guarded: Fence) -> None:
    await granted(guarded, "rules:r1", ADMIN_TOKEN)
    refused = await guarded.client.post(
        "/_fence/v1/admin/revoke",
        json={"resource": "rules:r1", "reason": "not mine"},
        headers=bearer(ONCALL_KEY),
    )
    await assert_problem(refused, 403, "forbidden_resource")
    assert (await lease_view(guarded, "rules:r1"))["epoch"] == 1


async def test_probe_and_resolve_record_the_clients_name(make_fence: FenceFactory) -> None:
    # A route with a probe (one without is refused before anyone is asked), and a write
    # that never landed: inside the settle window its probe stays inconclusive.
    guarded = await make_fence(top_level=AUTH, reconcile=PROBE_BY_KEY)
    lease = await granted(guarded, "supplier:widget")
    failed = await guarded.order("widget", lease["token"], "k-1", headers={"Demo-Status": "503"})
    effect_id = (await assert_problem(failed, 504, "outcome_unknown"))["effect_id"]
    reader_probe = await guarded.client.post(
        f"/_fence/v1/effects/{effect_id}/probe", headers=bearer(READER_KEY)
    )
    await assert_problem(reader_probe, 403, "forbidden")
    probe = await guarded.client.post(
        f"/_fence/v1/effects/{effect_id}/probe", headers=bearer(ONCALL_KEY)
    )
    assert probe.status == 200, await probe.text()
    resolved = await guarded.client.post(
        f"/_fence/v1/effects/{effect_id}/resolve",
        json={"outcome": "not_committed", "reason": "checked by phone"},
        headers=bearer(ONCALL_KEY),
    )
    body = await json_body(resolved)
    assert resolved.status == 200, body
    assert body["settled_by"] == "operator:oncall"
    effect = await guarded.effect(effect_id)
    # The background reconciler may record a probe of its own (as this instance).
    actors = {(event["kind"], event["actor"]) for event in effect["events"]}
    assert {("probe", "operator:oncall"), ("resolve", "operator:oncall")} <= actors


async def test_a_client_may_name_the_person_who_decided(guarded: Fence) -> None:
    lease = await granted(guarded, "supplier:widget")
    effect_id = await unknown_order(guarded, "widget", lease["token"], "k-1")
    resolved = await guarded.client.post(
        f"/_fence/v1/effects/{effect_id}/resolve",
        json={"outcome": "committed", "reason": "seen", "operator": "alice"},
        headers=bearer(ONCALL_KEY),
    )
    body = await json_body(resolved)
    assert resolved.status == 200, body
    assert body["settled_by"] == "operator:oncall/alice"


async def test_the_admin_token_still_names_its_operator(guarded: Fence) -> None:
    lease = await granted(guarded, "supplier:widget")
    effect_id = await unknown_order(guarded, "widget", lease["token"], "k-1")
    unnamed = await guarded.client.post(
        f"/_fence/v1/effects/{effect_id}/resolve",
        json={"outcome": "committed", "reason": "seen"},
        headers=guarded.admin,
    )
    problem = await assert_problem(unnamed, 400, "invalid_request")
    # Said as the rule it is (the schema's and the docs'), not as a type error.
    assert problem["detail"] == (
        "operator is required with the admin token: it is shared, so name who decides"
    )
    named = await guarded.client.post(
        f"/_fence/v1/effects/{effect_id}/resolve",
        json={"outcome": "committed", "reason": "seen", "operator": "bob"},
        headers=guarded.admin,
    )
    assert (await json_body(named))["settled_by"] == "operator:bob"
    revoked = await guarded.revoke("supplier:widget", "done")
    assert revoked["epoch"] == 2
    [(reason,)] = await guarded.rows(
        "SELECT end_reason FROM leases WHERE resource = ?", "supplier:widget"
    )
    assert reason == "revoked by admin: done"


# -- admin tokens -------------------------------------------------------------------------


@pytest.mark.parametrize("top_level", ["", AUTH], ids=["no-auth", "auth"])
async def test_two_admin_tokens_both_work_for_rotation(
    make_fence: FenceFactory, top_level: str
) -> None:
    fence = await make_fence(top_level=top_level, admin_token_next=SECOND_ADMIN_TOKEN)
    for token in (ADMIN_TOKEN, SECOND_ADMIN_TOKEN):
        response = await fence.client.get("/_fence/v1/effects", headers=bearer(token))
        assert response.status == 200, await response.text()
    stranger = await fence.client.get("/_fence/v1/effects", headers=bearer("retired-token"))
    await assert_problem(stranger, 401, "unauthorized")


async def test_without_auth_admin_calls_still_need_the_admin_token(fence: Fence) -> None:
    for key in (None, WORKER_KEY):
        headers = bearer(key) if key else {}
        response = await fence.client.get("/_fence/v1/effects", headers=headers)
        await assert_problem(response, 401, "unauthorized")


# -- keys from the environment ------------------------------------------------------------


async def test_a_key_env_client_authenticates_with_the_variables_value(
    make_fence: FenceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FENCEPROXY_TEST_KEY_ROUTING", WORKER_KEY)
    fence = await make_fence(
        top_level=(
            "auth:\n  clients:\n    - {name: routing, key_env: FENCEPROXY_TEST_KEY_ROUTING,"
            ' resources: ["rules:*"], may: [lease]}\n'
        )
    )
    lease = await granted(fence, "rules:r1")
    assert lease["client"] == "routing"


async def test_an_unset_key_env_refuses_to_build_the_app(
    make_fence: FenceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FENCEPROXY_TEST_KEY_UNSET", raising=False)
    with pytest.raises(KeyProblem, match=r"auth\.clients\[0\]\.key_env \(line \d+\): "):
        await make_fence(
            top_level=(
                "auth:\n  clients:\n    - {name: routing, key_env: FENCEPROXY_TEST_KEY_UNSET,"
                ' resources: ["*"], may: [lease]}\n'
            )
        )


# -- metrics -------------------------------------------------------------------------------


async def test_with_auth_metrics_on_the_main_listener_need_read_on_every_resource(
    guarded: Fence,
) -> None:
    """The counts span every resource (leases, refusals, effects by route): a reader
    scoped to some would learn of the others' traffic."""
    await assert_problem(await guarded.client.get("/_fence/metrics"), 401, "unauthorized")
    worker = await guarded.client.get("/_fence/metrics", headers=bearer(WORKER_KEY))
    await assert_problem(worker, 403, "forbidden")
    scoped = await guarded.client.get("/_fence/metrics", headers=bearer(RULES_READER_KEY))
    await assert_problem(scoped, 403, "forbidden_resource")
    reader = await guarded.client.get("/_fence/metrics", headers=bearer(READER_KEY))
    assert reader.status == 200
    assert "fenceproxy_" in await reader.text()


async def test_a_scoped_reader_sees_the_status_which_names_no_resource(guarded: Fence) -> None:
    """/status is about the service (this instance, the store, the replicas), which
    every reader's status page needs; nothing in it is about a resource, so there is
    nothing outside a reader's globs to hide."""
    await granted(guarded, "supplier:widget")
    refused = await guarded.client.get("/supplier-only-path")
    await assert_problem(refused, 404, "no_route")
    response = await guarded.client.get("/_fence/v1/status", headers=bearer(RULES_READER_KEY))
    text = await response.text()
    assert response.status == 200, text
    assert "supplier" not in text


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


async def test_metrics_on_their_own_listener(make_fence: FenceFactory) -> None:
    port = closed_port()
    fence = await make_fence(
        top_level=AUTH + f"metrics_listen: {{host: 127.0.0.1, port: {port}}}\n"
    )
    await granted(fence, "supplier:widget")
    # Not on the main listener, whoever asks.
    main = await fence.client.get("/_fence/metrics", headers=fence.admin)
    await assert_problem(main, 404, "no_route")
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/_fence/metrics") as response,
    ):
        assert response.status == 200
        assert response.content_type == "text/plain"
        assert "fenceproxy_" in await response.text()
    # Started and stopped with the app.
    await fence.client.close()
    assert not _accepts(port)


async def test_a_key_that_is_not_utf_8_is_401_not_an_error(guarded: Fence) -> None:
    """Header bytes aiohttp cannot decode as UTF-8 reach the handler as surrogates."""
    server = guarded.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(
            b"GET /_fence/v1/effects HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer \xff\xfe-not-utf-8\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert b'"code": "unauthorized"' in answer
