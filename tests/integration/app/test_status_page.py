"""The status page's server side, on both backends: the replicas table,
GET /_fence/v1/status and /leases/recent, `fenceproxy status`, and the page's shell
with its security headers. The page in a real browser:
tests/integration/processes/test_status_page.py."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from core.codes import ErrorCode
from proxy import operations
from proxy.ui import CONTENT_SECURITY_POLICY, STATIC, STATIC_FILES
from store import Store
from tests.integration.app.conftest import (
    Fence,
    FenceFactory,
    Json,
    assert_problem,
    json_body,
)
from tests.integration.app.test_auth import (
    AUTH,
    READER_KEY,
    RULES_READER_KEY,
    WORKER_KEY,
    bearer,
)
from tests.integration.app.test_reconcile import fenceproxy

STATUS = "/_fence/v1/status"
RECENT = "/_fence/v1/leases/recent"
PAGE = "/_fence/ui/"
WAIT_S = 10.0
POLL_S = 0.02


async def _get(fence: Fence, path: str) -> Json:
    response = await fence.client.get(path, headers=fence.admin)
    body = await json_body(response)
    assert response.status == 200, body
    return body


async def _status_with_a_replica(fence: Fence) -> Json:
    """The status once this instance's reconciler wrote its row in its first round. The
    row is there before that (the release check at start writes it, with no sweep yet),
    so a row alone is not the round's."""
    deadline = time.monotonic() + WAIT_S
    while True:
        status = await _get(fence, STATUS)
        if any(replica["last_sweep_at"] is not None for replica in status["replicas"]):
            return status
        assert time.monotonic() < deadline, status
        await asyncio.sleep(POLL_S)


