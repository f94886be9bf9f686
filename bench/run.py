"""Benchmark: what fencing costs, as fenceproxy against a plain pass-through proxy,
and what a second fenceproxy replica on one PostgreSQL database adds.

    python -m bench.run [--duration S] [--warmup S] [--concurrency 16,64]
                        [--targets plain,fenced] [--sqlite-synchronous FULL]
                        [--backends sqlite,postgresql] [--postgres-url ADMIN_URL]
                        [--pg-concurrency 64] [--pg-pool 10] [--json]

SQLite (`--backends sqlite`): starts, each as its own process on a free port,
the demo upstream, the plain proxy (bench/plain_proxy.py) and fenceproxy with a
generated config. For each concurrency C and each target, C workers each POST a
small JSON body to /sink/w{i} in a loop; through fenceproxy, a worker first
takes a lease on bench:w{i} and sends its Fence-Token and a fresh
Idempotency-Key with every request, so each request is admitted, recorded and
forwarded as a fenced effect. The upstream's sink does no I/O, so the figures
are the proxies'.

PostgreSQL (`--backends postgresql`): creates a fresh database on the server
that ADMIN_URL names (default $FENCEPROXY_TEST_POSTGRES_URL, else
postgresql://postgres@127.0.0.1:5432/postgres), starts two fenceproxy replicas
on it and measures the same fenced workload at --pg-concurrency, once with
every worker on one replica and once with the workers split between the two
(worker i talks to replica i mod 2; no load balancer). It prints both rounds,
the ratio two/one, and where the CPU went in each measured window (each
process's utime+stime from /proc, the database's server processes, the load
generator's own, the whole machine's), then drops the database.

Only 2xx answers count as requests; anything else is an error. Requests are
counted when they complete inside the measured window, after a warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sqlite3
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.cpu import LOAD_GENERATOR, CpuSnapshot, CpuUsage, pids_named, usage
from bench.postgres import DatabaseUnavailable, backend_pids, create_database, drop_database
from demo.procs import ManagedProcess, ProcessFailed, free_port

PLAIN = "plain"
FENCED = "fenced"
TARGETS = (PLAIN, FENCED)
SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")
SQLITE = "sqlite"
POSTGRESQL = "postgresql"
BACKENDS = (SQLITE, POSTGRESQL)
POSTGRES_URL_ENV = "FENCEPROXY_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# The goal for two replicas on one database (issue 4): this many times one replica.
SCALE_OUT_GOAL = 1.5

LEASE_TTL_S = 300
# Workers never renew, so a round must end well before their leases expire.
LONGEST_ROUND_S = LEASE_TTL_S - 30
STARTUP_TIMEOUT_S = 30.0
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10, connect=2)
REQUEST_BODY = b'{"qty": 1}'


class BenchError(RuntimeError):
    """The benchmark cannot go on; the message says why."""


@dataclass
class WorkerTally:
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class Measurement:
    target: str
    concurrency: int
    duration_s: float
    requests: int
    req_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    errors: int
    error_kinds: dict[str, int]
    replicas: int = 1
    cpu: CpuUsage | None = None


Sampler = Callable[[], Awaitable[CpuSnapshot]]


def percentile_ms(sorted_latencies_s: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile in milliseconds; None without samples."""
    if not sorted_latencies_s:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_latencies_s)))
    return sorted_latencies_s[rank - 1] * 1000


async def describe_refusal(response: aiohttp.ClientResponse) -> str:
    """`409 effect_in_flight` for a problem+json answer, else just the status."""
    try:
        problem = await response.json(content_type=None)
    except ValueError:
        return str(response.status)
    code = problem.get("code") if isinstance(problem, dict) else None
    return f"{response.status} {code}" if code else str(response.status)


async def acquire_lease(session: aiohttp.ClientSession, base_url: str, worker: int) -> str:
    async with session.post(
        f"{base_url}/_fence/v1/leases",
        json={"resource": f"bench:w{worker}", "holder": f"bench-w{worker}", "ttl_s": LEASE_TTL_S},
    ) as response:
        if response.status != 201:
            raise BenchError(f"lease for worker {worker}: {await describe_refusal(response)}")
        token: str = (await response.json())["token"]
        return token


