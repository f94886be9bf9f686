"""The demo upstream keeps honest records: no deduplication, and each fault knob works."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from demo.upstream import make_app

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client(aiohttp_client: AiohttpClient, tmp_path: Path) -> Client:
    return await aiohttp_client(make_app(str(tmp_path / "upstream.db")))


async def effects(client: Client) -> dict[str, Any]:
    response = await client.get("/_demo/effects")
    assert response.status == 200
    body: dict[str, Any] = await response.json()
    return body


async def test_same_idempotency_key_creates_a_new_order_every_time(client: Client) -> None:
    headers = {"Idempotency-Key": "order-1", "Fence-Epoch": "3"}
    first = await client.post("/orders/widget", json={"qty": 2}, headers=headers)
    second = await client.post("/orders/widget", json={"qty": 2}, headers=headers)

    assert first.status == second.status == 201
    first_order, second_order = await first.json(), await second.json()
    assert first_order["id"] != second_order["id"]
    assert first_order == {
        "id": first_order["id"],
        "sku": "widget",
        "qty": 2,
        "idempotency_key": "order-1",
        "fence_epoch": "3",
    }
    listing = await (await client.get("/orders/widget")).json()
    assert [order["id"] for order in listing["orders"]] == [first_order["id"], second_order["id"]]


async def test_order_without_headers_or_qty_defaults(client: Client) -> None:
    response = await client.post("/orders/gadget", json={})

    assert response.status == 201
    order = await response.json()
    assert (order["qty"], order["idempotency_key"], order["fence_epoch"]) == (1, None, None)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'{"qty": "two"}'])
async def test_malformed_order_is_refused_and_not_stored(client: Client, body: bytes) -> None:
    response = await client.post(
        "/orders/widget", data=body, headers={"Content-Type": "application/json"}
    )

    assert response.status == 400
    assert (await effects(client))["orders"] == 0


async def test_order_lookup_by_idempotency_key(client: Client) -> None:
    created = await client.post("/orders/widget", json={}, headers={"Idempotency-Key": "k-1"})
    order = await created.json()

    found = await client.get("/orders/by-key/k-1")
    missing = await client.get("/orders/by-key/k-2")

    assert found.status == 200
    assert await found.json() == order
    assert missing.status == 404


async def test_rules_last_write_wins_and_history_keeps_every_write(client: Client) -> None:
    assert (await client.get("/rules/eu-west")).status == 404

    first = await client.put("/rules/eu-west", json={"target": "a"})
    second = await client.put("/rules/eu-west", json={"target": "b"}, headers={"Fence-Epoch": "7"})

    assert await first.json() == {"rule_id": "eu-west", "rule": {"target": "a"}, "version": 1}
    assert await second.json() == {"rule_id": "eu-west", "rule": {"target": "b"}, "version": 2}
    current = await (await client.get("/rules/eu-west")).json()
    assert current == {"rule_id": "eu-west", "rule": {"target": "b"}, "version": 2}
    history = (await (await client.get("/rules/eu-west/history")).json())["history"]
    assert [(write["version"], write["rule"], write["fence_epoch"]) for write in history] == [
        (1, {"target": "a"}, None),
        (2, {"target": "b"}, "7"),
    ]


async def test_effects_count_orders_and_rule_writes_in_order(client: Client) -> None:
    await client.post("/orders/widget", json={}, headers={"Idempotency-Key": "k-1"})
    await client.put("/rules/r1", json={}, headers={"Fence-Epoch": "2"})
    await client.post("/orders/gadget", json={})

    recorded = await effects(client)

    assert (recorded["orders"], recorded["rule_writes"]) == (2, 1)
    assert [
        (effect["kind"], effect["target"], effect["idempotency_key"], effect["fence_epoch"])
        for effect in recorded["effects"]
    ] == [
        ("order", "widget", "k-1", None),
        ("rule", "r1", None, "2"),
        ("order", "gadget", None, None),
    ]
    sequence = [effect["seq"] for effect in recorded["effects"]]
    assert sequence == sorted(sequence)


async def test_sink_answers_without_storing_anything(client: Client) -> None:
    response = await client.post("/sink/w1", json={"n": 1})

    assert response.status == 201
    assert await response.json() == {"ok": True}
    recorded = await effects(client)
    assert (recorded["orders"], recorded["rule_writes"]) == (0, 0)


async def test_demo_status_answers_that_status_and_commits_nothing(client: Client) -> None:
    order = await client.post("/orders/widget", json={}, headers={"Demo-Status": "503"})
    rule = await client.put("/rules/r1", json={}, headers={"Demo-Status": "409"})

    assert (order.status, rule.status) == (503, 409)
    assert (await order.json())["error"] == "demo_status"
    recorded = await effects(client)
    assert (recorded["orders"], recorded["rule_writes"]) == (0, 0)
    assert (await client.get("/rules/r1")).status == 404


@pytest.mark.parametrize("method, path", [("POST", "/orders/widget"), ("PUT", "/rules/r1")])
async def test_dropped_response_commits_but_the_client_sees_a_disconnect(
    client: Client, method: str, path: str
) -> None:
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await client.request(method, path, json={}, headers={"Demo-Drop-Response": "1"})

    recorded = await effects(client)
    assert recorded["orders"] + recorded["rule_writes"] == 1


async def test_delay_still_commits(client: Client) -> None:
    response = await client.post("/orders/widget", json={}, headers={"Demo-Delay-Ms": "50"})

    assert response.status == 201
    assert (await effects(client))["orders"] == 1


async def test_delayed_write_commits_after_the_caller_gave_up(client: Client) -> None:
    with pytest.raises(TimeoutError):
        await client.post(
            "/orders/widget",
            json={},
            headers={"Demo-Delay-Ms": "200"},
            timeout=aiohttp.ClientTimeout(total=0.05),
        )

    deadline = asyncio.get_running_loop().time() + 5
    while (await effects(client))["orders"] == 0:
        assert asyncio.get_running_loop().time() < deadline, "abandoned write never committed"
        await asyncio.sleep(0.02)


async def test_status_after_commit_answers_an_untrue_error_for_a_stored_write(
    client: Client,
) -> None:
    response = await client.post(
        "/orders/widget", json={}, headers={"Demo-Status-After-Commit": "409"}
    )

    assert response.status == 409
    assert (await response.json())["error"] == "demo_status_after_commit"
    assert (await effects(client))["orders"] == 1


async def test_answer_delay_holds_the_answer_of_a_write_already_stored(client: Client) -> None:
    # Held long enough that a loaded machine sees the write stored before the answer goes.
    answer = asyncio.ensure_future(
        client.post("/orders/widget", json={}, headers={"Demo-Answer-Delay-Ms": "1500"})
    )
    deadline = asyncio.get_running_loop().time() + 5
    while (await effects(client))["orders"] == 0:
        assert asyncio.get_running_loop().time() < deadline, "the write never committed"
        await asyncio.sleep(0.02)
    assert not answer.done()  # stored, and still not answered
    assert (await answer).status == 201


@pytest.mark.parametrize(
    "knob",
    [
        {"Demo-Delay-Ms": "soon"},
        {"Demo-Status": "99"},
        {"Demo-Status": "abc"},
        {"Demo-Status-After-Commit": "600"},
        {"Demo-Answer-Delay-Ms": "-1"},
    ],
)
async def test_invalid_knob_is_refused_and_commits_nothing(
    client: Client, knob: dict[str, str]
) -> None:
    response = await client.post("/orders/widget", json={}, headers=knob)

    assert response.status == 400
    assert (await effects(client))["orders"] == 0


async def test_headers_seen_counts_fence_tokens_on_mutations(client: Client) -> None:
    await client.post("/orders/widget", json={}, headers={"X-Trace": "t-1"})
    seen = await (await client.get("/_demo/headers-seen")).json()
    assert seen["fence_token_seen"] == 0
    assert seen["last_headers"]["x-trace"] == "t-1"

    await client.put("/rules/r1", json={}, headers={"Fence-Token": "leaked"})
    await client.get("/orders/widget", headers={"Fence-Token": "reads are not counted"})

    seen = await (await client.get("/_demo/headers-seen")).json()
    assert seen["fence_token_seen"] == 1
    assert seen["last_headers"]["fence-token"] == "leaked"


async def test_healthz(client: Client) -> None:
    assert (await client.get("/_demo/healthz")).status == 200
