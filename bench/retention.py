"""Benchmark: does the store's latency change as the audit trail grows?

    python -m bench.retention [--effects 100000] [--requests 2000] [--warmup 200]
                              [--backends sqlite,postgresql] [--postgres-url ADMIN_URL]
                              [--json]

For each backend, three fresh stores (SQLite files with synchronous=FULL; fresh
PostgreSQL databases on the server ADMIN_URL names, dropped afterwards), one per
column of the table:

1. **empty**: nothing in the store;
2. **+N settled**: N settled effects (every 10th with an event and a retained
   idempotency record) and N rejections, all recent: retention keeps them;
3. **+N old, collecting**: N settled effects and rejections past retention, while a
   retention collector deletes them in passes of 1000, back to back, during this
   store's turns.

The three take turns of 20 writes each, in one run, so that whatever else the
machine does meanwhile weighs on all three alike. A write is what the proxy does
for a fenced request, one at a time (latency, not throughput): the admission
(`Store.admit`: lease check, idempotency, effect written DISPATCHING, durable
commit) and its receipt (`Store.finish_effect`, committed with a stored response).
After each of the first 50 turns a store also answers one metrics read
(`Store.counts`, what every scrape runs) and one listing (`Store.effects(limit=100)`,
newest first). The third column also reports how long each retention pass took.

The store is driven in-process, without HTTP, so that what is measured is the
store's own cost as its tables grow (HTTP and forwarding costs do not depend on
the store's size; `python -m bench.run` measures them). Bulk rows are inserted
with one INSERT ... SELECT, not through the API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import os
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench.postgres import DatabaseUnavailable, create_database, drop_database
from core.lifecycle import Event
from core.records import StoredResponse
from policies import Retention
from proxy.retention import RetentionCollector
from store import Admitted, NewEffect, Purged, Store, open_store
from store.sqlite import parse_sqlite_url

DAY_S = 86400.0
RESOURCES = 16
SAMPLES = 50
BATCH = 1000
# Writes per turn: the rounds take turns, BLOCK writes each.
BLOCK = 20
RESPONSE = StoredResponse(201, (("Content-Type", "application/json"),), b'{"order": 1}')
POSTGRES_URL_ENV = "FENCEPROXY_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ROUNDS = ("empty", "+N settled", "+N old, collecting")


# -- seeding (one INSERT ... SELECT per table) ------------------------------------------

# Each statement with the names of its parameters: `:name` in SQLite's, `$n` (in this
# order) in PostgreSQL's.
_SEED: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "sqlite": [
        (
            """WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < :count)
            INSERT INTO effects (id, route, resource, holder, epoch, idempotency_key,
                                 fingerprint, method, path, state, instance_id, created_at,
                                 deadline, finished_at, upstream_status, reason, retain_s)
            SELECT :prefix || printf('%08d', i), 'bench', 'seed:r' || (i % 1000), 'seed', 1,
                   :prefix || printf('%08d', i), 'fp', 'POST', '/orders/seed', 'COMMITTED',
                   'seed', :at - 1, :at + 4, :at, 201, 'seeded', 86400
            FROM n""",
            ("count", "prefix", "at"),
        ),
        (
            """INSERT INTO effect_events (effect_id, at, kind, actor, upstream_status,
                                       conclusion, detail)
            SELECT id, finished_at, 'probe', 'seed', 200, 'committed', 'seeded' FROM effects
            WHERE id LIKE :prefix || '%'
              AND CAST(substr(id, length(:prefix) + 1) AS INTEGER) % 10 = 0""",
            ("prefix",),
        ),
        (
            """INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at,
                                     response_status, response_headers, response_body)
            SELECT resource, id, fingerprint, id, 1, :at + 86400, 201, '[]', X'7B7D'
            FROM effects
            WHERE id LIKE :prefix || '%'
              AND CAST(substr(id, length(:prefix) + 1) AS INTEGER) % 10 = 0""",
            ("prefix", "at"),
        ),
        (
            """WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < :count)
            INSERT INTO rejections (at, code, method, path, route, resource, holder, epoch,
                                    fingerprint)
            SELECT :at, 'stale_epoch', 'POST', '/orders/seed', 'bench', 'seed:r' || (i % 1000),
                   'seed', 1, 'fp'
            FROM n""",
            ("count", "at"),
        ),
    ],
    "postgresql": [
        (
            """INSERT INTO effects (id, route, resource, holder, epoch, idempotency_key,
                                 fingerprint, method, path, state, instance_id, created_at,
                                 deadline, finished_at, upstream_status, reason, retain_s)
            SELECT $2::text || lpad(i::text, 8, '0'), 'bench', 'seed:r' || (i % 1000), 'seed',
                   1, $2::text || lpad(i::text, 8, '0'), 'fp', 'POST', '/orders/seed',
                   'COMMITTED', 'seed', $3::float8 - 1, $3::float8 + 4, $3::float8, 201,
                   'seeded', 86400
            FROM generate_series(0, $1::int - 1) AS i""",
            ("count", "prefix", "at"),
        ),
        (
            """INSERT INTO effect_events (effect_id, at, kind, actor, upstream_status,
                                       conclusion, detail)
            SELECT id, finished_at, 'probe', 'seed', 200, 'committed', 'seeded' FROM effects
            WHERE id LIKE $1::text || '%' AND substr(id, length($1::text) + 1)::int % 10 = 0""",
            ("prefix",),
        ),
        (
            """INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at,
                                     response_status, response_headers, response_body)
            SELECT resource, id, fingerprint, id, 1, $2::float8 + 86400, 201, '[]',
                   '\\x7b7d'::bytea
            FROM effects
            WHERE id LIKE $1::text || '%' AND substr(id, length($1::text) + 1)::int % 10 = 0""",
            ("prefix", "at"),
        ),
        (
            """INSERT INTO rejections (at, code, method, path, route, resource, holder, epoch,
                                    fingerprint)
            SELECT $2::float8, 'stale_epoch', 'POST', '/orders/seed', 'bench',
                   'seed:r' || (i % 1000), 'seed', 1, 'fp'
            FROM generate_series(0, $1::int - 1) AS i""",
            ("count", "at"),
        ),
    ],
}


async def seed(store_url: str, count: int, at: float, prefix: str) -> None:
    """`count` settled effects that finished at `at` (every 10th with an event and an
    idempotency record that expires a day later), and `count` rejections at `at`."""
    values: dict[str, Any] = {"count": count, "at": at, "prefix": prefix}
    if store_url.startswith("sqlite"):
        path, _ = parse_sqlite_url(store_url)
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            for sql, names in _SEED["sqlite"]:
                conn.execute(sql, {name: values[name] for name in names})
        return
    pg = await asyncpg.connect(store_url)
    try:
        async with pg.transaction():
            for sql, names in _SEED["postgresql"]:
                await pg.execute(sql, *(values[name] for name in names))
        await pg.execute("ANALYZE")  # as autovacuum would after such a load
    finally:
        await pg.close()


# -- measuring ---------------------------------------------------------------------------


@dataclass
class Figures:
    """Milliseconds per operation of one round."""

    admit_ms: list[float] = field(default_factory=list)
    receipt_ms: list[float] = field(default_factory=list)
    counts_ms: list[float] = field(default_factory=list)
    listing_ms: list[float] = field(default_factory=list)
    retention_pass_ms: list[float] = field(default_factory=list)
    retention_deleted: int = 0

    def summary(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            ordered = sorted(values)
            return {
                "n": len(ordered),
                "p50": statistics.median(ordered),
                "p90": ordered[int(0.9 * (len(ordered) - 1))],
                "p99": ordered[int(0.99 * (len(ordered) - 1))],
                "mean": statistics.fmean(ordered),
            }

        return {
            "admit_ms": stats(self.admit_ms),
            "receipt_ms": stats(self.receipt_ms),
            "counts_ms": stats(self.counts_ms),
            "listing_ms": stats(self.listing_ms),
            "retention_pass_ms": stats(self.retention_pass_ms),
            "retention_deleted": self.retention_deleted,
        }


class Writer:
    """Fenced writes on RESOURCES resources, each under a live lease of its own."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.tokens: list[str] = []
        self.serial = 0

    async def lease_all(self) -> None:
        for n in range(RESOURCES):
            token = hashlib.sha256(secrets.token_bytes(16)).hexdigest()
            granted = await self.store.acquire(f"bench:r{n}", "bench", 3600, token)
            if not isinstance(granted, tuple):
                raise RuntimeError(f"could not lease bench:r{n}: {granted}")
            self.tokens.append(token)

    async def write(self, figures: Figures | None) -> None:
        self.serial += 1
        n = self.serial % RESOURCES
        key = f"k-{self.serial}-{secrets.token_hex(4)}"
        new = NewEffect(
            route="bench",
            resource=f"bench:r{n}",
            idempotency_key=key,
            fingerprint=f"fp-{key}",
            method="POST",
            path=f"/orders/r{n}",
            max_in_flight=1,
            upstream_timeout_s=5.0,
            retain_s=DAY_S,
        )
        started = time.perf_counter()
        admitted = await self.store.admit(self.tokens[n], new)
        admitted_at = time.perf_counter()
        if not isinstance(admitted, Admitted):
            raise RuntimeError(f"admission refused: {admitted}")
        await self.store.finish_effect(
            admitted.effect.id, Event.ANSWERED_COMMITTED, 201, "upstream answered 201", RESPONSE
        )
        if figures is not None:
            figures.admit_ms.append((admitted_at - started) * 1000)
            figures.receipt_ms.append((time.perf_counter() - admitted_at) * 1000)


