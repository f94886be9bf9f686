"""What a PostgreSQL failover costs, and what synchronous replication costs instead.

    python -m bench.failover [--workers 4] [--seconds 3] [--rounds 3] [--settle 1.0]

Real processes, as tests/integration/replicas/test_failover.py: a primary and its
streaming standby (tests/pgstandby.py), the demo upstream, one proxy.

1. Synchronous replication: fenced writes (`POST /orders/{sku}`, one resource and one
   lease per worker) for `--seconds`, `--workers` at once, with the standby
   asynchronous, synchronous (`synchronous_standby_names = '*'`, `synchronous_commit =
   on`) and `remote_apply`, switched by ALTER SYSTEM in alternating rounds so that the
   shared machine's load falls on each alike. Prints each mode's writes per second and
   median and 99th-percentile latency, the median over the rounds.
2. The recovery window: the standby is cut off while the workers write, the primary
   stopped hard, the standby promoted and the proxy restarted on it. Prints how long
   each step takes, and what a worker waits after it: a new lease, each key it had
   sent and the store lost (on the route with a probe: until the probe's answer is
   believed, `--settle` after the window opened), and a key never sent before; then
   fenced writes of new keys while the window is open (each asks the probe first) and
   once `store close-recovery` closed it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.integration.replicas.conftest import Answer, Api, Fleet, Proxy, api_for
from tests.pgstandby import StandbyPair

MODES = {
    "async": {"synchronous_standby_names": "", "synchronous_commit": "on"},
    "sync on": {"synchronous_standby_names": "*", "synchronous_commit": "on"},
    "remote_apply": {"synchronous_standby_names": "*", "synchronous_commit": "remote_apply"},
}
TTL_S = 120.0
# Long: the shared machine can starve the demo upstream for seconds.
REPLICATION_TIMEOUT_S = 10.0


async def write_for(api: Api, proxy: Proxy, workers: int, seconds: float) -> tuple[float, ...]:
    """(writes per second, p50 ms, p99 ms) of `workers` writing at once for `seconds`."""
    latencies: list[float] = []
    failures: list[str] = []

    async def worker(number: int) -> None:
        sku = f"w{number}-{time.monotonic_ns()}"
        granted = await api.acquire(proxy, f"r:{sku}", f"worker-{number}", TTL_S)
        assert granted.status == 201, granted
        token = granted.body["token"]
        end = time.monotonic() + seconds
        written = 0
        while time.monotonic() < end:
            started = time.perf_counter()
            answer = await api.place_order(proxy, sku, token, f"{sku}.{written}")
            if answer.status != 201:
                # The shared machine starved the upstream past its timeout: the
                # resource is in doubt, this worker stops (counted, not hidden).
                failures.append(answer.outcome)
                return
            latencies.append(time.perf_counter() - started)
            written += 1
        await api.release(proxy, token)

    await asyncio.gather(*(worker(number) for number in range(workers)))
    ordered = sorted(latencies)
    if failures:
        print(f"  ({len(failures)} workers stopped early: {', '.join(failures)})")
    return (
        len(latencies) / seconds,
        1000 * ordered[len(ordered) // 2],
        1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    )


async def until_answered(
    api: Api, proxy: Proxy, sku: str, token: str, key: str
) -> tuple[Answer, int]:
    """The order `key` sent until it is not refused `recovery_window`; the answer, and
    how many refusals it took (asked again every 50 ms, sooner than Retry-After, to
    measure the window rather than the worker's patience)."""
    refusals = 0
    while True:
        answer = await api.place_order(proxy, sku, token, key)
        if answer.code != "recovery_window":
            return answer, refusals
        refusals += 1
        await asyncio.sleep(0.05)


async def readyz(api: Api, proxy: Proxy) -> dict[str, Any]:
    async with api.session.get(f"{proxy.url}/_fence/readyz") as response:
        body: dict[str, Any] = await response.json()
        return body


async def replication_cost(args: argparse.Namespace, directory: Path) -> None:
    with StandbyPair() as pair:
        fleet = Fleet(directory / "replication")
        fleet.tmp_path.mkdir()
        try:
            fleet.start_upstream()
            proxy = fleet.start_proxy("p", pair.primary_url, timeout_s=REPLICATION_TIMEOUT_S)
            results: dict[str, list[tuple[float, ...]]] = {mode: [] for mode in MODES}
            async with api_for(fleet) as api:
                for _ in range(args.rounds):
                    for mode, settings in MODES.items():
                        pair.configure_primary(**settings)
                        results[mode].append(
                            await write_for(api, proxy, args.workers, args.seconds)
                        )
        finally:
            fleet.close()
    print(f"fenced writes, {args.workers} workers, {args.rounds} rounds of {args.seconds:g} s")
    print(f"{'mode':<14}{'writes/s':>10}{'p50 ms':>9}{'p99 ms':>9}   rounds (writes/s)")
    for mode, rounds in results.items():
        rate, p50, p99 = (statistics.median(r[i] for r in rounds) for i in range(3))
        each = " ".join(f"{r[0]:.0f}" for r in rounds)
        print(f"{mode:<14}{rate:>10.0f}{p50:>9.1f}{p99:>9.1f}   {each}")


async def recovery_cost(args: argparse.Namespace, directory: Path) -> None:
    with StandbyPair() as pair:
        fleet = Fleet(directory / "recovery")
        fleet.tmp_path.mkdir()
        try:
            await _recovery(args, pair, fleet)
        finally:
            fleet.close()


async def _recovery(args: argparse.Namespace, pair: StandbyPair, fleet: Fleet) -> None:
    fleet.start_upstream()
    before = fleet.start_proxy("p", pair.primary_url, timeout_s=args.settle, settle_s=args.settle)
    async with api_for(fleet) as api:
        await write_for(api, before, args.workers, 0.5)
        pair.wait_caught_up()
        pair.detach_standby()
        # Acknowledged by the primary only: one lease and three orders per worker.
        lost: dict[str, list[str]] = {}
        for number in range(args.workers):
            sku = f"lost{number}"
            granted = await api.acquire(before, f"r:{sku}", f"worker-{number}", TTL_S)
            token = granted.body["token"]
            lost[sku] = [f"{sku}.{n}" for n in range(3)]
            for key in lost[sku]:
                answer = await api.place_order(before, sku, token, key)
                assert answer.status == 201, answer
        started = time.monotonic()
        pair.crash_primary()
        before.process.terminate()
        crashed = time.monotonic()
        pair.promote()
        promoted = time.monotonic()
        after = fleet.start_proxy(
            "p", pair.standby_url, timeout_s=args.settle, settle_s=args.settle
        )
        ready = time.monotonic()

        async def worker(number: int) -> tuple[float, float, int, float, int]:
            """(acquire s, until the last lost key is answered s, refusals, a new key s,
            refusals)."""
            sku = f"lost{number}"
            begun = time.monotonic()
            granted = await api.acquire(after, f"r:{sku}", f"worker-{number}", TTL_S)
            assert granted.status == 201, granted
            token = granted.body["token"]
            acquired = time.monotonic()
            refusals = 0
            for key in lost[sku]:
                answer, refused = await until_answered(api, after, sku, token, key)
                refusals += refused
                assert answer.status == 200 and answer.body["state"] == "COMMITTED", answer
            recovered = time.monotonic()
            answer, refused = await until_answered(api, after, sku, token, f"{sku}.new")
            assert answer.status == 201, answer
            return (
                acquired - begun,
                recovered - begun,
                refusals,
                time.monotonic() - recovered,
                refused,
            )

        waits = await asyncio.gather(*(worker(number) for number in range(args.workers)))
        recovered = time.monotonic()
        # While the window is open, every new key costs a probe first; then closed.
        window_open = await write_for(api, after, args.workers, args.seconds)
        closed = fleet.cli(after.config_path, "store", "close-recovery", "--yes")
        assert closed.returncode == 0, closed
        for _ in range(100):  # a replica reads the window again every 5 s
            if "recovery_window" not in await readyz(api, after):
                break
            await asyncio.sleep(0.1)
        window_closed = await write_for(api, after, args.workers, args.seconds)
    print(f"failover, {args.workers} workers, settle_s {args.settle:g}")
    print(f"  crash (pg_ctl stop -m immediate, proxy stopped)  {crashed - started:6.2f} s")
    print(f"  promote (pg_ctl promote -w)                      {promoted - crashed:6.2f} s")
    print(f"  proxy restarted, recovered, ready                {ready - promoted:6.2f} s")
    print(f"  workers: new lease, lost keys answered           {recovered - ready:6.2f} s")
    for number, (acquire_s, lost_s, refusals, new_s, new_refusals) in enumerate(waits):
        print(
            f"    worker {number}: acquire {acquire_s * 1000:.0f} ms, 3 lost keys answered "
            f"(applied, by the probe) after {lost_s:.2f} s ({refusals} refusals), "
            f"a new key forwarded after {new_s:.2f} s ({new_refusals} refusals)"
        )
    for name, (rate, p50, p99) in (("open", window_open), ("closed", window_closed)):
        print(
            f"  new keys, window {name:<6}: {rate:.0f} writes/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="the probed route's settle_s, and its upstream timeout_s (the least it allows)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fenceproxy-failover-bench-") as directory:
        await recovery_cost(args, Path(directory))
        await replication_cost(args, Path(directory))


if __name__ == "__main__":
    asyncio.run(main())
