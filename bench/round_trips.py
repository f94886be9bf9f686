"""Round trips to PostgreSQL per request, as the proxy's connector counts them
(store/round_trips.py RoundTrips, exported as fenceproxy_store_round_trips_total).

One worker sends requests one at a time, so the counter's rise over them is theirs,
plus what the proxy's background loops sent meanwhile (the reconciler polls five
times a second, four round trips each) and the closing scrape's own read. Those are
measured first, as the rise over an idle second, and taken off in proportion to the
time the requests took; what is left is the requests' own, within a few hundredths.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from dataclasses import dataclass

import aiohttp

from bench.workload import (
    REQUEST_BODY,
    REQUEST_TIMEOUT,
    BenchError,
    acquire_lease,
    describe_refusal,
)

# The bound for a fenced request, admission and receipt together.
MAX_ROUND_TRIPS = 5
REQUESTS = 200
IDLE_S = 1.0
_COUNTER = re.compile(r"^fenceproxy_store_round_trips_total (\S+)$", re.MULTILINE)
# Resources of their own (the route's bench:{key}), apart from the throughput workers'.
FENCED_WORKER = 10_001
REFUSED_WORKER = 10_002


@dataclass(frozen=True)
class RoundTrips:
    """Round trips per request of each kind: a fenced write with a fresh key, a replay
    of one (same key, same body), a stale token's refusal."""

    fenced: float
    replay: float
    refusal: float

    @property
    def met(self) -> bool:
        # The background's share is taken off as a rate, so a figure is good to a few
        # hundredths either way (the test counts exactly: 5).
        return round(self.fenced, 1) <= MAX_ROUND_TRIPS


async def _counter(session: aiohttp.ClientSession, base_url: str) -> float:
    async with session.get(f"{base_url}/_fence/metrics") as response:
        text = await response.text()
    found = _COUNTER.search(text)
    if response.status != 200 or found is None:
        raise BenchError(f"no fenceproxy_store_round_trips_total at {base_url}/_fence/metrics")
    return float(found.group(1))


async def _per_request(
    session: aiohttp.ClientSession,
    base_url: str,
    worker: int,
    token: str,
    key: str | None,
    refused: bool = False,
) -> float:
    url = f"{base_url}/sink/w{worker}"
    idle_started = time.monotonic()
    idle_before = await _counter(session, base_url)
    await asyncio.sleep(IDLE_S)
    before = await _counter(session, base_url)
    idle_rate = (before - idle_before) / (time.monotonic() - idle_started)
    started = time.monotonic()
    for _ in range(REQUESTS):
        headers = {
            "Content-Type": "application/json",
            "Fence-Token": token,
            "Idempotency-Key": key or uuid.uuid4().hex,
        }
        async with session.post(url, data=REQUEST_BODY, headers=headers) as response:
            expected = 400 <= response.status < 500 if refused else 200 <= response.status < 300
            if not expected:
                raise BenchError(f"round trips: {url} answered {await describe_refusal(response)}")
            await response.read()
    background = idle_rate * (time.monotonic() - started)
    return (await _counter(session, base_url) - before - background) / REQUESTS


async def measure_round_trips(base_url: str) -> RoundTrips:
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        token = await acquire_lease(session, base_url, FENCED_WORKER)
        fenced = await _per_request(session, base_url, FENCED_WORKER, token, None)
        replayed_key = uuid.uuid4().hex
        await _per_request(session, base_url, FENCED_WORKER, token, replayed_key)
        replay = await _per_request(session, base_url, FENCED_WORKER, token, replayed_key)
        stale = await acquire_lease(session, base_url, REFUSED_WORKER)
        async with session.post(
            f"{base_url}/_fence/v1/leases/release", headers={"Fence-Token": stale}
        ) as response:
            if not 200 <= response.status < 300:
                raise BenchError(f"lease release: {await describe_refusal(response)}")
        refusal = await _per_request(session, base_url, REFUSED_WORKER, stale, None, refused=True)
    return RoundTrips(fenced, replay, refusal)
