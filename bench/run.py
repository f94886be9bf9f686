"""Benchmark: what fencing costs, as fenceproxy against a plain pass-through proxy,
and what a second fenceproxy replica on one PostgreSQL database adds.

    python -m bench.run [--duration S] [--warmup S] [--concurrency 16,64] [--rounds 3]
                        [--targets plain,fenced] [--sqlite-synchronous FULL]
                        [--backends sqlite,postgresql] [--postgres-url ADMIN_URL]
                        [--pg-concurrency 64] [--pg-pool 10] [--no-pg-statement-cache]
                        [--no-extra-rounds] [--preload N] [--json]

SQLite (`--backends sqlite`): starts, each as its own process on a free port,
the demo upstream, the plain proxy (bench/plain_proxy.py) and fenceproxy with a
generated config. For each concurrency C and each target, C workers each POST a
small JSON body to /sink/w{i} in a loop; through fenceproxy, a worker first
takes a lease on bench:w{i} and sends its Fence-Token and a fresh
Idempotency-Key with every request, so each request is admitted, recorded and
forwarded as a fenced effect. The upstream's sink does no I/O, so the figures
are the proxies'. These throughput rounds run --rounds times (default 3), each
round plain then fenced at each concurrency; a fenced/plain ratio is the median
of the rounds' ratios, and a comparison with another round (PostgreSQL, the
preloaded store, replays) takes the round of median req/s.

PostgreSQL (`--backends postgresql`): creates a fresh database on the server
that ADMIN_URL names (default $FENCEPROXY_TEST_POSTGRES_URL, else
postgresql://postgres@127.0.0.1:5432/postgres), starts two fenceproxy replicas
on it and measures the same fenced workload at --pg-concurrency, once with
every worker on one replica and once with the workers split between the two
(worker i talks to replica i mod 2; no load balancer). It prints both rounds,
the ratio two/one, and where the CPU went in each measured window (each
process's utime+stime from /proc, the database's server processes, the load
generator's own, the whole machine's), then counts the round trips per request
that the proxy's connector sent to the database (bench/round_trips.py), and
drops the database.

With both targets, the latency round: one worker sends the same request, to an
upstream that takes 20 ms, to the upstream directly, through the plain proxy and
through fenceproxy in turn (--latency-duration seconds); the latency a proxy adds is
its p50 less the direct p50. Then four more rounds at concurrency 16: plain and
fenced with the 20 ms upstream, a round of replays (one key per worker) and one of
stale-token refusals (`--no-extra-rounds` skips all five). `--preload N`: the
first fenced round again on a SQLite store preloaded with N settled effects (not
measured on PostgreSQL).

Last, where each performance target stands (met / not met).

Only 2xx answers count as requests; anything else is an error. Requests are
counted when they complete inside the measured window, after a warm-up.

This module is the command line; bench/workload.py generates the load,
bench/targets.py starts the processes under test, bench/report.py prints the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from bench.cpu import CpuSnapshot, pids_named
from bench.postgres import DatabaseUnavailable, backend_pids, create_database, drop_database
from bench.report import (
    DIRECT_C1,
    FENCED_20MS,
    FENCED_C1,
    FENCEPROXY_GROUP,
    PG_ALL_GROUP,
    PG_DB_GROUP,
    PLAIN_20MS,
    PLAIN_C1,
    PRELOADED,
    REFUSALS,
    REPLAYS,
    UPSTREAM_GROUP,
    PostgresRun,
    header_lines,
    json_figures,
    postgres_report,
    report_table,
    target_lines,
)
from bench.retention import seed
from bench.round_trips import measure_round_trips
from bench.targets import (
    FENCED,
    PLAIN,
    TARGETS,
    RunningTargets,
    start_fenceproxy,
    start_targets,
    start_upstream,
    store_durability,
)
from bench.workload import (
    FRESH,
    LEASE_TTL_S,
    REPLAY,
    STALE,
    BenchError,
    LatencyTarget,
    Measurement,
    measure,
    measure_alternately,
)
from store import open_store
from support.processes import ManagedProcess, ProcessFailed

SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")
SQLITE = "sqlite"
POSTGRESQL = "postgresql"
BACKENDS = (SQLITE, POSTGRESQL)
POSTGRES_URL_ENV = "FENCEPROXY_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# The rounds besides throughput, at one concurrency: what a worker feels with an
# upstream that takes 20 ms (the demo upstream's delay header), and replays and stale
# refusals, which never go upstream. (target, through fenceproxy, kind, headers)
EXTRA_CONCURRENCY = 16
UPSTREAM_DELAY = {"Demo-Delay-Ms": "20"}
EXTRA_ROUNDS = (
    (PLAIN_20MS, False, FRESH, UPSTREAM_DELAY),
    (FENCED_20MS, True, FRESH, UPSTREAM_DELAY),
    (REPLAYS, True, REPLAY, None),
    (REFUSALS, True, STALE, None),
)
# Workers never renew, so a round must end well before their leases expire.
LONGEST_ROUND_S = LEASE_TTL_S - 30


async def measure_latency(args: argparse.Namespace, running: RunningTargets) -> list[Measurement]:
    """The latency round: at concurrency 1, the 20 ms upstream asked directly, through the
    plain proxy and through fenceproxy in turn, so that what each proxy adds is its p50
    less the direct one's, taken under the same load (the upstream's timer and the load
    generator's own time are in all three)."""
    print(
        f"measuring the added latency at concurrency 1 ({args.latency_duration:g} s) ...",
        file=sys.stderr,
    )
    return await measure_alternately(
        [
            LatencyTarget(DIRECT_C1, running.upstream_url, fenced=False),
            LatencyTarget(PLAIN_C1, running.base_urls[PLAIN], fenced=False),
            LatencyTarget(FENCED_C1, running.base_urls[FENCED], fenced=True),
        ],
        args.warmup,
        args.latency_duration,
        UPSTREAM_DELAY,
    )


