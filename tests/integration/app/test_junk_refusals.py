"""Refusals anyone can cause without a token cannot fill the disk (issue 8, item 1).

A refusal that names no lease (no_route, missing_token, invalid_token, ...) is counted
in `refusal_counts`, one row per (code, route, resource, method, truncated path); past
MAX_COUNTED_PER_CODE kinds a code's new ones fold into its '<other>' row. A refusal
naming a lease stays one `rejections` row with holder and epoch. Every stored path is
truncated, and a request target over 8 KiB is `414 uri_too_long`. On SQLite and
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse

from core.records import STORED_PATH_CHARS, TRUNCATED_MARK, Rejection
from policies import Retention
from proxy.requests import MAX_TARGET
from store import Purged, StoreUnavailable
from store.manager import MAX_COUNTED_PER_CODE
from store.tally import OTHER_PATH
from tests.integration.app import backends
from tests.integration.app.conftest import FakeClock, Fence, FenceFactory, assert_problem
from tests.integration.app.test_cli_and_admin_api import cli_main
from tests.integration.app.test_store_contract import running_store

JUNK = "x" * 3000  # a few KB of path per request
DAY = 86400.0


async def store_bytes(fence: Fence) -> int:
    """What the store occupies: SQLite's pages (the write-ahead log's included, as a
    connection sees them), PostgreSQL's tables of this test's schema with their
    indexes and TOAST."""
    if backends.backend_of(fence.store_url) == "sqlite":
        [(pages,)] = await fence.rows("PRAGMA page_count")
        [(size,)] = await fence.rows("PRAGMA page_size")
        return int(pages) * int(size)
    [(total,)] = await fence.rows(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind = 'r'"
    )
    return int(total)


async def in_batches(requests: list[Callable[[], Awaitable[ClientResponse]]]) -> Counter[int]:
    """Send them 50 at a time (under the proxy's in-flight cap); the statuses seen."""
    statuses: Counter[int] = Counter()
    for start in range(0, len(requests), 50):
        for response in await asyncio.gather(*(send() for send in requests[start : start + 50])):
            statuses[response.status] += 1
            response.release()
    return statuses


async def test_ten_thousand_junk_refusals_grow_the_store_by_under_a_megabyte(
    fence: Fence,
) -> None:
    client = fence.client
    forged = {"Fence-Token": "fpt_forged", "Content-Type": "application/json"}
    requests: list[Callable[[], Awaitable[ClientResponse]]] = []
    # 4000 distinct unrouted paths: no_route, past 100 kinds into '<other>'.
    requests += [partial(client.delete, f"/junk/{i}/{JUNK}") for i in range(4000)]
    # 3000 times the same fenced write without a token: one row counting 3000.
    requests += [lambda: client.post("/orders/widget", data=b"{}") for _ in range(3000)]
    # 1000 forged tokens on long paths (invalid_request: the path names no resource).
    requests += [partial(client.put, f"/rules/{i}{JUNK}", headers=forged) for i in range(1000)]
    # 1000 forged tokens on a valid path, 1000 admin calls without the admin token.
    requests += [lambda: client.put("/rules/r1", headers=forged) for _ in range(1000)]
    requests += [lambda: client.get(f"/_fence/v1/effects?q={JUNK}") for _ in range(1000)]
    before = await store_bytes(fence)

    statuses = await in_batches(requests)
    await fence.store.flush_refusal_counts()

    assert statuses == {404: 4000, 401: 4000, 400: 1000, 403: 1000}
    grown = await store_bytes(fence) - before
    assert grown < 1_000_000, grown
    assert await fence.rows("SELECT count(*) FROM rejections") == [(0,)]
    counted = await fence.rows(
        "SELECT code, method, path, route, count FROM refusal_counts ORDER BY code, path"
    )
    by_code: Counter[str] = Counter()
    for code, _method, _path, _route, count in counted:
        by_code[code] += count
    assert by_code == {
        "no_route": 4000,
        "missing_token": 3000,
        "invalid_request": 1000,
        "invalid_token": 1000,
        "unauthorized": 1000,
    }
    assert ("missing_token", "POST", "/orders/widget", "place-order", 3000) in counted
    # Distinct kinds are bounded: 100 a code, then one '<other>' row with the rest.
    assert sum(1 for row in counted if row[0] == "no_route") == MAX_COUNTED_PER_CODE + 1
    assert ("no_route", "*", OTHER_PATH, "", 4000 - MAX_COUNTED_PER_CODE) in counted
    assert all(len(row[2]) <= STORED_PATH_CHARS + len(TRUNCATED_MARK) for row in counted)
    # The listing shows the counted rows, with the fields of a rejection and a count.
    listed = await fence.rejections()
    widget = next(r for r in listed if r["path"] == "/orders/widget")
    assert widget["count"] == 3000
    assert widget["route"] == "place-order"
    assert widget["resource"] == "supplier:widget"
    assert widget["holder"] is None and widget["epoch"] is None
    assert widget["first_seen"] <= widget["at"]
    # And ?resource= finds it: the counted rows keep the resource their path names.
    assert await fence.rejections(resource="supplier:widget") == [widget]


async def test_a_refusal_naming_a_lease_is_still_one_row_with_holder_and_epoch(
    fence: Fence,
) -> None:
    lease = await fence.acquire("supplier:widget")
    await fence.revoke("supplier:widget")
    for key in ("k-1", "k-2"):
        await assert_problem(await fence.order("widget", lease["token"], key), 409, "stale_epoch")

    rows = await fence.rows("SELECT code, holder, epoch FROM rejections")
    assert rows == [("stale_epoch", lease["holder"], lease["epoch"])] * 2
    assert await fence.rows("SELECT count(*) FROM refusal_counts") == [(0,)]
    listed = await fence.rejections()
    assert [(r["code"], r["count"], r["holder"]) for r in listed] == [
        ("stale_epoch", 1, lease["holder"])
    ] * 2
    assert all(r["first_seen"] == r["at"] for r in listed)


async def test_a_request_target_over_8_kib_is_414_and_counted(fence: Fence) -> None:
    at_limit = "/junk?q=" + "x" * (MAX_TARGET - len("/junk?q="))
    await assert_problem(await fence.client.get(at_limit), 404, "no_route")
    over = await fence.client.get(at_limit + "x")
    problem = await assert_problem(over, 414, "uri_too_long")
    assert "8192" in problem["detail"]
    await fence.store.flush_refusal_counts()

    counted = await fence.rows("SELECT code, path, count FROM refusal_counts ORDER BY code")
    assert counted == [("no_route", "/junk", 1), ("uri_too_long", "/junk", 1)]


async def test_a_stored_path_is_truncated_in_a_per_request_rejection_too(fence: Fence) -> None:
    long_path = "/orders/" + "w" * 5000
    # A code that is counted when it names no lease: this one names one, so it is a row.
    await fence.store.record_rejection(
        Rejection(code="invalid_request", method="POST", path=long_path, holder="a", epoch=1)
    )

    assert await fence.rows("SELECT count(*) FROM refusal_counts") == [(0,)]
    [(path, holder)] = await fence.rows("SELECT path, holder FROM rejections")
    assert path == long_path[:STORED_PATH_CHARS] + TRUNCATED_MARK
    assert holder == "a"


async def test_counted_refusals_not_seen_since_the_horizon_are_collected(
    make_fence: FenceFactory,
) -> None:
    # The app's own collector off (its first round runs at start, and a pass it holds
    # makes this test's pass delete nothing): the pass below is the only one.
    fence = await make_fence(
        top_level="retention: {effects_days: 0, rejections_days: 0, leases_days: 0}\n"
    )
    await assert_problem(await fence.client.get("/_fence/v1/effects"), 401, "unauthorized")
    await fence.store.flush_refusal_counts()
    fence.clock.advance(8 * DAY)
    await assert_problem(await fence.client.delete("/junk"), 404, "no_route")
    await fence.store.flush_refusal_counts()

    purged = await fence.store.apply_retention(Retention(30 * DAY, 7 * DAY, 1000))

    assert purged == Purged(effects=0, rejections=1)
    assert await fence.rows("SELECT code FROM refusal_counts") == [("no_route",)]


async def test_the_cli_lists_counted_refusals_with_their_count(fence: Fence) -> None:
    assert fence.config_path is not None
    for _ in range(3):
        await assert_problem(await fence.client.delete("/junk"), 404, "no_route")
    # The CLI's own store has counted nothing; the proxy's counts are written by now.
    await fence.store.flush_refusal_counts()

    listed = await asyncio.to_thread(
        cli_main, str(fence.config_path), "effects", "rejections", "--json"
    )
    table = await asyncio.to_thread(cli_main, str(fence.config_path), "effects", "rejections")

    assert json.loads(listed.out) == await fence.rejections()
    header, row = table.out.splitlines()
    assert header.split()[-1] == "count"
    assert row.split()[-1] == "3"
    assert "DELETE /junk" in row


async def test_counted_refusals_cost_no_write_until_flushed_then_one_row_a_kind(
    store_url: str, clock: FakeClock
) -> None:
    """A flood of refusals without a credential is added up in memory: no write per
    request (on PostgreSQL each would leave a dead row version until a vacuum), one
    row a kind when flushed, and what is left is written when the store closes."""
    widget = Rejection("missing_token", "POST", "/orders/widget", "place-order", "supplier:widget")
    junk = Rejection("no_route", "DELETE", "/junk")
    async with running_store(store_url, clock) as store:
        for _ in range(1000):
            await store.record_rejection(widget)
        assert await backends.rows(store_url, "SELECT count(*) FROM refusal_counts") == [(0,)]

        assert await store.flush_refusal_counts() == 1
        assert await store.flush_refusal_counts() == 0
        clock.advance(5.0)
        await store.record_rejection(widget)
        await store.record_rejection(junk)
    # Closing wrote the last two.
    rows = await backends.rows(
        store_url, "SELECT code, method, path, count, first_seen, last_seen FROM refusal_counts"
    )
    widget_row, junk_row = sorted(rows)
    assert widget_row[:4] == ("missing_token", "POST", "/orders/widget", 1001)
    assert junk_row[:4] == ("no_route", "DELETE", "/junk", 1)
    # Times are the flushes': the first count's and the close's, 5 s (or more) later.
    assert widget_row[5] - widget_row[4] >= 5.0
    assert junk_row[4] == junk_row[5] == widget_row[5]


async def test_counts_a_failed_flush_took_are_written_by_the_next(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        await store.record_rejection(Rejection("no_route", "DELETE", "/junk"))
        real_write = store.connector.write

        async def failing_write(operation: Any, own_clock: bool = False) -> Any:
            raise StoreUnavailable("the store went away")

        store.connector.write = failing_write  # type: ignore[method-assign]
        with pytest.raises(StoreUnavailable):
            await store.flush_refusal_counts()
        store.connector.write = real_write  # type: ignore[method-assign]
        await store.record_rejection(Rejection("no_route", "DELETE", "/junk"))

        assert await store.flush_refusal_counts() == 1
        assert await backends.rows(store_url, "SELECT count FROM refusal_counts") == [(2,)]


async def test_a_count_written_late_with_an_older_clock_keeps_first_before_last(
    tmp_path: Path,
) -> None:
    """Two processes flush the same kind; the one whose time is older writes second
    (on PostgreSQL a transaction's now() is its start, so a flush that began first
    can commit last). The row still spans both times: first_seen ≤ last seen."""
    url = f"sqlite:///{tmp_path / 'fence.db'}"
    early, late = FakeClock(), FakeClock()
    late.advance(10.0)
    junk = Rejection("no_route", "DELETE", "/junk")
    async with (
        running_store(url, late) as later,
        running_store(url, early, instance_id="i-2") as earlier,
    ):
        await later.record_rejection(junk)
        await earlier.record_rejection(junk)
        await later.flush_refusal_counts()
        await earlier.flush_refusal_counts()

    [(first_seen, last_seen, count)] = await backends.rows(
        url, "SELECT first_seen, last_seen, count FROM refusal_counts"
    )
    assert (first_seen, last_seen, count) == (early.now, late.now, 2)


async def test_flushes_run_one_at_a_time_so_the_bound_holds_and_nothing_is_missed(
    store_url: str, clock: FakeClock
) -> None:
    """A flush that began while another had taken its counts but not committed them
    would find none of that one's rows: it would add a hundred kinds more than the
    bound (on PostgreSQL, whose transactions overlap), and whoever listed after it
    would miss the first one's counts."""

    def junk(first: int) -> list[Rejection]:
        return [Rejection("no_route", "DELETE", f"/junk/{i}") for i in range(first, first + 100)]

    async with running_store(store_url, clock) as store:
        for rejection in junk(0):
            await store.record_rejection(rejection)
        first = asyncio.create_task(store.flush_refusal_counts())
        await asyncio.sleep(0)  # it has taken its counts and is writing them
        for rejection in junk(100):
            await store.record_rejection(rejection)
        await store.flush_refusal_counts()
        # Counted as soon as the second flush returns, and within the bound.
        rows = await backends.rows(store_url, "SELECT path, count FROM refusal_counts")
        assert len(rows) == MAX_COUNTED_PER_CODE + 1
        assert sum(count for _, count in rows) == 200
        assert dict(rows)[OTHER_PATH] == 100
        await first
