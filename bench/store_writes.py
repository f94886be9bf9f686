"""Benchmark: fenced writes through the SQLite store in-process, one connector against
another in the same process, taking turns.

    python -m bench.store_writes [--concurrency 16] [--seconds 5] [--turns 6]
                                 [--against PATH/store/sqlite.py] [--steps] [--json]

C workers each hold a lease on a resource of their own and make, in a loop, what the
proxy makes of a fenced request: an admission (`Store.admit`, durable) and its
receipt (`Store.finish_effect`, durable, from the effect as admitted, as the proxy
records it: the `receipt` block). No HTTP, no upstream: what is measured is
the store and its connector, group commit included. A turn runs for `--seconds`.

`--against` names another checkout's `store/sqlite.py` (e.g. a worktree of an older
commit): its `SQLiteConnector` is loaded beside this checkout's, each on a store file
of its own, and the two take turns (this one first), so that whatever else the
machine does weighs on both alike. It must speak this checkout's store interface
(store/base.py) and SQL (store/sqlite.sql). Per turn: writes per second, the write's
p50 and p99, and the process's CPU (every thread) per write; then the medians.
`--against` records its receipts step by step (the
`receipt` block of this checkout's SQL is not one an older connector runs; on SQLite it
was empty, so the proxy took the steps anyway). `--steps` adds this checkout's connector
recording its receipts step by step as a third contender: what the block saves.
bench/README.md has the figures that chose the connector.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.lifecycle import Event
from core.records import StoredResponse
from store import Admitted, NewEffect, Store
from store.base import Connector
from store.sqlite import SQLiteConnector

RESPONSE = StoredResponse(201, (("Content-Type", "application/json"),), b'{"order": 1}')
ConnectorClass = Callable[[str, Callable[[], float]], Connector]


def connector_class(path: Path) -> ConnectorClass:
    """`SQLiteConnector` of another checkout's store/sqlite.py."""
    spec = importlib.util.spec_from_file_location(
        f"bench_connector_{path.parent.parent.name}", path
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found: ConnectorClass = module.SQLiteConnector
    return found


class Worker:
    """Fenced writes on one resource, under a lease of its own."""

    def __init__(self, store: Store, n: int, as_admitted: bool) -> None:
        self.store = store
        self.as_admitted = as_admitted
        self.resource = f"bench:w{n}"
        self.token = hashlib.sha256(secrets.token_bytes(16)).hexdigest()
        self.serial = 0

    async def lease(self) -> None:
        granted = await self.store.acquire(self.resource, "bench", 3600, self.token)
        if not isinstance(granted, tuple):
            raise RuntimeError(f"could not lease {self.resource}: {granted}")

    async def write(self) -> None:
        self.serial += 1
        key = f"{self.resource}-{self.serial}-{secrets.token_hex(4)}"
        new = NewEffect(
            route="bench",
            resource=self.resource,
            idempotency_key=key,
            fingerprint=f"fp-{key}",
            method="POST",
            path=f"/sink/{self.resource}",
            max_in_flight=1,
            upstream_timeout_s=5.0,
            retain_s=86400.0,
        )
        admitted = await self.store.admit(self.token, new)
        if not isinstance(admitted, Admitted):
            raise RuntimeError(f"admission refused: {admitted}")
        await self.store.finish_effect(
            admitted.effect.id,
            Event.ANSWERED_COMMITTED,
            201,
            "upstream answered 201",
            RESPONSE,
            admitted=admitted.effect if self.as_admitted else None,
        )

    async def run(self, until: float, latencies: list[float]) -> None:
        while (started := time.perf_counter()) < until:
            await self.write()
            latencies.append((time.perf_counter() - started) * 1000)


async def turn(workers: list[Worker], seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(w.run(wall + seconds, latencies) for w in workers))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    latencies.sort()
    return {
        "writes_per_s": len(latencies) / wall,
        "p50_ms": latencies[len(latencies) // 2],
        "p99_ms": latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)],
        "cpu_ms_per_write": cpu * 1000 / max(len(latencies), 1),
    }


async def run(args: argparse.Namespace, folder: Path) -> dict[str, list[dict[str, float]]]:
    # Each contender: its connector, and whether it records receipts as admitted.
    classes: dict[str, tuple[ConnectorClass, bool]] = {"this checkout": (SQLiteConnector, True)}
    if args.steps:
        classes["this checkout, receipts step by step"] = (SQLiteConnector, False)
    if args.against is not None:
        classes[str(args.against)] = (connector_class(args.against), False)
    stores: dict[str, Store] = {}
    workers: dict[str, list[Worker]] = {}
    for i, (name, (cls, as_admitted)) in enumerate(classes.items()):
        store = Store(cls(f"sqlite:///{folder / f'store{i}.db'}", time.time), "bench")
        if hasattr(store.connector, "change_schema"):
            await store.open()
        else:  # a checkout from before store/schema.py: its connector migrates as it opens
            await store.connector.open()
        stores[name] = store
        workers[name] = [Worker(store, n, as_admitted) for n in range(args.concurrency)]
        for worker in workers[name]:
            await worker.lease()
            await worker.write()  # warm: the first write of each opens its pages
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in classes}
    try:
        for number in range(args.turns):
            for name in classes:
                measured = await turn(workers[name], args.seconds)
                figures[name].append(measured)
                print(
                    f"turn {number + 1} {name}: {measured['writes_per_s']:.0f} writes/s, "
                    f"p50 {measured['p50_ms']:.1f} ms, p99 {measured['p99_ms']:.1f} ms, "
                    f"CPU {measured['cpu_ms_per_write']:.2f} ms/write",
                    file=sys.stderr,
                )
    finally:
        for store in stores.values():
            await store.close()
    return figures


def medians(turns: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(t[key] for t in turns) for key in turns[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per turn")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--against", type=Path, help="another checkout's store/sqlite.py")
    parser.add_argument(
        "--steps", action="store_true", help="also this connector, receipts step by step"
    )
    parser.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fenceproxy-store-writes-") as folder:
        figures = asyncio.run(run(args, Path(folder)))
    summary: dict[str, Any] = {name: medians(turns) for name, turns in figures.items()}
    if args.json:
        print(json.dumps({"turns": figures, "medians": summary}, indent=2))
    for name, median in summary.items():
        print(
            f"{name}: median {median['writes_per_s']:.0f} writes/s, p50 {median['p50_ms']:.1f} ms,"
            f" p99 {median['p99_ms']:.1f} ms, CPU {median['cpu_ms_per_write']:.2f} ms/write",
            file=sys.stderr if args.json else sys.stdout,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
