"""What every handler shares: the policy, the store, the upstream client, the metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from core.codes import ErrorCode
from core.quotas import AcquireRate
from core.records import Rejection
from policies import Policy
from proxy.auth import CLIENT, Credentials, Keyring
from proxy.identity import IdentityCheck
from proxy.metrics import Metrics
from proxy.readiness import Readiness
from store import Store, StoreUnavailable

if TYPE_CHECKING:
    from proxy.forwarding import UpstreamPools
    from proxy.retention import RetentionCollector
    from reconcile.prober import Reconciler


@dataclass
class Runtime:
    policy: Policy
    store: Store
    # Proxied requests being handled now, against `policy.limits.max_requests`.
    requests_in_flight: int = 0
    # How long a stop waits for them (`serve --grace`); said in the stop's log lines.
    grace_s: float = 10.0
    # Set once the listener has closed for a stop: a request cancelled from then on
    # was cut off by the end of the grace.
    stopping: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    # The credentials of `policy`'s clients and the admin tokens: swapped with it.
    keyring: Keyring = field(default_factory=lambda: Keyring(Credentials((), required=False)))
    reconciler: Reconciler | None = None
    retention: RetentionCollector | None = None
    shutting_down: bool = False
    readiness: Readiness = field(default_factory=Readiness)
    # Set by `serve`: check at start that the store is the one this instance last used.
    identity: IdentityCheck | None = None
    # Acquires per quota subject, per process (proxy/quotas.py), on a clock that never
    # goes back: the store's may, and buckets refill only with time that passed.
    acquire_rate: AcquireRate = field(default_factory=AcquireRate)
    quota_clock: Callable[[], float] = time.monotonic
    # When this process started, on time.monotonic: the status page's uptime.
    started: float = field(default_factory=time.monotonic)
    # Effects of lost admission answers being settled NOT_SENT while the store does not
    # answer (proxy/fenced.py), by effect id; cancelled when the app stops.
    settling: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # The file `policy` was read from (None: built in memory, nothing to reload), the
    # sha256 of its bytes, and what `serve` changes in it (--host, --port) each time.
    policy_file: str | None = None
    policy_digest: str | None = None
    adjust: Callable[[Policy], Policy] | None = None
    # Each reload starts a generation; proxied requests are counted by the generation
    # they started in, so the sessions a reload retired close once theirs are done.
    generation: int = 0
    in_flight_by_generation: dict[int, int] = field(default_factory=dict)
    reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    draining: set[asyncio.Task[None]] = field(default_factory=set)
    # Set each time a generation's last request ends (`wait_for_generation`).
    generation_ended: asyncio.Event = field(default_factory=asyncio.Event)

    def begin_request(self) -> int:
        self.requests_in_flight += 1
        generation = self.generation
        self.in_flight_by_generation[generation] = (
            self.in_flight_by_generation.get(generation, 0) + 1
        )
        return generation

    def end_request(self, generation: int) -> None:
        self.requests_in_flight -= 1
        left = self.in_flight_by_generation[generation] - 1
        if left:
            self.in_flight_by_generation[generation] = left
        else:
            del self.in_flight_by_generation[generation]
            self.generation_ended.set()

    async def wait_for_generation(self, generation: int) -> None:
        """Until no proxied request that started in `generation` or before runs."""
        while any(started <= generation for started in self.in_flight_by_generation):
            self.generation_ended.clear()
            await self.generation_ended.wait()

    def settle_in_background(self, work: Coroutine[Any, Any, None], effect_id: str) -> None:
        task = asyncio.create_task(work, name=f"settle-unsent-{effect_id}")
        self.settling[effect_id] = task
        task.add_done_callback(lambda _: self.settling.pop(effect_id, None))

    async def stop_settling(self) -> None:
        """Cancel what is still being settled: a sweep makes those effects UNKNOWN."""
        tasks = list(self.settling.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def record_rejection(
        self,
        request: web.Request,
        code: ErrorCode,
        route: str | None = None,
        resource: str | None = None,
        holder: str | None = None,
        epoch: int | None = None,
        client: str | None = None,
    ) -> None:
        self.metrics.count_refusal(code)
        # The record keeps configured clients only: one refused before it was
        # authenticated names itself in the refusal (`client`), else none.
        authenticated = request.get(CLIENT)
        if client is None and authenticated is not None:
            client = authenticated.name
        # A refusal that cannot be recorded is still a refusal: nothing was forwarded.
        with contextlib.suppress(StoreUnavailable):
            await self.store.record_rejection(
                Rejection(
                    code=code,
                    method=request.method,
                    path=request.path,
                    route=route,
                    resource=resource,
                    holder=holder,
                    epoch=epoch,
                    client=client,
                )
            )


RUNTIME = web.AppKey("runtime", Runtime)


@dataclass(frozen=True)
class Upstreams:
    """The proxy's client side, made by the app's cleanup context (it needs the running
    loop), so no handler ever sees it missing: routes forward through `pools`, the
    reconciler and operators' probes through `session`."""

    session: aiohttp.ClientSession
    pools: UpstreamPools


UPSTREAMS = web.AppKey("upstreams", Upstreams)


def runtime_of(request: web.Request) -> Runtime:
    return request.app[RUNTIME]
