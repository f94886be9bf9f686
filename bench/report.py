"""What the benchmark prints: the SQLite table (fenced against plain), the
PostgreSQL comparison (one replica against two) with where the CPU went and
what bounds the throughput, and the same figures as JSON.
"""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from bench.cpu import LOAD_GENERATOR, CpuUsage
from bench.round_trips import MAX_ROUND_TRIPS, REQUESTS, RoundTrips
from bench.targets import FENCED, PLAIN
from bench.workload import Measurement

# The goal for two replicas on one database: this many times one replica.
SCALE_OUT_GOAL = 1.5
# The process groups whose CPU the PostgreSQL run accounts.
FENCEPROXY_GROUP = "fenceproxy {name}"
UPSTREAM_GROUP = "demo upstream"
PG_DB_GROUP = "postgres: the bench database's backends"
PG_ALL_GROUP = "postgres: every server process"
OTHERS = "everything else on the machine"


def header_lines(warmup_s: float, duration_s: float, durability: str) -> list[str]:
    return [
        f"nproc: {len(os.sched_getaffinity(0))}   python {platform.python_version()}   "
        f"aiohttp {aiohttp.__version__}",
        f"fenceproxy SQLite store: {durability}",
        f"per round: {warmup_s:g} s warm-up, then {duration_s:g} s measured",
    ]


def ratios(measurements: list[Measurement]) -> dict[int, float]:
    """fenced/plain req/s for each concurrency that has both figures: the median of the
    rounds' ratios, each round's plain and fenced measured one after the other."""
    by_key = {(m.target, m.concurrency, m.round): m for m in measurements}
    per_round: dict[int, list[float]] = {}
    for (target, concurrency, round_), plain in by_key.items():
        fenced = by_key.get((FENCED, concurrency, round_))
        if target == PLAIN and fenced is not None and plain.req_per_s > 0:
            per_round.setdefault(concurrency, []).append(fenced.req_per_s / plain.req_per_s)
    return {concurrency: statistics.median(found) for concurrency, found in per_round.items()}


def fenced_cpu(measurements: list[Measurement]) -> dict[int, float]:
    """fenceproxy's CPU ms per fenced request for each concurrency measured: the median
    of the rounds (steadier than req/s on a loaded machine)."""
    per_round: dict[int, list[float]] = {}
    for m in measurements:
        cost = cpu_ms_per_request(m).get("fenceproxy") if m.target == FENCED else None
        if cost is not None:
            per_round.setdefault(m.concurrency, []).append(cost)
    return {concurrency: statistics.median(found) for concurrency, found in per_round.items()}


