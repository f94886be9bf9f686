"""`python -m tests.nemesis` (`make chaos`): seeds one after another until the duration is
spent, each a run of its own; prints each seed's faults, operations and violations, and
exits 1 if any seed found one (its report has the schedule and the history to replay).

    python -m tests.nemesis --seed 7 --duration 300 --backend postgres
    python -m tests.nemesis --seed 7 --seeds 1 --run-s 20     # replay seed 7 alone
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter

from tests import pg
from tests.nemesis.harness import BACKENDS, run_seed


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.nemesis", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds in all")
    parser.add_argument("--run-s", type=float, default=20.0, help="seconds of faults per seed")
    parser.add_argument("--seeds", type=int, default=0, help="at most this many (0: no limit)")
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="repeat for several, taken in turn (default: postgres)",
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    backends = args.backend or ["postgres"]
    admin = os.environ.get(pg.ENV) or None
    if (
        any(backend != "sqlite" for backend in backends)
        and admin is None
        and "postgres" in backends
    ):
        parser.error(f"the postgres backend needs {pg.ENV}")
    end = time.monotonic() + args.duration
    seed, runs, failed = args.seed, 0, []
    faults: Counter[str] = Counter()
    stops: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    while time.monotonic() < end and (args.seeds == 0 or runs < args.seeds):
        backend = backends[runs % len(backends)]
        report = asyncio.run(
            run_seed(
                seed,
                min(args.run_s, max(5.0, end - time.monotonic())),
                backend,
                admin_url=admin,
                workers=args.workers,
                replicas=args.replicas,
            )
        )
        print(report.text(), flush=True)
        faults.update(report.history.faults)
        stops.update(report.history.stops)
        ops.update(report.history.ops)
        if report.violations:
            failed.append((seed, backend))
        seed += 1
        runs += 1
    print(
        f"{runs} seeds from {args.seed}; faults {_counts(faults)}; "
        f"failpoints reached {_counts(stops)}; "
        f"operations {sum(ops.values())}; seeds with violations: {failed or 'none'}"
    )
    return 1 if failed else 0


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counter.items())) or "none"


if __name__ == "__main__":
    sys.exit(main())