async def release_lease(session: aiohttp.ClientSession, base_url: str, token: str) -> None:
    async with session.post(
        f"{base_url}/_fence/v1/leases/release", headers={"Fence-Token": token}
    ) as response:
        # The next round takes the same resources; a lease left behind would refuse it.
        if not 200 <= response.status < 300:
            raise BenchError(f"lease release: {await describe_refusal(response)}")


async def run_worker(
    session: aiohttp.ClientSession,
    url: str,
    fence_token: str | None,
    measure_from: float,
    measure_until: float,
    tally: WorkerTally,
) -> None:
    loop = asyncio.get_running_loop()
    headers = {"Content-Type": "application/json"}
    if fence_token is not None:
        headers["Fence-Token"] = fence_token
    while loop.time() < measure_until:
        if fence_token is not None:
            headers["Idempotency-Key"] = uuid.uuid4().hex
        started = loop.time()
        error: str | None
        try:
            async with session.post(url, data=REQUEST_BODY, headers=headers) as response:
                if 200 <= response.status < 300:
                    await response.read()
                    error = None
                else:
                    error = await describe_refusal(response)
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = type(exc).__name__
        finished = loop.time()
        if measure_from <= finished <= measure_until:
            if error is None:
                tally.latencies_s.append(finished - started)
            else:
                tally.errors[error] += 1


async def measure(
    target: str,
    base_urls: str | list[str],
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    sampler: Sampler | None = None,
) -> Measurement:
    """Worker i talks to base_urls[i mod len]; with a `sampler`, CPU is accounted over
    the measured window."""
    urls = [base_urls] if isinstance(base_urls, str) else base_urls
    worker_urls = [urls[worker % len(urls)] for worker in range(concurrency)]
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=REQUEST_TIMEOUT) as session:
        tokens: list[str | None] = [None] * concurrency
        if target != PLAIN:
            tokens = list(
                await asyncio.gather(
                    *(
                        acquire_lease(session, worker_urls[worker], worker)
                        for worker in range(concurrency)
                    )
                )
            )
        loop = asyncio.get_running_loop()
        measure_from = loop.time() + warmup_s
        measure_until = measure_from + duration_s
        tallies = [WorkerTally() for _ in range(concurrency)]

        async def account_window() -> CpuUsage | None:
            if sampler is None:
                return None
            await asyncio.sleep(max(0.0, measure_from - loop.time()))
            before = await sampler()
            await asyncio.sleep(max(0.0, measure_until - loop.time()))
            return usage(before, await sampler())

        cpu, *_ = await asyncio.gather(
            account_window(),
            *(
                run_worker(
                    session,
                    f"{worker_urls[worker]}/sink/w{worker}",
                    token,
                    measure_from,
                    measure_until,
                    tally,
                )
                for worker, (token, tally) in enumerate(zip(tokens, tallies, strict=True))
            ),
        )
        for worker, token in enumerate(tokens):
            if token is not None:
                await release_lease(session, worker_urls[worker], token)

    latencies = sorted(latency for tally in tallies for latency in tally.latencies_s)
    error_kinds: Counter[str] = sum((tally.errors for tally in tallies), Counter())
    return Measurement(
        target=target,
        concurrency=concurrency,
        duration_s=duration_s,
        requests=len(latencies),
        req_per_s=len(latencies) / duration_s,
        p50_ms=percentile_ms(latencies, 0.50),
        p99_ms=percentile_ms(latencies, 0.99),
        errors=sum(error_kinds.values()),
        error_kinds=dict(error_kinds),
        replicas=len(urls),
        cpu=cpu,
    )