async def timed(samples: list[float], call: Callable[[], Awaitable[Any]]) -> None:
    started = time.perf_counter()
    await call()
    samples.append((time.perf_counter() - started) * 1000)


async def newest(store: Store) -> None:
    await store.effects(limit=100)


class Collecting:
    """Retention passes back to back, while `running` is set, until the backlog is gone."""

    def __init__(self, store: Store, figures: Figures) -> None:
        self.store = store
        self.figures = figures
        self.retention = Retention(30 * DAY_S, 7 * DAY_S, BATCH)
        self.backlog = True

    async def run(self, stop: asyncio.Event) -> None:
        while self.backlog and not stop.is_set():
            started = time.perf_counter()
            purged: Purged = await self.store.apply_retention(self.retention)
            self.figures.retention_pass_ms.append((time.perf_counter() - started) * 1000)
            self.figures.retention_deleted += purged.effects
            self.backlog = purged.full(BATCH)
            await asyncio.sleep(0)


async def run_backend(urls: list[str], effects: int, requests: int, warmup: int) -> list[Figures]:
    """One store per round, measured in turns of BLOCK writes so that whatever else the
    machine does meanwhile weighs on the three rounds alike."""
    stores = [open_store(url, time.time, "bench") for url in urls]
    for store in stores:
        await store.open()
    try:
        writers = [Writer(store) for store in stores]
        for writer in writers:
            await writer.lease_all()
        now = await stores[0].now()
        print(f"  inserting {effects:,} settled effects and rejections ...", file=sys.stderr)
        await seed(urls[1], effects, now - 3600, "eff_kept_")
        print(f"  inserting {effects:,} old ones ...", file=sys.stderr)
        await seed(urls[2], effects, now - 60 * DAY_S, "eff_old_")
        for writer in writers:
            for _ in range(warmup):
                await writer.write(None)
        figures = [Figures() for _ in stores]
        collecting = Collecting(stores[2], figures[2])
        blocks = max(1, requests // BLOCK)
        for block in range(blocks):
            for writer, measured in zip(writers, figures, strict=True):
                stop = asyncio.Event()
                collector = None
                if writer is writers[2]:
                    collector = asyncio.create_task(collecting.run(stop))
                for _ in range(BLOCK):
                    await writer.write(measured)
                if block < SAMPLES:
                    await timed(measured.counts_ms, writer.store.counts)
                    await timed(measured.listing_ms, functools.partial(newest, writer.store))
                stop.set()
                if collector is not None:
                    await collector
        # What is left of the backlog, as the proxy's collector works it off.
        rest, _ = await RetentionCollector(stores[2], collecting.retention).collect()
        figures[2].retention_deleted += rest.effects
        return figures
    finally:
        for store in stores:
            await store.close()


# -- reporting ---------------------------------------------------------------------------


def fmt(stats: dict[str, float] | None, key: str) -> str:
    return "-" if stats is None else f"{stats[key]:.2f}"


def report(backend: str, effects: int, rounds: list[Figures]) -> list[str]:
    summaries = [figures.summary() for figures in rounds]
    names = [name.replace("N", f"{effects:,}") for name in ROUNDS]
    width = 26
    lines = [
        f"{backend}: ms per operation, one at a time",
        f"{'':<34}" + "".join(f"{name:>{width}}" for name in names),
    ]
    rows = [
        ("admission p50 / p99", "admit_ms"),
        ("receipt p50 / p99", "receipt_ms"),
        ("metrics read (counts) p50 / p99", "counts_ms"),
        ("listing, 100 newest p50 / p99", "listing_ms"),
        ("retention pass p50 / p99", "retention_pass_ms"),
    ]
    for label, key in rows:
        cells = [f"{fmt(s[key], 'p50')} / {fmt(s[key], 'p99')}" for s in summaries]
        lines.append(f"{label:<34}" + "".join(f"{cell:>{width}}" for cell in cells))
    third = summaries[2]
    passes = third["retention_pass_ms"]["n"] if third["retention_pass_ms"] else 0
    lines.append(
        f"retention: {passes} passes of up to {BATCH} ran alongside round 3; "
        f"{third['retention_deleted']:,} old effects deleted in all"
    )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--effects", type=int, default=100_000, help="N, rows per bulk insert")
    parser.add_argument("--requests", type=int, default=2000, help="measured writes per round")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured writes per round")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(POSTGRES_URL_ENV) or DEFAULT_POSTGRES_URL,
        help=f"admin URL (default ${POSTGRES_URL_ENV}, else {DEFAULT_POSTGRES_URL})",
    )
    parser.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    args = parser.parse_args(argv)
    args.backends = [part.strip() for part in args.backends.split(",") if part.strip()]
    if set(args.backends) - {"sqlite", "postgresql"} or not args.backends:
        parser.error("--backends is a comma-separated subset of sqlite,postgresql")
    if args.effects < 1 or args.requests < 1 or args.warmup < 0:
        parser.error("--effects and --requests must be positive, --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, list[Figures]] = {}
    with tempfile.TemporaryDirectory(prefix="fenceproxy-bench-retention-") as workdir:
        for backend in args.backends:
            print(f"{backend}:", file=sys.stderr)
            if backend == "sqlite":
                urls = [f"sqlite:///{Path(workdir) / f'round{n}.db'}" for n in range(3)]
                results[backend] = asyncio.run(
                    run_backend(urls, args.effects, args.requests, args.warmup)
                )
                continue
            urls = []
            try:
                for _ in ROUNDS:
                    urls.append(asyncio.run(create_database(args.postgres_url)))
                results[backend] = asyncio.run(
                    run_backend(urls, args.effects, args.requests, args.warmup)
                )
            except DatabaseUnavailable as exc:
                print(f"benchmark failed: {exc}", file=sys.stderr)
                return 1
            finally:
                for url in urls:
                    asyncio.run(drop_database(args.postgres_url, url))
    out = sys.stderr if args.json else sys.stdout
    lines = [
        f"nproc: {len(os.sched_getaffinity(0))}   load average at the end: "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"{args.requests} measured writes per round after {args.warmup} unmeasured; "
        f"{min(SAMPLES, max(1, args.requests // BLOCK))} metrics reads and listings",
    ]
    for backend, rounds in results.items():
        lines += ["", *report(backend, args.effects, rounds)]
    print("\n".join(lines), file=out)
    if args.json:
        figures = {
            backend: {name: f.summary() for name, f in zip(ROUNDS, rounds, strict=True)}
            for backend, rounds in results.items()
        }
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
