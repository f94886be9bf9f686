"""PostgreSQL's own cost per fenced write, without the proxy or the network load around it.

    python -m bench.pg_write_cost [--postgres-url ADMIN_URL] [--writes N]

Creates a fresh database (bench/postgres.py), opens the store with one connection, and
runs N fenced writes one after another, each as the proxy records one: the admission,
then the one-statement receipt of a 200 on the effect as admitted, with a fresh
idempotency key. It reports the CPU (utime + stime from /proc) the store's server
process used per write (and this process's, the store's client side), which a loaded
machine disturbs far less than requests per second, and what the tables say was
written (rows, and how many updates were HOT).
With pg_stat_statements loaded on the server, its execution time, statements and WAL
records per write too. Run it with another checkout's virtualenv (its `.pth` names its
checkout) to measure that checkout's SQL."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import sys
import time

import asyncpg

from bench.cpu import process_cpu_s
from bench.postgres import backend_pids, create_database, drop_database
from core.lifecycle import Event
from policies.model import StorePool
from store import Admitted, NewEffect, open_store

ADMIN_URL_ENV = "FENCEPROXY_BENCH_POSTGRES_URL"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TABLES = ("effects", "idempotency", "resources")
STATS_FLUSH_S = 2.5


def new_effect(n: int) -> NewEffect:
    return NewEffect(
        route="orders",
        resource="bench",
        idempotency_key=f"key-{n}",
        fingerprint=f"fp-{n}",
        method="POST",
        path=f"/orders/{n}",
        max_in_flight=1,
        upstream_timeout_s=5.0,
        retain_s=3600,
    )


async def table_counts(conn: asyncpg.Connection) -> dict[str, tuple[int, int, int, int]]:
    # A server process sends its table statistics at most once a second, when idle.
    await asyncio.sleep(STATS_FLUSH_S)
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = await conn.fetch(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
        " FROM pg_stat_user_tables WHERE relname = ANY($1::text[])",
        list(TABLES),
    )
    return {str(r[0]): (int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows}


async def statement_counts(conn: asyncpg.Connection) -> tuple[float, int, int] | None:
    """In this database so far, if pg_stat_statements is loaded: the top-level execution
    time (ms), the statements run at every level (with `pg_stat_statements.track = all`,
    those inside functions and the foreign-key checks too) and the WAL records the
    top-level ones wrote (theirs include their nested statements'). The counts do not
    move with the machine's load."""
    try:
        row = await conn.fetchrow(
            "SELECT sum(total_exec_time) FILTER (WHERE s.toplevel), sum(calls),"
            " sum(wal_records) FILTER (WHERE s.toplevel) FROM pg_stat_statements s"
            " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database()"
        )
    except asyncpg.PostgresError:
        return None
    assert row is not None
    return float(row[0] or 0.0), int(row[1] or 0), int(row[2] or 0)


async def measure(admin_url: str, writes: int, warmup: int) -> dict[str, object]:
    url = await create_database(admin_url)
    try:
        store = open_store(url, time.time, "bench", StorePool(1, 1))
        await store.open()
        stats = await asyncpg.connect(url)
        try:
            with_pgss = await stats.fetchval(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
            )
            if not with_pgss:
                with contextlib.suppress(asyncpg.PostgresError):
                    await stats.execute("CREATE EXTENSION pg_stat_statements")
            token_hash = hashlib.sha256(os.urandom(16)).hexdigest()
            await store.acquire("bench", "worker", 3600, token_hash)
            own = await stats.fetchval("SELECT pg_backend_pid()")
            (server,) = [p for p in await backend_pids(admin_url, url) if p != own]

            async def write(n: int) -> None:
                admitted = await store.admit(token_hash, new_effect(n))
                assert isinstance(admitted, Admitted), admitted
                await store.finish_effect(
                    admitted.effect.id,
                    Event.ANSWERED_COMMITTED,
                    200,
                    "upstream answered 200",
                    None,
                    admitted=admitted.effect,
                )

            for n in range(warmup):
                await write(n)
            before_tables = await table_counts(stats)
            before_exec = await statement_counts(stats)
            cpu_before = process_cpu_s(server)
            own_before = time.process_time()
            started = time.monotonic()
            for n in range(warmup, warmup + writes):
                await write(n)
            elapsed = time.monotonic() - started
            own_cpu = time.process_time() - own_before
            cpu_after = process_cpu_s(server)
            after_exec = await statement_counts(stats)
            after_tables = await table_counts(stats)
        finally:
            await stats.close()
            await store.close()
    finally:
        await drop_database(admin_url, url)
    assert cpu_before is not None and cpu_after is not None
    written = {
        name: [a - b for a, b in zip(after_tables[name], before_tables[name], strict=True)]
        for name in TABLES
    }
    updates = sum(w[1] for w in written.values())
    figures: dict[str, object] = {
        "writes": writes,
        "postgres_cpu_ms_per_write": round(1000 * (cpu_after - cpu_before) / writes, 3),
        # The client's side of the same writes: the store's Python and asyncpg.
        "client_cpu_ms_per_write": round(1000 * own_cpu / writes, 3),
        "wall_ms_per_write": round(1000 * elapsed / writes, 3),
        "rows_written_per_write": {
            name: round((w[0] + w[1] + w[3]) / writes, 2) for name, w in written.items()
        },
        "hot_updates": f"{sum(w[2] for w in written.values())}/{updates}",
        "load_average": os.getloadavg()[0],
    }
    if before_exec is not None and after_exec is not None:
        # Includes this script's own statistics queries, which are few and cheap.
        figures["pg_stat_statements_exec_ms_per_write"] = round(
            (after_exec[0] - before_exec[0]) / writes, 3
        )
        figures["statements_per_write"] = round((after_exec[1] - before_exec[1]) / writes, 2)
        figures["wal_records_per_write"] = round((after_exec[2] - before_exec[2]) / writes, 2)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_write_cost", description=__doc__)
    parser.add_argument(
        "--postgres-url", default=os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL
    )
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.postgres_url, args.writes, args.warmup))
    for name, value in figures.items():
        print(f"{name}: {value}", file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
