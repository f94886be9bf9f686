"""The refusal record: bounded by what exists, not by requests, and
written so that no refusal is counted twice.

Every refusal the proxy gives is evidence and goes on record, but as one more in a count:
one row of `refusals` per (resource, code, route, epoch, holder, client), with its count,
first and last time seen, and a sample of the latest request (method, truncated path,
body fingerprint; never a body or a secret). When the count is written, a name the
store does not know is kept as "none": a resource that is not a row of `resources`, an
epoch no lease of that resource had, a holder that did not hold that lease (an invented
name holds nothing: it is counted, not kept). Routes and clients are the configuration's.
So the table grows with resources, leases granted, routes and clients, whatever arrives.

Refusals are added up in memory (`RefusalTally`, no I/O per refusal: on SQLite every
write waits for the one writer, on PostgreSQL each update leaves a row version until a
vacuum) and written in batches (`RefusalRecord.flush`): every second, before any
listing, and when the store closes. A batch carries a sequence number, recorded in the
transaction that writes its counts; a flush cancelled mid-write (the proxy's shutdown
does that) keeps its batch and the next flush writes it again under the same number,
which the store skips if the first attempt did commit. A batch is one statement that
sums the kinds coming to one key and upserts them in the key's order: two replicas'
flushes wait on each other rather than deadlock, and the key's bound does not depend on
what a concurrent flush has committed yet (no count of rows is ever read).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from core.records import Rejection, stored_path
from store.base import Connector, Row, Tx

# Distinct kinds of one code the tally keeps between two flushes before it counts new
# ones without their resource, epoch and holder (a flood of invented names would
# otherwise grow memory until the next flush; the store would drop them anyway).
MAX_KINDS_PER_CODE = 1000


@dataclass(frozen=True)
class RefusalKey:
    """What a refusal is counted by; '' and 0 stand for none."""

    resource: str
    code: str
    route: str
    epoch: int
    holder: str
    client: str

    @classmethod
    def of(cls, rejection: Rejection) -> RefusalKey:
        epoch = rejection.epoch or 0
        return cls(
            resource=rejection.resource or "",
            code=rejection.code,
            route=rejection.route or "",
            epoch=epoch,
            # A holder is kept only with the lease it held, so one naming no lease (an
            # acquire refused, say) is dropped here already, not after a flood of them.
            holder=(rejection.holder or "") if epoch else "",
            client=rejection.client or "",
        )

    def unnamed(self) -> RefusalKey:
        """The key without the names a request chooses (resource, epoch, holder): one
        per code, route and client, all of them from the configuration."""
        return RefusalKey("", self.code, self.route, 0, "", self.client)


@dataclass(frozen=True)
class Sample:
    """The latest request of a kind, as the record shows it."""

    method: str
    path: str
    fingerprint: str | None

    @classmethod
    def of(cls, rejection: Rejection) -> Sample:
        return cls(rejection.method, stored_path(rejection.path), rejection.fingerprint)


@dataclass(frozen=True)
class Batch:
    """Counts taken from the tally to be written in one transaction, once: `seq` is
    this flusher's number for it."""

    seq: int
    counts: dict[RefusalKey, int]
    samples: dict[RefusalKey, Sample]


class RefusalTally:
    """Refusals counted since the last batch was taken; at most `max_kinds` named keys
    a code, then that code's new kinds count under their unnamed key."""

    def __init__(self, max_kinds: int = MAX_KINDS_PER_CODE) -> None:
        self.max_kinds = max_kinds
        self._counts: Counter[RefusalKey] = Counter()
        self._samples: dict[RefusalKey, Sample] = {}
        self._kinds_of_code: Counter[str] = Counter()

    def add(self, rejection: Rejection) -> None:
        key = RefusalKey.of(rejection)
        if key not in self._counts and key != key.unnamed():
            if self._kinds_of_code[key.code] >= self.max_kinds:
                key = key.unnamed()
            else:
                self._kinds_of_code[key.code] += 1
        self._counts[key] += 1
        self._samples[key] = Sample.of(rejection)

    def take(self, seq: int) -> Batch | None:
        """Everything counted so far as batch `seq` (None if nothing was); the tally
        starts again from nothing."""
        if not self._counts:
            return None
        batch = Batch(seq, dict(self._counts), self._samples)
        self._counts = Counter()
        self._samples = {}
        self._kinds_of_code.clear()
        return batch

    def __len__(self) -> int:
        return len(self._counts)


class RefusalRecord:
    """One store's side of the record: its tally, the batch it has not yet seen
    committed, and the reads of the listing."""

    def __init__(self, connector: Connector, instance_id: str) -> None:
        self.connector = connector
        # One flusher per open store: a restarted process starts its numbers again.
        self.flusher = f"{instance_id}/{secrets.token_hex(8)}"
        self.tally = RefusalTally()
        self._last_seq = 0
        # Taken from the tally, not yet known written: written again, under its number,
        # by the next flush (a failed or cancelled one may or may not have committed).
        self._pending: Batch | None = None
        # One flush at a time: a listing after a flush sees everything it took.
        self._flushing = asyncio.Lock()

    def count(self, rejection: Rejection) -> None:
        self.tally.add(rejection)

    async def flush(self) -> int:
        """Write the batch a failed flush left, then what was counted since; how many
        kinds were written. On failure or cancellation the batch stays pending."""
        async with self._flushing:
            written = 0
            if self._pending is not None:
                written += await self._write(self._pending)
            self._last_seq += 1
            self._pending = self.tally.take(self._last_seq)
            if self._pending is not None:
                written += await self._write(self._pending)
            return written

    async def _write(self, batch: Batch) -> int:
        flusher = self.flusher

        async def operation(tx: Tx) -> int:
            if not await tx.execute(
                "claim_refusal_batch", flusher=flusher, seq=batch.seq, now=tx.now
            ):
                return 0  # an attempt the flush never heard back from committed it
            await tx.execute("add_refusals", now=tx.now, kinds=_kinds_json(batch))
            return len(batch.counts)

        written = await self.connector.write(operation)
        self._pending = None
        return written

    async def listing(self, resource: str | None, limit: int) -> list[Rejection]:
        """Newest first (by last time seen): all kinds, or those of `resource`. This
        store's counts are written first; another replica's are as of its last flush."""
        await self.flush()

        async def operation(tx: Tx) -> list[Rejection]:
            if resource is None:
                rows = await tx.all("refusals", limit=limit)
            else:
                rows = await tx.all("refusals_of_resource", resource=resource, limit=limit)
            return [_rejection(row) for row in rows]

        return await self.connector.read(operation)


def _kinds_json(batch: Batch) -> str:
    """The batch as add_refusals reads it; `i` orders the samples (the latest last)."""
    kinds = [
        {**asdict(key), "n": n, **asdict(batch.samples[key]), "i": i}
        for i, (key, n) in enumerate(batch.counts.items())
    ]
    return json.dumps(kinds)


def _rejection(row: Row) -> Rejection:
    # '' and 0 stand for none in the key (see the migration).
    none_if_empty: dict[str, Any] = {
        name: row[name] or None for name in ("route", "resource", "holder", "epoch", "client")
    }
    return Rejection(
        code=row["code"],
        method=row["method"],
        path=row["path"],
        fingerprint=row["fingerprint"],
        at=float(row["at"]),
        count=int(row["count"]),
        first_seen=float(row["first_seen"]),
        **none_if_empty,
    )