async def measure_all(args: argparse.Namespace, running: RunningTargets) -> list[Measurement]:
    async def sample() -> CpuSnapshot:
        return CpuSnapshot.take({process.name: [process.pid] for process in running.processes})

    measurements = []
    # Round by round, each target right after the other: a ratio compares figures taken
    # under the same conditions, and the median round of several stands for them.
    for round_ in range(1, args.rounds + 1):
        for concurrency in args.concurrency:
            for target in args.targets:
                print(
                    f"measuring {target} at concurrency {concurrency}, "
                    f"round {round_} of {args.rounds} ...",
                    file=sys.stderr,
                )
                measured = await measure(
                    target,
                    running.base_urls[target],
                    concurrency,
                    args.warmup,
                    args.duration,
                    sample,
                    fenced=target == FENCED,
                )
                measurements.append(replace(measured, round=round_))
                for process in running.processes:
                    if not process.is_running():
                        raise process.failure(f"exited with status {process.returncode} mid-run")
    if args.extra_rounds and set(args.targets) == set(TARGETS):
        measurements += await measure_latency(args, running)
        for target, fenced, kind, headers in EXTRA_ROUNDS:
            base_url = running.base_urls[FENCED if fenced else PLAIN]
            print(f"measuring {target} at concurrency {EXTRA_CONCURRENCY} ...", file=sys.stderr)
            measurements.append(
                await measure(
                    target,
                    base_url,
                    EXTRA_CONCURRENCY,
                    args.warmup,
                    args.duration,
                    sample,
                    fenced=fenced,
                    kind=kind,
                    extra_headers=headers,
                )
            )
    return measurements


