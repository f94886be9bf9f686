"""The relay does to a real PostgreSQL transaction what its fault says, and reports it:
the server's own records (read around the relay) are the evidence."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests import pg
from tests.nemesis.pgrelay import Action, PgRelay

pg_url = pg.database_fixture()
LOST = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    ConnectionError,
    OSError,
)


@pytest.fixture
def relay(pg_url: str) -> Iterator[PgRelay]:
    parts = urlsplit(pg_url)
    with PgRelay(parts.hostname or "127.0.0.1", parts.port or 5432) as running:
        yield running


async def _rows(url: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        return [row["n"] for row in await conn.fetch("SELECT n FROM marks ORDER BY n")]
    finally:
        await conn.close()


async def _table(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE TABLE marks (n INTEGER PRIMARY KEY)")
    finally:
        await conn.close()


async def _insert(conn: asyncpg.Connection, n: int) -> None:
    async with conn.transaction():
        await conn.execute("SELECT 1 /* before */")
        await conn.execute("INSERT INTO marks (n) VALUES ($1)", n)


async def test_passes_through_and_cuts_after_the_commit_of_the_matching_transaction(
    pg_url: str, relay: PgRelay
) -> None:
    await _table(pg_url)
    conn = await asyncpg.connect(relay.url(pg_url))  # sslmode=prefer: answered N
    try:
        await _insert(conn, 1)  # parsed and prepared: the next one binds it by name
        fault = relay.arm("cut_after_commit", match="INSERT INTO marks")
        with pytest.raises(LOST):
            await _insert(conn, 2)
    finally:
        conn.terminate()
    assert fault.wait(5.0)
    assert fault.report is not None
    assert fault.report.forwarded_commit and fault.report.committed
    assert not fault.report.delivered_answer
    assert await _rows(pg_url) == [1, 2]
    assert relay.connections == 1


async def test_cut_before_commit_leaves_nothing_and_fires_once(pg_url: str, relay: PgRelay) -> None:
    await _table(pg_url)
    fault = relay.arm("cut_before_commit", match="INSERT INTO marks")
    conn = await asyncpg.connect(relay.url(pg_url))
    with pytest.raises(LOST):
        await _insert(conn, 1)
    conn.terminate()
    assert fault.wait(5.0) and fault.report is not None
    assert not fault.report.forwarded_commit and fault.report.committed is None
    again = await asyncpg.connect(relay.url(pg_url))
    try:
        await _insert(again, 2)  # disarmed: it passes
    finally:
        await again.close()
    assert await _rows(pg_url) == [2]


async def test_a_transaction_that_does_not_match_passes(pg_url: str, relay: PgRelay) -> None:
    await _table(pg_url)
    fault = relay.arm("cut_before_commit", match="no such text")
    conn = await asyncpg.connect(relay.url(pg_url))
    try:
        await _insert(conn, 1)
    finally:
        await conn.close()
    assert not fault.done
    assert await _rows(pg_url) == [1]


async def test_a_late_commit_holds_the_row_lock_until_it_lands(pg_url: str, relay: PgRelay) -> None:
    """The client is cut while its COMMIT is still on its way (`delay_s`): a new
    connection that takes the same row lock waits for that COMMIT, then sees what it
    committed. What the proxy's lookup after a lost admission answer relies on."""
    await _table(pg_url)
    setup = await asyncpg.connect(pg_url)
    await setup.execute("INSERT INTO marks (n) VALUES (0)")
    await setup.close()
    fault = relay.arm("cut_after_commit", match="INSERT INTO marks", delay_s=1.0)
    conn = await asyncpg.connect(relay.url(pg_url))
    with pytest.raises(LOST):
        async with conn.transaction():
            await conn.execute("SELECT n FROM marks WHERE n = 0 FOR UPDATE")
            await conn.execute("INSERT INTO marks (n) VALUES (1)")
    conn.terminate()
    cut_at = time.monotonic()
    look = await asyncpg.connect(relay.url(pg_url))
    try:
        async with look.transaction():
            await look.execute("SELECT n FROM marks WHERE n = 0 FOR UPDATE")
            waited = time.monotonic() - cut_at
            seen = await look.fetchval("SELECT count(*) FROM marks WHERE n = 1")
    finally:
        await look.close()
    assert fault.wait(5.0) and fault.report is not None and fault.report.committed
    assert seen == 1
    assert waited >= 0.5  # it did wait for the late COMMIT


async def test_hold_delivers_the_answer_late(pg_url: str, relay: PgRelay) -> None:
    await _table(pg_url)
    fault = relay.arm("hold", match="INSERT INTO marks", delay_s=0.5)
    conn = await asyncpg.connect(relay.url(pg_url))
    try:
        started = time.monotonic()
        await _insert(conn, 1)
        assert time.monotonic() - started >= 0.4
    finally:
        await conn.close()
    assert fault.report is not None and fault.report.delivered_answer
    assert await _rows(pg_url) == [1]


@pytest.mark.parametrize("action", ["pass", "hold"])
async def test_a_commit_passed_on_by_a_fault_reaches_the_server_once(
    pg_url: str, relay: PgRelay, action: Action
) -> None:
    """The COMMIT a `pass` or `hold` fault forwarded is not forwarded again: a second
    one would be answered too (a warning, no transaction in progress), an answer the
    client never asked for. The server answers in order, so by the answer to the next
    query the client has heard any warning."""
    await _table(pg_url)
    fault = relay.arm(action, match="INSERT INTO marks", delay_s=0.1)
    conn = await asyncpg.connect(relay.url(pg_url))
    heard: list[str] = []
    conn.add_log_listener(lambda _conn, message: heard.append(message.message))
    try:
        await _insert(conn, 1)
        assert await conn.fetchval("SELECT 2") == 2
    finally:
        await conn.close()
    assert fault.wait(5.0) and fault.report is not None and fault.report.delivered_answer
    assert heard == []
    assert await _rows(pg_url) == [1]


async def test_hold_then_cut_commits_and_never_answers(pg_url: str, relay: PgRelay) -> None:
    await _table(pg_url)
    fault = relay.arm("hold", match="INSERT INTO marks", delay_s=0.2, then="cut")
    conn = await asyncpg.connect(relay.url(pg_url))
    with pytest.raises(LOST):
        await _insert(conn, 1)
    conn.terminate()
    assert fault.wait(5.0) and fault.report is not None
    assert fault.report.committed and not fault.report.delivered_answer
    assert await _rows(pg_url) == [1]


async def test_cut_all_and_blackhole(pg_url: str, relay: PgRelay) -> None:
    conn = await asyncpg.connect(relay.url(pg_url))
    relay.cut_all()
    with pytest.raises(LOST):
        await conn.fetchval("SELECT 1")
    conn.terminate()
    relay.blackhole(True)
    with pytest.raises(TimeoutError):
        await asyncpg.connect(relay.url(pg_url), timeout=0.5)
    relay.blackhole(False)
    again = await asyncpg.connect(relay.url(pg_url))
    try:
        assert await asyncio.wait_for(again.fetchval("SELECT 1"), 5.0) == 1
    finally:
        await again.close()