def fenceproxy_config(
    port: int, upstream_url: str, store_url: str, pool_max: int | None = None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "version": 1,
        "listen": {"host": "127.0.0.1", "port": port},
        "store": store_url,
        "leases": {"min_ttl_s": 1, "max_ttl_s": LEASE_TTL_S, "default_ttl_s": 30},
        "upstreams": {"demo": {"url": upstream_url, "timeout_s": 5, "connect_timeout_s": 1}},
        "routes": [
            {
                "name": "sink",
                "upstream": "demo",
                "match": {"methods": ["POST"], "path": "/sink/{key}"},
                "resource": "bench:{key}",
                "fence": "required",
                # Each worker has a resource of its own and sends one request at a time.
                "max_in_flight": 1,
                "idempotency": {"required": True, "retain_s": 3600},
            }
        ],
    }
    if pool_max is not None:
        config["store_pool"] = {"min_size": 1, "max_size": pool_max}
    return config


@dataclass
class RunningTargets:
    base_urls: dict[str, str]
    processes: list[ManagedProcess]
    fenceproxy_db: Path | None


def start_process(
    processes: ExitStack, workdir: Path, name: str, module_and_args: list[str], health_url: str
) -> ManagedProcess:
    """`python -m MODULE ARGS`, stopped when `processes` closes; returns once healthy."""
    argv = [sys.executable, "-m", *module_and_args]
    process = processes.enter_context(ManagedProcess(name, argv, log_path=workdir / f"{name}.log"))
    process.wait_http_ok(health_url, STARTUP_TIMEOUT_S)
    return process


def start_upstream(processes: ExitStack, workdir: Path) -> tuple[str, ManagedProcess]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_process(
        processes,
        workdir,
        "demo-upstream",
        [
            "demo.upstream",
            "--port",
            str(port),
            "--db",
            str(workdir / "upstream.db"),
            "--no-access-log",
        ],
        f"{url}/_demo/healthz",
    )
    return url, process


def start_fenceproxy(
    processes: ExitStack,
    workdir: Path,
    name: str,
    upstream_url: str,
    store_url: str,
    pool_max: int | None = None,
) -> tuple[str, ManagedProcess]:
    port = free_port()
    config_path = workdir / f"{name}.yaml"
    config = fenceproxy_config(port, upstream_url, store_url, pool_max)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    url = f"http://127.0.0.1:{port}"
    process = start_process(
        processes,
        workdir,
        name,
        ["proxy.cli", "serve", "--config", str(config_path)],
        f"{url}/_fence/healthz",
    )
    return url, process


def start_targets(
    processes: ExitStack, workdir: Path, targets: list[str], synchronous: str
) -> RunningTargets:
    """Start the upstream and the chosen proxies; each is stopped when `processes` closes."""
    upstream_url, upstream = start_upstream(processes, workdir)
    started = [upstream]
    base_urls: dict[str, str] = {}
    if PLAIN in targets:
        port = free_port()
        base_urls[PLAIN] = f"http://127.0.0.1:{port}"
        started.append(
            start_process(
                processes,
                workdir,
                "plain-proxy",
                ["bench.plain_proxy", "--port", str(port), "--upstream", upstream_url],
                f"{base_urls[PLAIN]}/_demo/healthz",
            )
        )
    fenceproxy_db = None
    if FENCED in targets:
        fenceproxy_db = workdir / "bench.db"
        base_urls[FENCED], fenceproxy = start_fenceproxy(
            processes,
            workdir,
            "fenceproxy",
            upstream_url,
            f"sqlite:///{fenceproxy_db}?synchronous={synchronous}",
        )
        started.append(fenceproxy)
    return RunningTargets(base_urls, started, fenceproxy_db)


def store_durability(running: RunningTargets, synchronous: str) -> str:
    """fenceproxy's SQLite durability: the journal mode as the file records it, and the
    synchronous level the benchmark set in the store URL (a per-connection setting)."""
    if running.fenceproxy_db is None:
        return "n/a (fenceproxy not measured)"
    try:
        with closing(sqlite3.connect(f"file:{running.fenceproxy_db}?mode=ro", uri=True)) as db:
            journal_mode: str = db.execute("PRAGMA journal_mode").fetchone()[0]
    except sqlite3.Error as exc:
        journal_mode = f"unknown ({exc})"
    return f"journal_mode={journal_mode}, synchronous={synchronous}"


