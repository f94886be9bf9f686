"""A NUL (`%00`) in a request path, on every store: PostgreSQL's text cannot hold it, so
a path is recorded with it percent-encoded (a refusal's sample), or the request is
refused before anything is recorded (a fenced write, whose effect keeps its path for
the probe) (docs/reference/wire.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from pytest_aiohttp import AiohttpClient, AiohttpServer

from policies import parse_policy
from proxy.app import build_app
from proxy.cli_serve import server_options
from tests.integration.app.conftest import (
    ADMIN_TOKEN,
    FakeClock,
    FenceFactory,
    ProxyClient,
    assert_problem,
    closed_port,
    json_body,
    policy_yaml,
)
from tests.integration.app.test_wire import Answer, ScriptedUpstream, answer


async def test_a_refused_path_holding_a_nul_is_counted_like_any_other(
    make_fence: FenceFactory,
) -> None:
    # A refusal's path holding a NUL would fail the batch that writes the counts on
    # PostgreSQL, and every refusal counted with it would be lost.
    fence = await make_fence()
    await assert_problem(await fence.client.post("/nowhere/c"), 404, "no_route")
    await assert_problem(await fence.client.post("/nowhere/a%00b"), 404, "no_route")
    [counted] = await fence.rejections(code="no_route")
    assert counted["path"] == "/nowhere/a%00b"
    assert counted["count"] == 2


async def test_a_fenced_path_holding_a_nul_is_refused_and_nothing_recorded(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    store_url: str,
    clock: FakeClock,
) -> None:
    # A fenced route whose path goes on past its resource's parameter.
    text = policy_yaml(store_url, f"http://127.0.0.1:{closed_port()}").replace(
        'path: "/rules/{rule_id}"', 'path: "/rules/{rule_id}/{rest:.*}"'
    )
    policy = parse_policy(text)
    app = build_app(policy, admin_token=ADMIN_TOKEN, clock=clock)
    client: ProxyClient = await aiohttp_client(
        await aiohttp_server(app, host="127.0.0.1", **server_options(policy))
    )
    acquired = await client.post("/_fence/v1/leases", json={"resource": "rules:r1", "holder": "w"})
    token = (await json_body(acquired))["token"]
    response = await client.put("/rules/r1/a%00b", data=b"{}", headers={"Fence-Token": token})
    await assert_problem(response, 400, "invalid_request")
    effects = await client.get(
        "/_fence/v1/effects", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert (await json_body(effects))["effects"] == []


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    scripted = ScriptedUpstream()
    server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
    scripted.port = server.sockets[0].getsockname()[1]
    async with server:
        yield scripted
        server.close()


async def test_a_logged_path_is_the_path_as_sent_so_an_encoded_newline_forges_no_line(
    make_fence: FenceFactory, upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    fence = await make_fence(upstream_url=upstream.url, timeout_s=5)
    whole = answer("200 OK", b"q" * 1000, piece=300)
    upstream.will_answer(Answer(whole.head, whole.pieces[:2], cut=True))
    with caplog.at_level(logging.WARNING, logger="fenceproxy"):
        response = await fence.client.get("/orders/a%0A2026-01-01 ERROR forged?q=secret")
        with contextlib.suppress(aiohttp.ClientPayloadError):
            async with asyncio.timeout(5):
                await response.read()
    [cut] = [r.getMessage() for r in caplog.records if "was cut" in r.getMessage()]
    assert "/orders/a%0A2026-01-01%20ERROR%20forged" in cut
    assert "\n" not in cut and "secret" not in cut
