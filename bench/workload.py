"""The load generator: C workers, each POSTing a small JSON body to its own
/sink/w{i} in a loop, and what they measured in the window after the warm-up.

A fenced worker first takes a lease on bench:w{i} and sends its Fence-Token and
a fresh Idempotency-Key with every request, so each one is admitted, recorded
and forwarded as a fenced effect (see run_worker's kinds for the replay and
stale-refusal rounds). Only 2xx answers count as requests (4xx in a round of stale
refusals); anything else is an error. Requests are counted when they complete inside the window.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from bench.cpu import CpuSnapshot, CpuUsage, usage

LEASE_TTL_S = 300
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
    round: int = 1  # of the throughput rounds, which run --rounds times


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


# What a fenced worker sends: a fresh Idempotency-Key each time (every request a new
# effect), one key over and over (after the first, every request a replay), or a
# fresh key with the token of a lease it released (every request a stale refusal,
# which then counts as the answer expected).
FRESH, REPLAY, STALE = "fresh", "replay", "stale"


async def run_worker(
    session: aiohttp.ClientSession,
    url: str,
    fence_token: str | None,
    measure_from: float,
    measure_until: float,
    tally: WorkerTally,
    kind: str = FRESH,
    extra_headers: dict[str, str] | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    headers = {"Content-Type": "application/json", **(extra_headers or {})}
    if fence_token is not None:
        headers["Fence-Token"] = fence_token
        headers["Idempotency-Key"] = uuid.uuid4().hex
    expected = range(400, 500) if kind == STALE else range(200, 300)
    while loop.time() < measure_until:
        if fence_token is not None and kind != REPLAY:
            headers["Idempotency-Key"] = uuid.uuid4().hex
        await send_one(session, url, headers, expected, measure_from, measure_until, tally)


async def send_one(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    expected: range,
    measure_from: float,
    measure_until: float,
    tally: WorkerTally,
) -> None:
    """One request, its latency or its error tallied if it completed inside the window."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    error: str | None
    try:
        async with session.post(url, data=REQUEST_BODY, headers=headers) as response:
            if response.status in expected:
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
    *,
    fenced: bool,
    kind: str = FRESH,
    extra_headers: dict[str, str] | None = None,
) -> Measurement:
    """Worker i talks to base_urls[i mod len]; `fenced` workers take a lease first and
    send a fresh Idempotency-Key with each request. With a `sampler`, CPU is accounted
    over the measured window."""
    urls = [base_urls] if isinstance(base_urls, str) else base_urls
    worker_urls = [urls[worker % len(urls)] for worker in range(concurrency)]
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=REQUEST_TIMEOUT) as session:
        tokens: list[str | None] = [None] * concurrency
        if fenced:
            tokens = list(
                await asyncio.gather(
                    *(
                        acquire_lease(session, worker_urls[worker], worker)
                        for worker in range(concurrency)
                    )
                )
            )
            if kind == STALE:
                for worker, token in enumerate(tokens):
                    assert token is not None
                    await release_lease(session, worker_urls[worker], token)
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
                    kind,
                    extra_headers,
                )
                for worker, (token, tally) in enumerate(zip(tokens, tallies, strict=True))
            ),
        )
        for worker, token in enumerate(tokens):
            if token is not None and kind != STALE:
                await release_lease(session, worker_urls[worker], token)

    return tallied(target, concurrency, duration_s, tallies, len(urls), cpu)


def tallied(
    target: str,
    concurrency: int,
    duration_s: float,
    tallies: list[WorkerTally],
    replicas: int = 1,
    cpu: CpuUsage | None = None,
) -> Measurement:
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
        replicas=replicas,
        cpu=cpu,
    )


@dataclass(frozen=True)
class LatencyTarget:
    """One of the targets of `measure_alternately`: its name in the figures, its base URL,
    and whether it fences (a lease first, a fresh Idempotency-Key with each request)."""

    name: str
    base_url: str
    fenced: bool


async def measure_alternately(
    targets: list[LatencyTarget],
    warmup_s: float,
    duration_s: float,
    extra_headers: dict[str, str] | None = None,
) -> list[Measurement]:
    """One worker (concurrency 1), one request to each target in turn, the order rotated
    each turn: a latency compared between targets is then taken under the same machine
    load, request by request, and none of them waits behind another of its own. The
    same path (/sink/w0) on each, so an upstream measured directly is asked what the
    proxies forward to it."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=REQUEST_TIMEOUT) as session:
        headers: list[dict[str, str]] = []
        for target in targets:
            sent = {"Content-Type": "application/json", **(extra_headers or {})}
            if target.fenced:
                sent["Fence-Token"] = await acquire_lease(session, target.base_url, 0)
            headers.append(sent)
        loop = asyncio.get_running_loop()
        measure_from = loop.time() + warmup_s
        measure_until = measure_from + duration_s
        tallies = [WorkerTally() for _ in targets]
        expected = range(200, 300)
        turn = 0
        while loop.time() < measure_until:
            for offset in range(len(targets)):
                index = (turn + offset) % len(targets)
                if targets[index].fenced:
                    headers[index]["Idempotency-Key"] = uuid.uuid4().hex
                await send_one(
                    session,
                    f"{targets[index].base_url}/sink/w0",
                    headers[index],
                    expected,
                    measure_from,
                    measure_until,
                    tallies[index],
                )
            turn += 1
        for target, sent in zip(targets, headers, strict=True):
            if target.fenced:
                await release_lease(session, target.base_url, sent["Fence-Token"])
    return [
        tallied(target.name, 1, duration_s, [tally])
        for target, tally in zip(targets, tallies, strict=True)
    ]