def header_lines(args: argparse.Namespace, durability: str) -> list[str]:
    return [
        f"nproc: {len(os.sched_getaffinity(0))}   python {platform.python_version()}   "
        f"aiohttp {aiohttp.__version__}",
        f"fenceproxy SQLite store: {durability}",
        f"per round: {args.warmup:g} s warm-up, then {args.duration:g} s measured",
    ]


def ratios(measurements: list[Measurement]) -> dict[int, float]:
    """fenced/plain req/s for each concurrency that has both figures."""
    by_key = {(m.target, m.concurrency): m for m in measurements}
    return {
        concurrency: by_key[(FENCED, concurrency)].req_per_s / plain.req_per_s
        for (target, concurrency), plain in by_key.items()
        if target == PLAIN and (FENCED, concurrency) in by_key and plain.req_per_s > 0
    }


def format_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report_table(measurements: list[Measurement]) -> list[str]:
    lines = [
        f"{'target':<8} {'concurrency':>11} {'requests':>9} {'req/s':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
    ]
    for m in measurements:
        lines.append(
            f"{m.target:<8} {m.concurrency:>11} {m.requests:>9} {m.req_per_s:>9.1f} "
            f"{format_ms(m.p50_ms):>8} {format_ms(m.p99_ms):>8} {m.errors:>7}"
        )
        lines.extend(f"{'':>10}{count} x {kind}" for kind, count in sorted(m.error_kinds.items()))
        if m.cpu is not None and m.req_per_s > 0:
            cost = ", ".join(
                f"{name} {10 * percent / m.req_per_s:.2f}"
                for name, percent in m.cpu.percent.items()
                if percent >= 5
            )
            busy = m.cpu.machine_busy_percent
            lines.append(f"{'':>10}CPU ms per request: {cost}; machine {busy:.0f}% busy")
    lines.extend(
        f"fenced/plain req/s at concurrency {concurrency}: {ratio:.2f}"
        for concurrency, ratio in ratios(measurements).items()
    )
    return lines


async def measure_all(args: argparse.Namespace, running: RunningTargets) -> list[Measurement]:
    async def sample() -> CpuSnapshot:
        return CpuSnapshot.take({process.name: [process.pid] for process in running.processes})

    measurements = []
    for concurrency in args.concurrency:
        for target in args.targets:
            print(f"measuring {target} at concurrency {concurrency} ...", file=sys.stderr)
            measurements.append(
                await measure(
                    target,
                    running.base_urls[target],
                    concurrency,
                    args.warmup,
                    args.duration,
                    sample,
                )
            )
            for process in running.processes:
                if not process.is_running():
                    raise process.failure(f"exited with status {process.returncode} mid-run")
    return measurements


@dataclass(frozen=True)
class PostgresRun:
    """One replica against two, on one fresh PostgreSQL database."""

    concurrency: int
    pool_max: int
    rounds: list[Measurement]  # one replica, then two
    verdict: list[str]

    @property
    def two_over_one(self) -> float | None:
        one, two = self.rounds
        return two.req_per_s / one.req_per_s if one.req_per_s > 0 else None


FENCEPROXY_GROUP = "fenceproxy {name}"
UPSTREAM_GROUP = "demo upstream"
PG_DB_GROUP = "postgres: the bench database's backends"
PG_ALL_GROUP = "postgres: every server process"
OTHERS = "everything else on the machine"


def unaccounted_percent(cpu: CpuUsage) -> float:
    """Busy CPU that none of the benchmark's processes used (other work on the machine,
    the kernel's own), in % of one core."""
    accounted = sum(v for k, v in cpu.percent.items() if k != PG_DB_GROUP)  # a subset of all
    return max(0.0, cpu.machine_busy_percent * cpu.cores - accounted)


