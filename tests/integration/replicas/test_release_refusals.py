"""`fenceproxy serve` refuses to start, before its banner and saying which, beside a
schema or a running replica this release cannot work with (core/releases.py): a replica
older than the oldest release it serves beside, a newer one that does not serve beside
it, a schema whose contractions need a later release. A replica's row older than the
window is no longer running, and does not stop it."""

from __future__ import annotations

import time
from pathlib import Path

import asyncpg
import pytest

from core.releases import OLDEST_PEER, PEER_WINDOW_S
from store import ReleaseRefused, open_store
from tests.integration.replicas.test_serve_refusals import (
    assert_refused_before_the_banner,
    serve,
)

pytestmark = pytest.mark.timeout(90)

# The store's clock, on which replicas write `seen_at`.
STORE_NOW = (
    "extract(epoch FROM clock_timestamp())::float8 + (SELECT clock_offset_s FROM store_meta)"
)


async def migrated(store_url: str) -> asyncpg.Connection:
    """The store created by this release, and a connection to write into it."""
    store = open_store(store_url, time.time, "setup")
    await store.open()
    await store.close()
    return await asyncpg.connect(store_url)


async def add_replica(
    conn: asyncpg.Connection, instance_id: str, version: str, oldest_peer: str | None, age_s: float
) -> None:
    await conn.execute(
        "INSERT INTO replicas (instance_id, version, started_at, seen_at, oldest_peer)"
        f" VALUES ($1, $2, {STORE_NOW} - $3, {STORE_NOW} - $3, $4)",
        instance_id,
        version,
        age_s,
        oldest_peer,
    )


async def test_serve_refuses_beside_a_replica_older_than_it_serves_beside(
    pg_url: str, tmp_path: Path
) -> None:
    conn = await migrated(pg_url)
    try:
        await add_replica(conn, "replica-ancient", "0.0.9", None, 1.0)
    finally:
        await conn.close()
    run = serve(tmp_path, pg_url)
    assert_refused_before_the_banner(run, "replica replica-ancient runs fenceproxy 0.0.9")
    assert f"serves beside {OLDEST_PEER} or later only" in run.stderr


async def test_serve_refuses_beside_a_newer_replica_that_does_not_serve_beside_it(
    pg_url: str, tmp_path: Path
) -> None:
    conn = await migrated(pg_url)
    try:
        await add_replica(conn, "replica-future", "9.1.0", "9.0.0", 1.0)
    finally:
        await conn.close()
    run = serve(tmp_path, pg_url)
    assert_refused_before_the_banner(
        run, "replica replica-future runs fenceproxy 9.1.0, which serves beside 9.0.0"
    )


async def test_serve_refuses_a_schema_that_needs_a_later_release(
    pg_url: str, tmp_path: Path
) -> None:
    conn = await migrated(pg_url)
    try:
        await conn.execute(
            "INSERT INTO schema_contractions VALUES (9999, 'drop_everything', '9.0.0')"
        )
    finally:
        await conn.close()
    run = serve(tmp_path, pg_url)
    assert_refused_before_the_banner(
        run, "the store's schema needs fenceproxy 9.0.0 or later (migration 9999 drop_everything)"
    )


async def test_a_replica_gone_for_longer_than_the_window_does_not_stop_a_start(
    pg_url: str,
) -> None:
    conn = await migrated(pg_url)
    try:
        await add_replica(conn, "replica-gone", "0.0.9", None, PEER_WINDOW_S + 5)
        store = open_store(pg_url, time.time, "replica-new")
        await store.open()
        try:
            await store.check_release("0.2.0")
            # Written before it looked: a replica starting at the same moment sees it.
            row = await conn.fetchrow(
                "SELECT version, oldest_peer FROM replicas WHERE instance_id = 'replica-new'"
            )
            assert row is not None
            assert (row["version"], row["oldest_peer"]) == ("0.2.0", OLDEST_PEER)
            await add_replica(conn, "replica-back", "0.0.9", None, 1.0)
            with pytest.raises(ReleaseRefused, match="replica-back"):
                await store.check_release("0.2.0")
            # Refused, it does not run: its row is gone.
            gone = await conn.fetchval(
                "SELECT count(*) FROM replicas WHERE instance_id = 'replica-new'"
            )
            assert gone == 0
        finally:
            await store.close()
    finally:
        await conn.close()
