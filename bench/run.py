"""Benchmark: what fencing costs, as fenceproxy against a plain pass-through proxy.

    python -m bench.run [--duration S] [--warmup S] [--concurrency 16,64]
                        [--targets plain,fenced] [--sqlite-synchronous FULL] [--json]

Starts, each as its own process on a free port, the demo upstream, the plain
proxy (bench/plain_proxy.py) and fenceproxy with a generated config. For each
concurrency C and each target, C workers each POST a small JSON body to
/sink/w{i} in a loop; through fenceproxy, a worker first takes a lease on
bench:w{i} and sends its Fence-Token and a fresh Idempotency-Key with every
request, so each request is admitted, recorded and forwarded as a fenced
effect. The upstream's sink does no I/O, so the figures are the proxies'.

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
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from demo.procs import ManagedProcess, ProcessFailed, free_port

PLAIN = "plain"
FENCED = "fenced"
TARGETS = (PLAIN, FENCED)
SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")

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
    target: str, base_url: str, concurrency: int, warmup_s: float, duration_s: float
) -> Measurement:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=REQUEST_TIMEOUT) as session:
        tokens: list[str | None] = [None] * concurrency
        if target == FENCED:
            tokens = list(
                await asyncio.gather(
                    *(acquire_lease(session, base_url, worker) for worker in range(concurrency))
                )
            )
        loop = asyncio.get_running_loop()
        measure_from = loop.time() + warmup_s
        measure_until = measure_from + duration_s
        tallies = [WorkerTally() for _ in range(concurrency)]
        await asyncio.gather(
            *(
                run_worker(
                    session, f"{base_url}/sink/w{worker}", token, measure_from, measure_until, tally
                )
                for worker, (token, tally) in enumerate(zip(tokens, tallies, strict=True))
            )
        )
        for token in tokens:
            if token is not None:
                await release_lease(session, base_url, token)

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
    )


def fenceproxy_config(port: int, upstream_url: str, store_url: str) -> dict[str, Any]:
    return {
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


@dataclass
class RunningTargets:
    base_urls: dict[str, str]
    processes: list[ManagedProcess]
    fenceproxy_db: Path | None


def start_targets(
    processes: ExitStack, workdir: Path, targets: list[str], synchronous: str
) -> RunningTargets:
    """Start the upstream and the chosen proxies; each is stopped when `processes` closes."""
    started: list[ManagedProcess] = []

    def start(name: str, module_and_args: list[str], health_url: str) -> None:
        argv = [sys.executable, "-m", *module_and_args]
        process = processes.enter_context(
            ManagedProcess(name, argv, log_path=workdir / f"{name}.log")
        )
        started.append(process)
        process.wait_http_ok(health_url, STARTUP_TIMEOUT_S)

    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    start(
        "demo-upstream",
        [
            "demo.upstream",
            "--port",
            str(upstream_port),
            "--db",
            str(workdir / "upstream.db"),
            "--no-access-log",
        ],
        f"{upstream_url}/_demo/healthz",
    )
    base_urls: dict[str, str] = {}
    if PLAIN in targets:
        port = free_port()
        base_urls[PLAIN] = f"http://127.0.0.1:{port}"
        start(
            "plain-proxy",
            ["bench.plain_proxy", "--port", str(port), "--upstream", upstream_url],
            f"{base_urls[PLAIN]}/_demo/healthz",
        )
    fenceproxy_db = None
    if FENCED in targets:
        port = free_port()
        base_urls[FENCED] = f"http://127.0.0.1:{port}"
        fenceproxy_db = workdir / "bench.db"
        config_path = workdir / "fenceproxy.yaml"
        config = fenceproxy_config(
            port, upstream_url, f"sqlite:///{fenceproxy_db}?synchronous={synchronous}"
        )
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        start(
            "fenceproxy",
            ["proxy.cli", "serve", "--config", str(config_path)],
            f"{base_urls[FENCED]}/_fence/healthz",
        )
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
    lines.extend(
        f"fenced/plain req/s at concurrency {concurrency}: {ratio:.2f}"
        for concurrency, ratio in ratios(measurements).items()
    )
    return lines


async def measure_all(args: argparse.Namespace, running: RunningTargets) -> list[Measurement]:
    measurements = []
    for concurrency in args.concurrency:
        for target in args.targets:
            print(f"measuring {target} at concurrency {concurrency} ...", file=sys.stderr)
            measurements.append(
                await measure(
                    target, running.base_urls[target], concurrency, args.warmup, args.duration
                )
            )
            for process in running.processes:
                if not process.is_running():
                    raise process.failure(f"exited with status {process.returncode} mid-run")
    return measurements


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
        "--json", action="store_true", help="print the figures as JSON on stdout (table on stderr)"
    )
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.warmup < 0:
        parser.error("--duration must be positive and --warmup not negative")
    if args.duration + args.warmup > LONGEST_ROUND_S:
        parser.error(f"--duration plus --warmup must stay under {LONGEST_ROUND_S} s")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="fenceproxy-bench-") as workdir,
        ExitStack() as processes,
    ):
        try:
            running = start_targets(processes, Path(workdir), args.targets, args.sqlite_synchronous)
            durability = store_durability(running, args.sqlite_synchronous)
            measurements = asyncio.run(measure_all(args, running))
        except (ProcessFailed, BenchError) as failure:
            print(f"benchmark failed: {failure}", file=sys.stderr)
            return 1
    # With --json, stdout carries only the JSON so it can be redirected to a file.
    table_stream = sys.stderr if args.json else sys.stdout
    print(
        "\n".join([*header_lines(args, durability), "", *report_table(measurements)]),
        file=table_stream,
    )
    if args.json:
        figures = {
            "nproc": len(os.sched_getaffinity(0)),
            "fenceproxy_sqlite": durability,
            "warmup_s": args.warmup,
            "duration_s": args.duration,
            "results": [asdict(m) for m in measurements],
            "fenced_over_plain": {str(c): ratio for c, ratio in ratios(measurements).items()},
        }
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
