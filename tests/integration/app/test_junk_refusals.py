"""Refusals anyone can cause without a token cannot fill the disk.

Every refusal (no_route, missing_token, invalid_token, ...) is counted on the refusal
record (store/refusals.py), one row per (resource, code, route, epoch, holder, client)
where only names that exist are kept; the path is a sample, truncated. A refusal
naming a lease keeps its holder and epoch. A request target over 8 KiB is
`414 uri_too_long`. On SQLite and PostgreSQL. (The flood of every kind, and the
tally's batches, are in test_bounded_refusals.py.)
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
    counted = await fence.rows(
        "SELECT code, method, path, route, count FROM refusals ORDER BY code, path"
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
    # Paths are no kind of their own: one row a code here (no resource exists).
    assert sum(1 for row in counted if row[0] == "no_route") == 1
    assert all(len(row[2]) <= STORED_PATH_CHARS + len(TRUNCATED_MARK) for row in counted)
    # The listing shows the counted rows, with the fields of a rejection and a count.
    listed = await fence.rejections()
    widget = next(r for r in listed if r["path"] == "/orders/widget")
    assert widget["count"] == 3000
    assert widget["route"] == "place-order"
    # Never leased, so not named: anyone can make up resource names in paths.
    assert widget["resource"] is None
    assert widget["holder"] is None and widget["epoch"] is None
    assert widget["first_seen"] <= widget["at"]


async def test_refusals_naming_a_lease_are_one_row_with_holder_epoch_and_count(
    fence: Fence,
) -> None:
    lease = await fence.acquire("supplier:widget")
    await fence.revoke("supplier:widget")
    for key in ("k-1", "k-2"):
        await assert_problem(await fence.order("widget", lease["token"], key), 409, "stale_epoch")

    listed = await fence.rejections()
    assert [(r["code"], r["count"], r["holder"], r["epoch"]) for r in listed] == [
        ("stale_epoch", 2, lease["holder"], lease["epoch"])
    ]
    rows = await fence.rows("SELECT code, holder, epoch, count FROM refusals")
    assert rows == [("stale_epoch", lease["holder"], lease["epoch"], 2)]


async def test_a_request_target_over_8_kib_is_414_and_counted(fence: Fence) -> None:
    at_limit = "/junk?q=" + "x" * (MAX_TARGET - len("/junk?q="))
    await assert_problem(await fence.client.get(at_limit), 404, "no_route")
    over = await fence.client.get(at_limit + "x")
    problem = await assert_problem(over, 414, "uri_too_long")
    assert "8192" in problem["detail"]
    await fence.store.flush_refusal_counts()

    counted = await fence.rows("SELECT code, path, count FROM refusals ORDER BY code")
    assert counted == [("no_route", "/junk", 1), ("uri_too_long", "/junk", 1)]


async def test_a_sampled_path_is_truncated_with_a_lease_named_too(fence: Fence) -> None:
    lease = await fence.acquire("supplier:widget", "a")
    long_path = "/orders/" + "w" * 5000
    await fence.store.record_rejection(
        Rejection(
            code="invalid_request",
            method="POST",
            path=long_path,
            resource="supplier:widget",
            holder="a",
            epoch=lease["epoch"],
        )
    )
    await fence.store.flush_refusal_counts()

    [(path, holder)] = await fence.rows("SELECT path, holder FROM refusals")
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
    assert await fence.rows("SELECT code FROM refusals") == [("no_route",)]


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
        assert await backends.rows(store_url, "SELECT count(*) FROM refusals") == [(0,)]

        assert await store.flush_refusal_counts() == 1
        assert await store.flush_refusal_counts() == 0
        clock.advance(5.0)
        await store.record_rejection(widget)
        await store.record_rejection(junk)
    # Closing wrote the last two.
    rows = await backends.rows(
        store_url, "SELECT code, method, path, count, first_seen, last_seen FROM refusals"
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

        async def failing_write(operation: Any, *args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailable("the store went away")

        store.connector.write = failing_write  # type: ignore[method-assign]
        with pytest.raises(StoreUnavailable):
            await store.flush_refusal_counts()
        store.connector.write = real_write  # type: ignore[method-assign]
        await store.record_rejection(Rejection("no_route", "DELETE", "/junk"))

        # The failed flush's batch, then the one counted since: two writes of one kind.
        assert await store.flush_refusal_counts() == 2
        assert await backends.rows(store_url, "SELECT count FROM refusals") == [(2,)]


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
        url, "SELECT first_seen, last_seen, count FROM refusals"
    )
    assert (first_seen, last_seen, count) == (early.now, late.now, 2)


async def test_flushes_run_one_at_a_time_so_nothing_is_missed(
    store_url: str, clock: FakeClock
) -> None:
    """A flush that returned while another had taken its counts but not committed them
    would let whoever listed after it miss the first one's counts."""

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
        rows = await backends.rows(store_url, "SELECT code, count FROM refusals")
        assert rows == [("no_route", 200)]
        await first
