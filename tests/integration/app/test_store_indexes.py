"""No query of the admission path, the listings, the metrics or retention reads a whole
table: each reads an index range, bounded by its LIMIT or by the few rows in doubt.

* SQLite: every named query's plan (EXPLAIN QUERY PLAN) names an index for every
  table it reads; and, on a store of 10^5 effects and 10^5 kinds of refusal, each read
  query runs a bounded number of virtual-machine steps (counted with a progress
  handler), far below what one pass over either table takes.
* PostgreSQL: on the same kind of store, analyzed, no plan has a sequential scan of
  effects, refusals, effect_events or idempotency.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from store import Store
from store.postgres import to_positional
from store.queries import load_queries
from store.sqlite import block_statements, parse_sqlite_url
from tests.integration.app import backends
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import running_store

DAY = 86400.0
MANY = 100_000
OLD = 1000
# Tables that grow with traffic (leases and resources grow with the resources leased;
# the seeded store has none, so PostgreSQL's plans for them say nothing).
# refusals grows with leases granted (store/refusals.py), not with requests.
GROWING = ("effects", "refusals", "effect_events", "idempotency", "leases", "resources")
SEEDED = ("effects", "refusals", "effect_events", "idempotency")
# `store fence-restore` raises every epoch and ends every lease: it reads them all by
# design, once, with the proxies stopped.
WHOLE_TABLE_BY_DESIGN = {"advance_all_epochs", "end_all_leases", "set_epoch_floor"}
# Progress-handler period (VM instructions) and the most periods a bounded query may
# take: 50 x 1000 instructions (retention's pick of 1000 takes about 20), where one
# pass over the 10^5 effects takes about 300.
STEP_PERIOD = 1000
MAX_PERIODS = 50


@pytest.fixture
async def seeded(store_url: str, clock: FakeClock) -> AsyncIterator[tuple[Store, float]]:
    """A store as retention leaves it after a while: 10^5 settled effects, most recent
    and OLD of them old enough to collect, 50 UNKNOWN; the same for kinds of refusal."""
    async with running_store(store_url, clock) as store:
        now = await store.now()
        recent, long_ago = now - 3600, now - 40 * DAY
        await backends.seed_settled_effects(
            store_url, MANY - OLD, finished_at=recent, prefix="eff_new_", key_expires_at=now + DAY
        )
        await backends.seed_settled_effects(
            store_url, OLD, finished_at=long_ago, prefix="eff_old_", key_expires_at=long_ago + 60
        )
        await backends.seed_settled_effects(
            store_url, 50, finished_at=recent, prefix="eff_unknown_", state="UNKNOWN"
        )
        await backends.seed_refusals(store_url, MANY - OLD, at=recent)
        await backends.seed_refusals(store_url, OLD, at=long_ago)
        yield store, now


def read_queries(now: float) -> dict[str, dict[str, Any]]:
    """The named read queries of the hot path, the listings, the metrics and retention,
    with parameters that reach into the seeded store."""
    some_effect = "eff_new_00000010"
    return {
        "admission_state": {"token_hash": "none", "resource": "seed:r10", "key": some_effect},
        "resource_state": {"resource": "seed:r10"},
        "idempotency_record": {"resource": "seed:r10", "key": some_effect},
        "effect": {"id": some_effect},
        "effect_events": {"effect_id": some_effect},
        "effects": {"limit": 100},
        "effects_of_resource": {"resource": "seed:r10", "state": None, "limit": 100},
        "effects_in_state": {"state": "NOT_SENT", "limit": 100},
        "in_doubt_effects_in_state": {"state": "CONFLICTING", "limit": 100},
        "in_doubt_effects": {"limit": 100},
        "refusals": {"limit": 100},
        "refusals_of_resource": {"resource": "seed:r10", "limit": 100},
        "count_in_doubt_effects_by_state": {},
        "blocked_resources": {},
        "oldest_in_doubt": {},
        "due_probes": {"now": now, "limit": 16},
        "overdue_dispatching_effects": {"cutoff": now},
        "dispatching_effects_of_instance": {"instance_id": "seed"},
        "expired_effects": {"horizon": now - 30 * DAY, "now": now, "limit": 1000},
    }


def sqlite_plan(conn: sqlite3.Connection, sql: str) -> list[str]:
    params = dict.fromkeys(re.findall(r":(\w+)", sql), 1)
    return [str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]


# Each test is about one backend: `backend` given directly overrides conftest's fixture.
@pytest.mark.parametrize("backend", ["sqlite"])
async def test_every_sqlite_query_reads_growing_tables_through_an_index(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock):
        pass  # migrated
    path, _ = parse_sqlite_url(store_url)
    whole_table = re.compile(rf"^SCAN ({'|'.join(GROWING)})\b(?! USING)")
    found = {}
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for name, sql in load_queries("sqlite.sql").items():
            if not sql or name in WHOLE_TABLE_BY_DESIGN:
                continue
            scans = [
                line
                for statement in block_statements(sql)
                for line in sqlite_plan(conn, statement)
                if whole_table.match(line)
            ]
            if scans:
                found[name] = scans
    assert found == {}


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_read_queries_stay_bounded_on_a_large_sqlite_store(
    seeded: tuple[Store, float], store_url: str
) -> None:
    _, now = seeded
    queries = load_queries("sqlite.sql")
    path, _ = parse_sqlite_url(store_url)
    periods: dict[str, int] = {}
    running = [""]

    def tick() -> int:
        periods[running[0]] += 1
        return 0  # go on

    def run(name: str, sql: str, params: dict[str, Any]) -> None:
        running[0] = name
        periods[name] = 0
        conn.execute(sql, params).fetchall()

    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.set_progress_handler(tick, STEP_PERIOD)
        for name, params in read_queries(now).items():
            run(name, queries[name], params)
        # One pass over the effects table, for scale.
        run("one pass", "SELECT count(state) FROM effects NOT INDEXED", {})

    one_pass = periods.pop("one pass")
    assert one_pass > 4 * MAX_PERIODS, one_pass
    assert {name: n for name, n in periods.items() if n > MAX_PERIODS} == {}


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_no_postgresql_plan_reads_a_growing_table_sequentially(
    seeded: tuple[Store, float], store_url: str
) -> None:
    _, now = seeded
    queries = load_queries("postgres.sql")
    ids = json.dumps([f"eff_old_{i:08d}" for i in range(100)])
    writes: dict[str, dict[str, Any]] = {
        "delete_events_of_effects": {"ids": ids},
        "delete_keys_of_effects": {"ids": ids, "now": now},
        "delete_effects": {"ids": ids},
        "delete_expired_refusals": {"horizon": now - 7 * DAY, "limit": 1000},
        "expired_idempotency_records": {"now": now},
    }
    conn = await asyncpg.connect(store_url)
    try:
        await conn.execute("ANALYZE")  # as autovacuum would have by now
        sequential: dict[str, list[str]] = {}
        for name, params in {**read_queries(now), **writes}.items():
            sql, names = to_positional(queries[name])
            plan = await conn.fetch(f"EXPLAIN {sql}", *[params[n] for n in names])
            scans = [
                str(row[0]).strip()
                for row in plan
                if (found := re.search(r"Seq Scan on (\w+)", str(row[0])))
                and found.group(1) in SEEDED
            ]
            if scans:
                sequential[name] = scans
        assert sequential == {}
    finally:
        await conn.close()
