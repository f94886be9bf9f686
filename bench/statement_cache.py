"""What `store_pool.statement_cache: false` costs a fenced request's store work.

    python -m bench.statement_cache [--postgres-url ADMIN_URL] [--requests 300]
                                    [--rounds 5] [--through-port PORT]

Creates a fresh database (bench/postgres.py), opens two stores on it, one with the
statement cache on and one with it off, and times one fenced request's store work
(its admission and its receipt, as the proxy does them) one at a time on each, in
alternating rounds so that the shared machine's load falls on both alike. Prints
each round's median per request and the median of the rounds' ratios (off / on).
Off, every statement is parsed again as an unnamed statement first: one more
exchange with the server per statement (a fenced request sends three: the
admission's call and write, the receipt's statement; BEGIN and COMMIT are simple
queries either way).

`--through-port PORT`: the stores connect to that port of the same host instead
(a pgbouncer in transaction mode in front of the server, for example); the cache
on is then measured only if the pooler allows it (session mode).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

from bench.postgres import create_database, drop_database
from core.lifecycle import Event
from policies import StorePool
from store import Admitted, NewEffect, Store, open_store

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
POSTGRES_URL_ENV = "FENCEPROXY_TEST_POSTGRES_URL"


def new_effect(key: str) -> NewEffect:
    return NewEffect(
        route="sink",
        resource="bench:statement-cache",
        idempotency_key=key,
        fingerprint=f"fp-{key}",
        method="POST",
        path=f"/sink/{key}",
        max_in_flight=1,
        upstream_timeout_s=5.0,
        retain_s=3600,
    )


async def fenced_requests(store: Store, token_hash: str, count: int) -> list[float]:
    """Seconds per request: admission, then receipt (committed), one at a time."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        admitted = await store.admit(token_hash, new_effect(uuid.uuid4().hex))
        assert isinstance(admitted, Admitted), admitted
        effect = admitted.effect
        await store.finish_effect(effect.id, Event.ANSWERED_COMMITTED, 201, "201", None, (), effect)
        times.append(time.perf_counter() - started)
    return times


async def leased(store: Store) -> str:
    token_hash = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    granted = await store.acquire("bench:statement-cache", "bench", 3600, token_hash)
    assert isinstance(granted, tuple), granted
    return token_hash


def through(url: str, port: int | None) -> str:
    if port is None:
        return url
    parts = urlsplit(url)
    netloc = (
        f"{parts.username}@{parts.hostname}:{port}"
        if parts.username
        else f"{parts.hostname}:{port}"
    )
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


async def measure(args: argparse.Namespace) -> None:
    url = await create_database(args.postgres_url)
    try:
        store_url = through(url, args.through_port)
        stores = {
            cache: open_store(store_url, time.time, f"bench-{cache}", StorePool(1, 1, cache))
            for cache in (True, False)
        }
        for store in stores.values():
            await store.open()
        try:
            # One lease for both: the same rows, so only the cache differs.
            token_hash = await leased(stores[True])
            for store in stores.values():
                await fenced_requests(store, token_hash, 20)  # warm: connections, plans
            ratios = []
            for number in range(args.rounds):
                on = statistics.median(
                    await fenced_requests(stores[True], token_hash, args.requests)
                )
                off = statistics.median(
                    await fenced_requests(stores[False], token_hash, args.requests)
                )
                ratios.append(off / on)
                print(
                    f"round {number + 1}: cache on {on * 1000:.2f} ms, off {off * 1000:.2f} ms "
                    f"per fenced request's store work (median of {args.requests}), "
                    f"off/on {off / on:.2f}"
                )
            print(f"off/on, median of {args.rounds} rounds: {statistics.median(ratios):.2f}")
        finally:
            for store in stores.values():
                await store.close()
    finally:
        await drop_database(args.postgres_url, url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.statement_cache", description=__doc__)
    parser.add_argument(
        "--postgres-url", default=os.environ.get(POSTGRES_URL_ENV) or DEFAULT_POSTGRES_URL
    )
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--through-port", type=int, default=None)
    args = parser.parse_args(argv)
    asyncio.run(measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
