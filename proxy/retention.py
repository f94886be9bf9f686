"""Retention of the audit trail: the background collector (policy `retention:`).

Every `INTERVAL_S` it runs passes of `Store.apply_retention`, each one transaction
deleting at most `batch` settled effects (with their history and expired keys), at
most `batch` rejections, at most `batch` expired leases and, of at most `batch`
resource rows (those of the leases it deleted, then the next ones of a sweep), those
nothing refers to any more (raising the epoch floor past them), and goes on at once
while a pass deleted a full batch:
a backlog is worked off in bounded steps, never in one long transaction. On
PostgreSQL one replica at a time does it (an advisory lock; the others' passes
delete nothing); on SQLite the proxy is the only process.

The loop (proxy/periodic.py, `retention`) outlives any failure of a round: it logs
it, counts an unexpected one, and backs off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from policies import Retention
from store import Purged, Store

log = logging.getLogger("fenceproxy.retention")

INTERVAL_S = 60.0


class RetentionCollector:
    def __init__(
        self,
        store: Store,
        retention: Retention,
        on_deleted: Callable[[Purged], None] = lambda purged: None,
    ) -> None:
        self.store = store
        self.retention = retention
        self.on_deleted = on_deleted
        # Set to run a round now (tests, or an operator's tooling in-process).
        self.wake = asyncio.Event()
        # Rounds ended (deleted, found nothing, or failed): what has run since the start.
        self.rounds = 0

    @property
    def enabled(self) -> bool:
        return any(
            days > 0
            for days in (
                self.retention.effects_s,
                self.retention.rejections_s,
                self.retention.leases_s,
            )
        )

    async def collect(self) -> tuple[Purged, int]:
        """Passes until one deletes less than a full batch of every kind; returns what
        they deleted in all, and how many passes it took."""
        total = Purged(0, 0)
        passes = 0
        while True:
            purged = await self.store.apply_retention(self.retention)
            passes += 1
            total += purged
            if purged:
                self.on_deleted(purged)
            if not purged.full(self.retention.batch):
                return total, passes
            # Each pass is its own transaction; let the event loop (and, on SQLite, the
            # admissions queued for the writer) run between them.
            await asyncio.sleep(0)

    async def round(self) -> None:
        """One round of the loop: passes until the backlog is worked off."""
        try:
            purged, passes = await self.collect()
        finally:
            self.rounds += 1
        if purged:
            log.info(
                "retention: deleted %d effects, %d rejections, %d leases and %d"
                " resources in %d passes",
                purged.effects,
                purged.rejections,
                purged.leases,
                purged.resources,
                passes,
            )
