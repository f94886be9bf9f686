"""python -m tests.simulation --seed S --steps N --backend sqlite|postgres [--seeds K]

Runs seeds S, S+1, ... S+K-1 for N steps each (then a drain phase), checking the
invariants after every step. Violations whose cause is a known bug of today's code
(invariants.EXPECTED_TO_FAIL_BEFORE_FIX) are reported with a replay command and do
not fail the run unless --strict; any other violation stops the run, prints the
seed, the step, a replay command and the trace, and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from tests import pg
from tests.simulation.invariants import BUG_LETTERS, EXPECTED_TO_FAIL_BEFORE_FIX, Evidence
from tests.simulation.runner import RunConfig, RunResult, run


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.simulation",
        description="Seeded simulation of fenceproxy's effect lifecycle.",
    )
    parser.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    parser.add_argument("--steps", type=int, default=5000, help="steps per seed (default 5000)")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds (default 1)")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--evidence",
        choices=("truthful", "hostile", "both"),
        default="truthful",
        help="truthful: every answer, probe and operator tells the truth; hostile: some "
        "lie (untrue 4xx after a commit, disagreeing probes, wrong operators); both: each seed "
        "once of each",
    )
    parser.add_argument(
        "--strict", action="store_true", help="known bugs fail the run too (after the fixes)"
    )
    parser.add_argument(
        "--stop-on", metavar="CAUSE", help="stop at the first violation with this cause"
    )
    parser.add_argument(
        "--no-cancellations",
        action="store_true",
        help="no handler cancelled in the middle of a dispatch: a seed takes the steps it "
        "took before the simulation had them (the known bugs' seeds)",
    )
    parser.add_argument("--trace", type=int, default=40, help="trace lines shown on failure")
    parser.add_argument("--echo", action="store_true", help="print every step as it runs")
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs at once, each in a process of its own"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(pg.ENV),
        help=f"admin URL for --backend postgres (default: ${pg.ENV})",
    )
    return parser.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    modes = (
        [Evidence.TRUTHFUL, Evidence.HOSTILE]
        if args.evidence == "both"
        else [Evidence(args.evidence)]
    )
    database = None
    if args.backend == "postgres":
        if not args.postgres_url:
            print(f"--backend postgres needs --postgres-url or {pg.ENV}", file=sys.stderr)
            return 2
        database = await pg.create_database_async(args.postgres_url)
    configs = [
        RunConfig(
            seed=seed,
            steps=args.steps,
            backend=args.backend,
            evidence=mode,
            allowed=frozenset() if args.strict else EXPECTED_TO_FAIL_BEFORE_FIX,
            stop_on=args.stop_on,
            trace_lines=args.trace,
            echo=args.echo,
            cancellations=not args.no_cancellations,
        )
        for seed in range(args.seed, args.seed + args.seeds)
        for mode in modes
    ]
    results: list[RunResult] = []
    started = time.perf_counter()

    def show(result: RunResult) -> None:
        results.append(result)
        print(result.summary(), flush=True)
        if result.fatal is not None:
            print(result.failure_report(), flush=True)

    try:
        if args.jobs > 1:
            loop = asyncio.get_running_loop()
            with ProcessPoolExecutor(args.jobs) as pool:
                futures = [loop.run_in_executor(pool, run_sync, c, database) for c in configs]
                for future in asyncio.as_completed(futures):
                    show(await future)
        else:
            for config in configs:
                show(await run(config, database))
    finally:
        if database is not None:
            await pg.drop_database_async(database, args.postgres_url)
    elapsed = time.perf_counter() - started
    total = sum(r.steps_run + r.drain_steps for r in results)
    failed = [r for r in results if not r.ok]
    found: dict[str, int] = {}
    for r in results:
        for cause, count in r.known_counts.items():
            found[cause] = found.get(cause, 0) + count
    cpu = sum(r.cpu_s for r in results)
    print(
        f"\n{len(results)} run(s), {total} steps in {elapsed:.1f}s, cpu {cpu:.1f}s "
        f"({elapsed / max(total, 1) * 1e4:.1f}s per 10^4 steps, cpu "
        f"{cpu / max(total, 1) * 1e4:.1f}s); {len(failed)} failed"
    )
    for cause in sorted(found):
        letter = BUG_LETTERS.get(cause)
        runs = sum(1 for r in results if cause in r.known)
        print(
            f"  known {cause}{f' (bug {letter})' if letter else ''}: "
            f"in {runs} run(s), {found[cause]} time(s)"
        )
    return 1 if failed else 0


def run_sync(config: RunConfig, database: str | None) -> RunResult:
    return asyncio.run(run(config, database))


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