def measure_preloaded(args: argparse.Namespace, workdir: Path) -> Measurement:
    """The first fenced round again, on a SQLite store preloaded with --preload settled
    effects (bulk inserted: every 10th with an event and a live idempotency record,
    and as many rejections; bench/retention.py `seed`), through a fenceproxy of its own."""
    workdir.mkdir(parents=True, exist_ok=True)
    store_url = f"sqlite:///{workdir / 'preloaded.db'}?synchronous={args.sqlite_synchronous}"
    print(f"preloading {args.preload} settled effects ...", file=sys.stderr)
    asyncio.run(preload(store_url, args.preload))
    with ExitStack() as processes:
        upstream_url, _ = start_upstream(processes, workdir)
        url, process = start_fenceproxy(
            processes, workdir, "fenceproxy-preloaded", upstream_url, store_url
        )

        async def sample() -> CpuSnapshot:
            return CpuSnapshot.take({process.name: [process.pid]})

        concurrency = args.concurrency[0]
        print(f"measuring {PRELOADED} at concurrency {concurrency} ...", file=sys.stderr)
        return asyncio.run(
            measure(PRELOADED, url, concurrency, args.warmup, args.duration, sample, fenced=True)
        )


async def preload(store_url: str, effects: int) -> None:
    store = open_store(store_url, time.time, "bench-preload")
    await store.open()  # migrated
    try:
        now = await store.now()
    finally:
        await store.close()
    await seed(store_url, effects, now - 3600, "eff_seed_")


def run_postgres(args: argparse.Namespace, workdir: Path) -> PostgresRun:
    """Create the database, start the upstream and two replicas, measure, drop it."""
    print(f"creating a PostgreSQL database via {args.postgres_url} ...", file=sys.stderr)
    store_url = asyncio.run(create_database(args.postgres_url))
    try:
        with ExitStack() as processes:
            upstream_url, upstream = start_upstream(processes, workdir)
            replicas = [
                start_fenceproxy(
                    processes,
                    workdir,
                    f"pg-r{n}",
                    upstream_url,
                    store_url,
                    args.pg_pool,
                    args.pg_statement_cache,
                )
                for n in (1, 2)
            ]
            rounds = asyncio.run(measure_postgres(args, store_url, upstream, replicas))
            print("counting round trips per request on one replica ...", file=sys.stderr)
            trips = asyncio.run(measure_round_trips(replicas[0][0]))
    finally:
        asyncio.run(drop_database(args.postgres_url, store_url))
    return PostgresRun(args.pg_concurrency, args.pg_pool, rounds, trips, args.pg_statement_cache)


async def measure_postgres(
    args: argparse.Namespace,
    store_url: str,
    upstream: ManagedProcess,
    replicas: list[tuple[str, ManagedProcess]],
) -> list[Measurement]:
    async def sample() -> CpuSnapshot:
        groups = {
            FENCEPROXY_GROUP.format(name=process.name): [process.pid] for _, process in replicas
        }
        groups[UPSTREAM_GROUP] = [upstream.pid]
        groups[PG_DB_GROUP] = await backend_pids(args.postgres_url, store_url)
        groups[PG_ALL_GROUP] = pids_named("postgres")
        return CpuSnapshot.take(groups)

    rounds = []
    for used in (replicas[:1], replicas):
        print(
            f"measuring fenced on PostgreSQL, {len(used)} replica(s), "
            f"concurrency {args.pg_concurrency} ...",
            file=sys.stderr,
        )
        rounds.append(
            await measure(
                f"pg x{len(used)}",
                [url for url, _ in used],
                args.pg_concurrency,
                args.warmup,
                args.duration,
                sample,
                fenced=True,
            )
        )
        for process in (upstream, *(p for _, p in replicas)):
            if not process.is_running():
                raise process.failure(f"exited with status {process.returncode} mid-run")
    return rounds