def median_round(
    measurements: list[Measurement], target: str, concurrency: int | None = None
) -> Measurement | None:
    """Of `target`'s rounds (at `concurrency`, else at its first), the one whose req/s is
    the median (the lower of the middle two for an even count)."""
    found = [m for m in measurements if m.target == target]
    if concurrency is None and found:
        concurrency = found[0].concurrency
    found = sorted((m for m in found if m.concurrency == concurrency), key=lambda m: m.req_per_s)
    return found[(len(found) - 1) // 2] if found else None


def format_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report_table(measurements: list[Measurement]) -> list[str]:
    lines = [
        f"{'target':<16} {'round':>5} {'concurrency':>11} {'requests':>9} {'req/s':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
    ]
    for m in measurements:
        lines.append(
            f"{m.target:<16} {m.round:>5} {m.concurrency:>11} {m.requests:>9} {m.req_per_s:>9.1f} "
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
        f"fenced/plain req/s at concurrency {concurrency}: {ratio:.2f} (median of the rounds)"
        for concurrency, ratio in ratios(measurements).items()
    )
    lines.extend(
        f"fenceproxy CPU ms per fenced request at concurrency {concurrency}: {cost:.2f}"
        " (median of the rounds)"
        for concurrency, cost in fenced_cpu(measurements).items()
    )
    return lines + added_latency_line(measurements)


@dataclass(frozen=True)
class PostgresRun:
    """One replica against two, on one fresh PostgreSQL database."""

    concurrency: int
    pool_max: int
    rounds: list[Measurement]  # one replica, then two
    round_trips: RoundTrips | None = None
    statement_cache: bool = True

    @property
    def two_over_one(self) -> float | None:
        one, two = self.rounds
        return two.req_per_s / one.req_per_s if one.req_per_s > 0 else None


def unaccounted_percent(cpu: CpuUsage) -> float:
    """Busy CPU that none of the benchmark's processes used (other work on the machine,
    the kernel's own), in % of one core."""
    accounted = sum(v for k, v in cpu.percent.items() if k != PG_DB_GROUP)  # a subset of all
    return max(0.0, cpu.machine_busy_percent * cpu.cores - accounted)


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


def pg_fenced_cpu(run: PostgresRun) -> dict[str, float]:
    """CPU ms per fenced request with one replica: fenceproxy's, PostgreSQL's (the
    backends serving the bench database: on a server that other work shares, every
    server process counts that work too) and every server process's."""
    one = run.rounds[0]
    if one.cpu is None or one.req_per_s <= 0:
        return {}
    cost = cpu_ms_per_request(one)
    return {
        "fenceproxy": cost["fenceproxy"],
        "PostgreSQL": 10 * one.cpu.percent.get(PG_DB_GROUP, 0.0) / one.req_per_s,
        "every PostgreSQL process": cost["PostgreSQL"],
    }


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
        f"store_pool max_size {run.pool_max} per replica"
        f"{'' if run.statement_cache else ', statement cache off'}",
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
    same = median_round(sqlite, FENCED, run.concurrency)
    if same is not None:
        lines.append(
            f"fenced req/s at concurrency {run.concurrency}: SQLite (one process, median "
            f"round) {same.req_per_s:.1f}; PostgreSQL one replica {run.rounds[0].req_per_s:.1f}, "
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
    fenced_cost = pg_fenced_cpu(run)
    if fenced_cost:
        lines.append(
            f"CPU ms per fenced request, one replica: fenceproxy {fenced_cost['fenceproxy']:.2f}, "
            f"PostgreSQL {fenced_cost['PostgreSQL']:.2f} (the bench database's backends; every "
            f"server process {fenced_cost['every PostgreSQL process']:.2f})"
        )
    trips = run.round_trips
    if trips is not None:
        lines += [
            "",
            f"round trips to PostgreSQL per request (counted by the connector, {REQUESTS} "
            f"sequential requests each): fenced write {trips.fenced:.2f}, "
            f"replay {trips.replay:.2f}, stale-token refusal {trips.refusal:.2f}",
        ]
    return [*lines, "", *bound_verdict(run)]


# The extra rounds' targets (bench/run.py EXTRA_ROUNDS).
PLAIN_20MS = "plain+20ms"
FENCED_20MS = "fenced+20ms"
REPLAYS = "replays"
REFUSALS = "refusals"
PRELOADED = "fenced+preloaded"
# The latency round (bench/run.py LATENCY_ROUND): one worker, the 20 ms upstream asked
# directly, through the plain proxy and through fenceproxy in turn.
DIRECT_C1 = "direct+20ms c=1"
PLAIN_C1 = "plain+20ms c=1"
FENCED_C1 = "fenced+20ms c=1"
PRELOADED_GOAL = 0.9
P50_EXTRA_MS = 3.0
P99_EXTRA_MS = 10.0
# What a fenced write may add at the median to a request the upstream answers in
# 20 ms, over that same request sent to the upstream directly: the latency a client
# feels, without the upstream's own timer or the load generator's share in it.
P50_ADDED_MS = 1.5

# The performance targets this benchmark measures.
FENCED_OVER_PLAIN_GOAL = 0.5
SQLITE_PROXY_CPU_GOAL_MS = 0.75
PG_OVER_SQLITE_GOAL = 0.6
# CPU ms per fenced write on PostgreSQL, one replica: the proxy's and the database's.
PG_PROXY_CPU_GOAL_MS = 1.0
PG_DATABASE_CPU_GOAL_MS = 0.7
TARGET_CONCURRENCIES = (16, 64)


def added_latency(measurements: list[Measurement]) -> dict[str, float] | None:
    """The p50 latency each proxy adds, in the latency round, to the same request sent
    to the upstream directly, ms: fenceproxy (`fenced`), the plain proxy (`plain`), and
    the one less the other (`over_plain`, what fencing adds to forwarding); `direct` is
    the upstream's own p50. None without the three figures."""
    named = {m.target: m.p50_ms for m in measurements}
    direct, plain, fenced = named.get(DIRECT_C1), named.get(PLAIN_C1), named.get(FENCED_C1)
    if direct is None or plain is None or fenced is None:
        return None
    return {
        "direct": direct,
        "fenced": fenced - direct,
        "plain": plain - direct,
        "over_plain": fenced - plain,
    }


def added_latency_line(measurements: list[Measurement]) -> list[str]:
    added = added_latency(measurements)
    if added is None:
        return []
    return [
        f"p50 latency added at concurrency 1 to the upstream's own p50 "
        f"({added['direct']:.2f} ms, asked directly in turn): fenceproxy "
        f"{added['fenced']:.2f} ms, plain proxy {added['plain']:.2f} ms; fenced - plain "
        f"{added['over_plain']:.2f} ms"
    ]


def _status(met: bool) -> str:
    return "met" if met else "NOT met"


def targets(
    measurements: list[Measurement], postgres: PostgresRun | None
) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each target this run measured."""
    found = []
    by_concurrency = ratios(measurements)
    for concurrency in TARGET_CONCURRENCIES:
        if concurrency in by_concurrency:
            ratio = by_concurrency[concurrency]
            found.append(
                (
                    f"SQLite fenced/plain >= {FENCED_OVER_PLAIN_GOAL} at concurrency {concurrency}",
                    f"{ratio:.2f}",
                    ratio >= FENCED_OVER_PLAIN_GOAL,
                )
            )
    by_concurrency_cpu = fenced_cpu(measurements)
    for concurrency in TARGET_CONCURRENCIES:
        if concurrency in by_concurrency_cpu:
            cost = by_concurrency_cpu[concurrency]
            found.append(
                (
                    f"SQLite fenceproxy CPU ms per fenced request <= {SQLITE_PROXY_CPU_GOAL_MS:g}"
                    f" at concurrency {concurrency}",
                    f"{cost:.2f}",
                    cost <= SQLITE_PROXY_CPU_GOAL_MS,
                )
            )
    named = {m.target: m for m in measurements}
    plain_20, fenced_20 = named.get(PLAIN_20MS), named.get(FENCED_20MS)
    if plain_20 is not None and fenced_20 is not None:
        for label, fenced_ms, plain_ms, most in (
            ("p50", fenced_20.p50_ms, plain_20.p50_ms, P50_EXTRA_MS),
            ("p99", fenced_20.p99_ms, plain_20.p99_ms, P99_EXTRA_MS),
        ):
            if fenced_ms is not None and plain_ms is not None:
                extra = fenced_ms - plain_ms
                found.append(
                    (
                        f"20 ms upstream, c={fenced_20.concurrency}: fenced {label} - plain "
                        f"<= {most:g} ms",
                        f"{extra:.1f}",
                        extra <= most,
                    )
                )
    added = added_latency(measurements)
    if added is not None:
        found.append(
            (
                f"20 ms upstream, c=1: fenced p50 - direct p50 <= {P50_ADDED_MS:g} ms",
                f"{added['fenced']:.2f}",
                added["fenced"] <= P50_ADDED_MS,
            )
        )
    preloaded = named.get(PRELOADED)
    empty = (
        median_round(measurements, FENCED, preloaded.concurrency) if preloaded is not None else None
    )
    if preloaded is not None and empty is not None and empty.req_per_s > 0:
        ratio = preloaded.req_per_s / empty.req_per_s
        found.append(
            (
                f"SQLite fenced, preloaded / empty >= {PRELOADED_GOAL} (c={empty.concurrency})",
                f"{ratio:.2f}",
                ratio >= PRELOADED_GOAL,
            )
        )
    for name in (REPLAYS, REFUSALS):
        found_round = named.get(name)
        plain = median_round(measurements, PLAIN, found_round.concurrency if found_round else None)
        if found_round is not None and plain is not None and plain.req_per_s > 0:
            ratio = found_round.req_per_s / plain.req_per_s
            found.append(
                (
                    f"{name} / plain req/s >= 1 (plain at c={plain.concurrency})",
                    f"{ratio:.2f}",
                    ratio >= 1,
                )
            )
    if postgres is not None and postgres.round_trips is not None:
        trips = postgres.round_trips.fenced
        found.append(
            (
                f"PostgreSQL round trips per fenced request <= {MAX_ROUND_TRIPS}",
                f"{trips:.2f}",
                postgres.round_trips.met,
            )
        )
    if postgres is not None:
        same = median_round(measurements, FENCED, postgres.concurrency) or median_round(
            measurements, FENCED
        )
        if same is not None and same.req_per_s > 0:
            ratio = postgres.rounds[0].req_per_s / same.req_per_s
            found.append(
                (
                    f"PostgreSQL one replica >= {PG_OVER_SQLITE_GOAL}x SQLite fenced "
                    f"(concurrency {same.concurrency})",
                    f"{ratio:.2f}",
                    ratio >= PG_OVER_SQLITE_GOAL,
                )
            )
    fenced_cost = pg_fenced_cpu(postgres) if postgres is not None else {}
    for name, goal in (
        ("fenceproxy", PG_PROXY_CPU_GOAL_MS),
        ("PostgreSQL", PG_DATABASE_CPU_GOAL_MS),
    ):
        if name in fenced_cost:
            found.append(
                (
                    f"PostgreSQL store: {name} CPU ms per fenced request <= {goal:g}",
                    f"{fenced_cost[name]:.2f}",
                    fenced_cost[name] <= goal,
                )
            )
    return found


def target_lines(measurements: list[Measurement], postgres: PostgresRun | None) -> list[str]:
    lines = ["targets:"]
    for target, measured, met in targets(measurements, postgres):
        lines.append(f"  {target:<72} {measured:>6}  {_status(met)}")
    return lines


def json_figures(
    warmup_s: float,
    duration_s: float,
    durability: str,
    measurements: list[Measurement],
    postgres: PostgresRun | None,
) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "nproc": len(os.sched_getaffinity(0)),
        "fenceproxy_sqlite": durability,
        "warmup_s": warmup_s,
        "duration_s": duration_s,
        "results": [asdict(m) for m in measurements],
        "fenced_over_plain": {str(c): ratio for c, ratio in ratios(measurements).items()},
        "fenced_cpu_ms_per_request": {str(c): cost for c, cost in fenced_cpu(measurements).items()},
        "p50_added_ms_at_20ms_upstream": added_latency(measurements),
    }
    if postgres is not None:
        figures["postgresql"] = {
            "concurrency": postgres.concurrency,
            "store_pool_max_size": postgres.pool_max,
            "statement_cache": postgres.statement_cache,
            "results": [asdict(m) for m in postgres.rounds],
            "two_over_one": postgres.two_over_one,
            "cpu_ms_per_fenced_request": pg_fenced_cpu(postgres),
            "bound": bound_verdict(postgres),
            "round_trips_per_request": (
                None if postgres.round_trips is None else asdict(postgres.round_trips)
            ),
        }
    figures["targets"] = [
        {"target": target, "measured": float(measured), "met": met}
        for target, measured, met in targets(measurements, postgres)
    ]
    return figures