async def test_status_names_this_instance_the_store_and_the_replicas_seen(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence()
    status = await _status_with_a_replica(fence)
    instance = status["instance"]
    assert instance["instance_id"] == fence.store.instance_id
    assert instance["version"] == operations.proxy_version() != "unknown"
    # This app's own uptime, seconds since it started, not a clock reading.
    assert 0 <= instance["uptime_s"] < 60
    assert status["store"] == {
        "backend": fence.backend,
        "answers": True,
        "problem": None,
        # The authority's clock: the test's (SQLite) or the database's (PostgreSQL).
        "now": pytest.approx(fence.clock.now, abs=5),
    }
    (replica,) = status["replicas"]
    assert replica["instance_id"] == fence.store.instance_id
    assert abs(replica["seen_at"] - status["store"]["now"]) < 60
    # The first round swept before it wrote the row.
    assert replica["last_sweep_at"] is not None


async def test_a_replica_not_seen_within_the_window_is_not_listed(fence: Fence) -> None:
    # Another replica on the same store (this app's own beats do not touch its row).
    store = Store(fence.store.connector, "other-replica")
    await store.record_replica("9.9", up_s=60.0, sweep_age_s=1.0, probe_age_s=None)
    now = await store.now()
    (row,) = [r for r in await store.replicas(60.0) if r.instance_id == "other-replica"]
    # The ages land on the store's clock.
    assert abs(row.started_at - (now - 60.0)) < fence.clock.tolerance
    assert abs((row.last_sweep_at or 0.0) - (now - 1.0)) < fence.clock.tolerance
    assert row.last_probe_at is None
    fence.clock.advance(61.0)
    assert "other-replica" not in [r.instance_id for r in await store.replicas(60.0)]


async def test_status_and_recent_leases_need_a_reader(make_fence: FenceFactory) -> None:
    fence = await make_fence()
    for path in (STATUS, RECENT):
        response = await fence.client.get(path)
        await assert_problem(response, ErrorCode.UNAUTHORIZED.status, ErrorCode.UNAUTHORIZED.value)
    off = await make_fence(admin_token=None)
    response = await off.client.get(STATUS, headers=fence.admin)
    problem = await assert_problem(
        response, ErrorCode.UNAUTHORIZED.status, ErrorCode.UNAUTHORIZED.value
    )
    assert "admin API is off" in problem["detail"]


async def test_recent_leases_show_live_ended_and_false_expiries(fence: Fence) -> None:
    live = await fence.acquire("supplier:live", "worker-live", 30)
    released = await fence.acquire("supplier:done", "worker-done", 30)
    response = await fence.client.post(
        "/_fence/v1/leases/release", json={}, headers={"Fence-Token": released["token"]}
    )
    assert response.status == 200
    late = await fence.acquire("supplier:late", "worker-late", 1)
    fence.clock.advance(2.0)
    # The holder of the expired lease comes back: a false expiry, marked.
    response = await fence.client.post(
        "/_fence/v1/leases/renew", json={"ttl_s": 5}, headers={"Fence-Token": late["token"]}
    )
    await assert_problem(response, ErrorCode.LEASE_EXPIRED.status, ErrorCode.LEASE_EXPIRED.value)

    body = await _get(fence, RECENT)
    assert [(lease["resource"], lease["holder"]) for lease in body["live"]] == [
        ("supplier:live", "worker-live")
    ]
    assert 0 < body["live"][0]["ttl_left_s"] <= 30
    assert body["live"][0]["epoch"] == live["epoch"]
    ended = {lease["resource"]: lease for lease in body["recently_ended"]}
    assert set(ended) == {"supplier:done", "supplier:late"}
    assert ended["supplier:done"]["end_reason"] == "released"
    assert ended["supplier:done"]["came_back_at"] is None
    assert ended["supplier:late"]["came_back_at"] is not None


async def test_fenceproxy_status_prints_the_same_operation(make_fence: FenceFactory) -> None:
    fence = await make_fence()
    status = await _status_with_a_replica(fence)
    result = await fenceproxy("status", "--config", str(fence.config_path), "--json")
    printed = result.json()
    assert printed["instance"] is None
    assert printed["store"]["answers"] is True
    assert [r["instance_id"] for r in printed["replicas"]] == [
        r["instance_id"] for r in status["replicas"]
    ]
    text = await fenceproxy("status", "--config", str(fence.config_path))
    assert text.code == 0, text
    assert f"store: {fence.backend}, answers" in text.out
    assert fence.store.instance_id in text.out


async def test_the_probe_takes_an_operator_and_a_reason_and_refuses_blank_ones(
    fence: Fence,
) -> None:
    response = await fence.client.post(
        "/_fence/v1/effects/eff_missing/probe", json={"operator": " "}, headers=fence.admin
    )
    await assert_problem(
        response, ErrorCode.INVALID_REQUEST.status, ErrorCode.INVALID_REQUEST.value
    )
    response = await fence.client.post(
        "/_fence/v1/effects/eff_missing/probe", json={"reason": "why"}, headers=fence.admin
    )
    await assert_problem(response, ErrorCode.NOT_FOUND.status, ErrorCode.NOT_FOUND.value)


# -- the page's shell -------------------------------------------------------------------


async def test_the_page_is_a_shell_with_strict_headers_and_no_store_data(fence: Fence) -> None:
    await fence.acquire("supplier:secret-sku", "worker-with-a-name", 30)
    response = await fence.client.get(PAGE)
    assert response.status == 200
    assert response.content_type == "text/html"
    headers = response.headers
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["Referrer-Policy"] == "no-referrer"
    html = await response.text()
    # Nothing from the store without a key: the script reads it with one.
    assert "worker-with-a-name" not in html and "secret-sku" not in html
    # No inline script or style, no event-handler attributes: CSP would block them.
    assert re.findall(r"<script\b[^>]*>", html) == [
        '<script src="/_fence/ui/static/status.js" defer>'
    ]
    assert not re.search(r"\s(style|on[a-z]+)=", html)
    assert "<style" not in html
    assert 'id="login"' in html and "The admin API is off" not in html

    for name, kind in (("status.js", "javascript"), ("status.css", "css")):
        static = await fence.client.get(f"/_fence/ui/static/{name}")
        assert static.status == 200
        assert kind in static.content_type
        assert static.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert static.headers["X-Content-Type-Options"] == "nosniff"
    script = await (await fence.client.get("/_fence/ui/static/status.js")).text()
    # Store values go in as text, never as markup.
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script


async def test_the_page_says_when_the_admin_api_is_off(make_fence: FenceFactory) -> None:
    fence = await make_fence(admin_token=None)
    response = await fence.client.get(PAGE)
    assert response.status == 200
    html = await response.text()
    assert "The admin API is off" in html
    assert 'id="login"' not in html


async def test_the_bare_prefix_leads_to_the_page(fence: Fence) -> None:
    response = await fence.client.get("/_fence/ui", allow_redirects=False)
    assert response.status == 302
    assert response.headers["Location"] == PAGE


async def test_with_auth_a_clients_key_reads_as_the_admin_token_does(
    make_fence: FenceFactory,
) -> None:
    """The page sends whatever key it is given: a client with `read` sees the status,
    and the leases in its scope only; the page's shell asks for a client's key."""
    fence = await make_fence(top_level=AUTH)
    for key in (READER_KEY, RULES_READER_KEY):
        response = await fence.client.get(STATUS, headers=bearer(key))
        assert response.status == 200, await response.text()
    response = await fence.client.post(
        "/_fence/v1/leases",
        json={"resource": "supplier:a", "holder": "worker-a", "ttl_s": 30},
        headers=bearer(WORKER_KEY),
    )
    assert response.status == 201, await response.text()
    everyone = await json_body(await fence.client.get(RECENT, headers=bearer(READER_KEY)))
    assert [lease["resource"] for lease in everyone["live"]] == ["supplier:a"]
    scoped = await json_body(await fence.client.get(RECENT, headers=bearer(RULES_READER_KEY)))
    assert scoped["live"] == []
    html = await (await fence.client.get(PAGE)).text()
    assert "A client&#39;s key (read; operate for actions) or the admin token" in html


async def test_an_expired_unended_lease_is_listed_once(fence: Fence) -> None:
    # Expired and not yet taken over: both the unended leases and those granted
    # recently select it; the list must still name it once.
    await fence.acquire("supplier:late", "worker-late", 1)
    fence.clock.advance(2.0)
    body = await _get(fence, RECENT)
    assert body["live"] == []
    assert [lease["resource"] for lease in body["recently_ended"]] == ["supplier:late"]


async def test_lease_advice_and_the_leases_panel_agree_that_leases_ended(fence: Fence) -> None:
    # Ended with no measured turn (only a release measures one): one expired, one
    # expired then taken over. The Leases panel lists both; the advice must not say
    # that no lease ended.
    await fence.acquire("supplier:late", "worker-late", 1)
    await fence.acquire("supplier:over", "worker-old", 1)
    fence.clock.advance(2.0)
    await fence.acquire("supplier:over", "worker-new", 30)
    panel = await _get(fence, RECENT)
    advice = await _get(fence, "/_fence/v1/lease-advice")
    assert all(group["turns"] == 0 for group in advice["groups"])
    assert advice["leases_ended"] == len(panel["recently_ended"]) == 2
    endings = {
        reason: count
        for group in advice["groups"]
        for reason, count in group["ended"].items()
        if reason != "total"
    }
    assert endings == {"expired": 1, "superseded": 1}
    # The page says "no lease ended" only when the count the server gives is zero.
    script = (STATIC / "status.js").read_text(encoding="utf-8")
    assert "advice.leases_ended" in script


@pytest.mark.parametrize(
    "path",
    [
        "/_fence/ui/static/",  # the folder itself (aiohttp's static route said 403)
        "/_fence/ui/static",
        "/_fence/ui/static/nothing.js",
        "/_fence/ui/static/%2e%2e/templates/status.html",
        "/_fence/ui/static/status.js/",
    ],
)
async def test_only_the_page_s_own_files_are_served(fence: Fence, path: str) -> None:
    response = await fence.client.get(path)
    await assert_problem(response, 404, ErrorCode.NO_ROUTE.value)


def test_the_served_files_are_exactly_the_static_folder() -> None:
    """The fixed list cannot forget a file the page needs, nor name one not there."""
    on_disk = {path.name for path in STATIC.iterdir() if path.is_file()}
    assert set(STATIC_FILES) == on_disk