def run_postgres(args: argparse.Namespace, workdir: Path) -> PostgresRun:
    """Create the database, start the upstream and two replicas, measure, drop it."""
    print(f"creating a PostgreSQL database via {args.postgres_url} ...", file=sys.stderr)
    store_url = asyncio.run(create_database(args.postgres_url))
    try:
        with ExitStack() as processes:
            upstream_url, upstream = start_upstream(processes, workdir)
            replicas = [
                start_fenceproxy(
                    processes, workdir, f"pg-r{n}", upstream_url, store_url, args.pg_pool
                )
                for n in (1, 2)
            ]
            rounds = asyncio.run(measure_postgres(args, store_url, upstream, replicas))
    finally:
        asyncio.run(drop_database(args.postgres_url, store_url))
    run = PostgresRun(args.pg_concurrency, args.pg_pool, rounds, [])
    return PostgresRun(run.concurrency, run.pool_max, rounds, bound_verdict(run))


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
            )
        )
        for process in (upstream, *(p for _, p in replicas)):
            if not process.is_running():
                raise process.failure(f"exited with status {process.returncode} mid-run")
    return rounds


def cpu_ms_per_request(measurement: Measurement) -> dict[str, float]:
    """CPU milliseconds each process group spent per request answered in the window."""
    cpu = measurement.cpu
    if cpu is None or measurement.req_per_s <= 0:
        return {}
    groups = {
        "fenceproxy": sum(v for k, v in cpu.percent.items() if k.startswith("fenceproxy")),
        "PostgreSQL": cpu.percent.get(PG_ALL_GROUP, 0.0),
        "the demo upstream": cpu.percent.get(UPSTREAM_GROUP, 0.0),
        "the load generator": cpu.percent.get(LOAD_GENERATOR, 0.0),
    }
    return {name: 10 * percent / measurement.req_per_s for name, percent in groups.items()}


def bound_verdict(run: PostgresRun) -> list[str]:
    """What bounds two replicas' throughput, from the CPU accounted in their window."""
    ratio = run.two_over_one
    two = run.rounds[1].cpu
    if ratio is None or two is None:
        return ["no verdict: a round measured nothing"]
    lines = [
        f"two replicas give {ratio:.2f}x one replica's throughput "
        f"(goal {SCALE_OUT_GOAL}x: {'met' if ratio >= SCALE_OUT_GOAL else 'not met'})."
    ]
    for measurement in run.rounds:
        cost = cpu_ms_per_request(measurement)
        total = sum(cost.values())
        if total <= 0:
            continue
        parts = ", ".join(f"{name} {ms:.2f}" for name, ms in cost.items())
        lines.append(
            f"{measurement.replicas} replica(s): CPU ms per request: {parts}; {total:.2f} in all, "
            f"so {two.cores} cores serve at most {two.cores * 1000 / total:.0f} req/s "
            f"(measured {measurement.req_per_s:.0f})."
        )
    database = two.percent.get(PG_ALL_GROUP, 0.0)
    if ratio >= SCALE_OUT_GOAL:
        pass
    elif two.machine_busy_percent >= 90:
        lines.append(
            f"Bound: CPU. With two replicas the {two.cores} cores were "
            f"{two.machine_busy_percent:.0f}% busy. The processes that serve a request (load "
            "generator, proxy, upstream, database) share the same cores, so a second replica "
            "adds no capacity: it splits the proxies' share, and the per-request cost above "
            "does not fall."
        )
    elif database >= 90:
        lines.append("Bound: the database (its server processes use about a core or more).")
    else:
        lines.append(
            f"Bound: not CPU (the cores were {two.machine_busy_percent:.0f}% busy) nor the "
            "database's CPU: waits (connection pool, row locks, round trips); try --pg-pool."
        )
    unaccounted = unaccounted_percent(two)
    if unaccounted >= 20:
        lines.append(
            f"Caution: {unaccounted:.0f}% of one core went to processes outside the benchmark; "
            "the figures are lower than on an idle machine."
        )
    return lines


