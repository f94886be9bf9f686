"""`/_fence/readyz`: is the store taking durable writes now?

A read proves little: a full disk, a read-only file or a deleted database still
answers reads. So readiness writes one small heartbeat row (`Store.heartbeat`).
Load balancers and orchestrators poll readyz often, and every write on SQLite
queues behind the admissions; so at most one heartbeat is written per interval
per process, and the probes in between get the last answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from store import Replica, StoreError, StoreUnavailable

HEARTBEAT_INTERVAL_S = 1.0


class Heartbeats(Protocol):
    async def heartbeat(self) -> float: ...


class Replicas(Protocol):
    async def replicas(self, within_s: float) -> tuple[Replica, ...]: ...


class Readiness:
    def __init__(
        self,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._checked_at: float | None = None
        self._problem: str | None = None
        self._lock = asyncio.Lock()
        self._replicas: tuple[Replica, ...] = ()
        self._replicas_read_at: float | None = None

    def _fresh(self) -> bool:
        return self._checked_at is not None and self._clock() - self._checked_at < self.interval_s

    async def check(self, store: Heartbeats) -> None:
        """Return if the store took a write within the interval; raise StoreUnavailable
        (503 store_unavailable) if it refused one."""
        if not self._fresh():
            # Probes that arrive together share one heartbeat.
            async with self._lock:
                if not self._fresh():
                    try:
                        await store.heartbeat()
                        self._problem = None
                    except StoreError as exc:
                        # Whatever the driver said (disk full, read-only), not ready.
                        self._problem = f"the store refused a write: {exc}"
                    self._checked_at = self._clock()
        if self._problem is not None:
            raise StoreUnavailable(self._problem)

    async def replicas(self, store: Replicas, within_s: float) -> tuple[Replica, ...]:
        """The replicas' rows that readyz compares policies with, read at most once per
        interval too (raises StoreError when the store does not answer)."""
        read_at = self._replicas_read_at
        if read_at is None or self._clock() - read_at >= self.interval_s:
            self._replicas = await store.replicas(within_s)
            self._replicas_read_at = self._clock()
        return self._replicas