def concurrency_list(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError("every concurrency must be at least 1")
    return levels


def target_list(text: str) -> list[str]:
    targets = [part.strip() for part in text.split(",")]
    unknown = set(targets) - set(TARGETS)
    if unknown or not targets:
        raise argparse.ArgumentTypeError(f"targets are a comma-separated subset of {TARGETS}")
    return targets


def backend_list(text: str) -> list[str]:
    backends = [part.strip() for part in text.split(",")]
    if set(backends) - set(BACKENDS) or not backends:
        raise argparse.ArgumentTypeError(f"backends are a comma-separated subset of {BACKENDS}")
    return backends


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per round")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    parser.add_argument("--concurrency", type=concurrency_list, default=[16, 64])
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="how many times the throughput rounds run; the ratios are the median round's",
    )
    parser.add_argument("--targets", type=target_list, default=list(TARGETS))
    parser.add_argument(
        "--sqlite-synchronous",
        choices=SYNCHRONOUS_MODES,
        default="FULL",
        help="fenceproxy's SQLite synchronous setting (its store URL's ?synchronous=)",
    )
    parser.add_argument(
        "--backends",
        type=backend_list,
        default=list(BACKENDS),
        help="sqlite: plain vs fenced on SQLite; postgresql: one vs two replicas on one database",
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(POSTGRES_URL_ENV) or DEFAULT_POSTGRES_URL,
        help=f"admin URL of the server to create the benchmark's database on "
        f"(default ${POSTGRES_URL_ENV}, else {DEFAULT_POSTGRES_URL})",
    )
    parser.add_argument("--pg-concurrency", type=int, default=64, help="workers, PostgreSQL run")
    parser.add_argument(
        "--pg-pool", type=int, default=10, help="each replica's store_pool max_size (default 10)"
    )
    parser.add_argument(
        "--pg-statement-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the replicas' store_pool.statement_cache (--no-pg-statement-cache: what a "
        "pooler in transaction mode needs, one more round trip per statement)",
    )
    parser.add_argument(
        "--preload",
        type=int,
        default=0,
        help="also measure the first fenced round on a SQLite store preloaded with this "
        "many settled effects, as many rejections (e.g. 1000000: the bulk insert takes seconds)",
    )
    parser.add_argument(
        "--extra-rounds",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the latency round at concurrency 1, and the 20 ms-upstream, replay and "
        "stale-refusal rounds at concurrency 16 (with both targets only)",
    )
    parser.add_argument(
        "--latency-duration",
        type=float,
        default=20.0,
        help="measured seconds of the latency round (concurrency 1, three targets in turn, "
        "a third of the requests each)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the figures as JSON on stdout (table on stderr)"
    )
    args = parser.parse_args(argv)
    if args.pg_concurrency < 2 or args.pg_pool < 1:
        parser.error("--pg-concurrency must be at least 2 and --pg-pool at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.preload < 0:
        parser.error("--preload must not be negative")
    if args.duration <= 0 or args.warmup < 0:
        parser.error("--duration must be positive and --warmup not negative")
    if args.latency_duration <= 0:
        parser.error("--latency-duration must be positive")
    if max(args.duration, args.latency_duration) + args.warmup > LONGEST_ROUND_S:
        parser.error(
            f"--duration (and --latency-duration) plus --warmup must stay under {LONGEST_ROUND_S} s"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    durability = "n/a (SQLite not measured)"
    measurements: list[Measurement] = []
    postgres: PostgresRun | None = None
    with tempfile.TemporaryDirectory(prefix="fenceproxy-bench-") as workdir:
        try:
            if SQLITE in args.backends:
                with ExitStack() as processes:
                    running = start_targets(
                        processes, Path(workdir), args.targets, args.sqlite_synchronous
                    )
                    durability = store_durability(running, args.sqlite_synchronous)
                    measurements = asyncio.run(measure_all(args, running))
                if args.preload and FENCED in args.targets:
                    measurements.append(measure_preloaded(args, Path(workdir) / "preloaded"))
            if POSTGRESQL in args.backends:
                postgres = run_postgres(args, Path(workdir) / "postgresql")
        except (ProcessFailed, BenchError, DatabaseUnavailable) as failure:
            print(f"benchmark failed: {failure}", file=sys.stderr)
            return 1
    # With --json, stdout carries only the JSON so it can be redirected to a file.
    table_stream = sys.stderr if args.json else sys.stdout
    lines = header_lines(args.warmup, args.duration, durability)
    if measurements:
        lines += ["", *report_table(measurements)]
    if postgres is not None:
        lines += ["", *postgres_report(postgres, measurements)]
    lines += ["", *target_lines(measurements, postgres)]
    print("\n".join(lines), file=table_stream)
    if args.json:
        figures = json_figures(args.warmup, args.duration, durability, measurements, postgres)
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