def postgres_report(run: PostgresRun, sqlite: list[Measurement]) -> list[str]:
    lines = [
        f"PostgreSQL store: fenced at concurrency {run.concurrency}, one fresh database, "
        f"store_pool max_size {run.pool_max} per replica",
        f"{'replicas':<8} {'requests':>9} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}",
    ]
    for m in run.rounds:
        lines.append(
            f"{m.replicas:<8} {m.requests:>9} {m.req_per_s:>9.1f} "
            f"{format_ms(m.p50_ms):>8} {format_ms(m.p99_ms):>8} {m.errors:>7}"
        )
        lines.extend(f"{'':>10}{count} x {kind}" for kind, count in sorted(m.error_kinds.items()))
    ratio = run.two_over_one
    lines.append(f"two replicas / one replica req/s: {'-' if ratio is None else f'{ratio:.2f}'}")
    same = [m for m in sqlite if m.target == FENCED and m.concurrency == run.concurrency]
    if same:
        lines.append(
            f"fenced req/s at concurrency {run.concurrency}: SQLite (one process) "
            f"{same[0].req_per_s:.1f}; PostgreSQL one replica {run.rounds[0].req_per_s:.1f}, "
            f"two replicas {run.rounds[1].req_per_s:.1f}"
        )
    one_cpu, two_cpu = run.rounds[0].cpu, run.rounds[1].cpu
    if one_cpu is not None and two_cpu is not None:
        lines += ["", "CPU in each measured window, % of one core (utime+stime from /proc):"]
        lines.append(f"  {'process':<44} {'1 replica':>10} {'2 replicas':>10}")
        for name in two_cpu.percent:
            lines.append(
                f"  {name:<44} {one_cpu.percent.get(name, 0.0):>10.1f} "
                f"{two_cpu.percent[name]:>10.1f}"
            )
        lines.append(
            f"  {OTHERS:<44} {unaccounted_percent(one_cpu):>10.1f} "
            f"{unaccounted_percent(two_cpu):>10.1f}"
        )
        lines.append(
            f"  {f'machine busy, % of all {two_cpu.cores} cores':<44} "
            f"{one_cpu.machine_busy_percent:>10.1f} {two_cpu.machine_busy_percent:>10.1f}"
        )
    return [*lines, "", *run.verdict]


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
        "--json", action="store_true", help="print the figures as JSON on stdout (table on stderr)"
    )
    args = parser.parse_args(argv)
    if args.pg_concurrency < 2 or args.pg_pool < 1:
        parser.error("--pg-concurrency must be at least 2 and --pg-pool at least 1")
    if args.duration <= 0 or args.warmup < 0:
        parser.error("--duration must be positive and --warmup not negative")
    if args.duration + args.warmup > LONGEST_ROUND_S:
        parser.error(f"--duration plus --warmup must stay under {LONGEST_ROUND_S} s")
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
            if POSTGRESQL in args.backends:
                postgres = run_postgres(args, Path(workdir) / "postgresql")
        except (ProcessFailed, BenchError, DatabaseUnavailable) as failure:
            print(f"benchmark failed: {failure}", file=sys.stderr)
            return 1
    # With --json, stdout carries only the JSON so it can be redirected to a file.
    table_stream = sys.stderr if args.json else sys.stdout
    lines = header_lines(args, durability)
    if measurements:
        lines += ["", *report_table(measurements)]
    if postgres is not None:
        lines += ["", *postgres_report(postgres, measurements)]
    print("\n".join(lines), file=table_stream)
    if args.json:
        figures: dict[str, Any] = {
            "nproc": len(os.sched_getaffinity(0)),
            "fenceproxy_sqlite": durability,
            "warmup_s": args.warmup,
            "duration_s": args.duration,
            "results": [asdict(m) for m in measurements],
            "fenced_over_plain": {str(c): ratio for c, ratio in ratios(measurements).items()},
        }
        if postgres is not None:
            figures["postgresql"] = {
                "concurrency": postgres.concurrency,
                "store_pool_max_size": postgres.pool_max,
                "results": [asdict(m) for m in postgres.rounds],
                "two_over_one": postgres.two_over_one,
                "bound": postgres.verdict,
            }
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
