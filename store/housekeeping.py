"""Housekeeping: the refusal tally, garbage collection, retention and fence-restore."""

from __future__ import annotations

import json

from core.records import Rejection
from policies.model import Retention
from store.base import Tx
from store.part import StorePart
from store.types import Purged


class Housekeeping(StorePart):
    async def record_rejection(self, rejection: Rejection) -> None:
        """Count a refusal on the record (store/refusals.py): no I/O until the next
        flush_refusal_counts."""
        self.refusals.count(rejection)

    async def flush_refusal_counts(self) -> int:
        """Write the refusals counted since the last flush (and a batch an earlier
        flush may not have written), a transaction a batch; how many kinds were
        written. Their first and last time seen are the flush's, so they are as exact
        as the flushes are frequent. A flush that failed or was cancelled leaves its
        counts for the next, which never writes them twice."""
        return await self.refusals.flush()

    async def rejections(self, resource: str | None = None, limit: int = 100) -> list[Rejection]:
        """Newest first: the refusals on record, all of them or those of `resource`,
        each kind with its count and first and last time seen."""
        return await self.refusals.listing(resource, limit)

    async def collect_garbage(self) -> int:
        """Delete idempotency records past their retention whose effect is settled."""

        async def operation(tx: Tx) -> int:
            lock = await tx.one("gc_lock")
            if not (lock and lock["acquired"]):
                return 0  # another replica is collecting right now
            return await tx.execute("expired_idempotency_records", now=tx.now)

        return await self.connector.write(operation)

    async def apply_retention(self, retention: Retention) -> Purged:
        """One bounded pass of retention, in one transaction: at most `batch` settled
        effects that settled more than `effects_s` ago (with their history and expired
        idempotency records; never one in doubt or conflicting, never one a retained key
        points to, nor one whose key an open effect under it still needs), at most
        `batch` rejections older than `rejections_s`, at most `batch` leases that
        expired more than `leases_s` ago, and, of at most `batch` resource rows, those
        nothing refers to any more (`_collect_resources`). 0 keeps forever. One replica
        at a time; the others' passes delete nothing."""

        async def operation(tx: Tx) -> Purged:
            lock = await tx.one("retention_lock")
            if not (lock and lock["acquired"]):
                return Purged(0, 0)
            effects = rejections = 0
            if retention.effects_s > 0:
                picked = await tx.all(
                    "expired_effects",
                    horizon=tx.now - retention.effects_s,
                    now=tx.now,
                    limit=retention.batch,
                )
                if picked:
                    ids = json.dumps([row["id"] for row in picked])
                    await tx.execute("delete_events_of_effects", ids=ids)
                    await tx.execute("delete_keys_of_effects", ids=ids, now=tx.now)
                    effects = await tx.execute("delete_effects", ids=ids)
            if retention.rejections_s > 0:
                # Kinds of refusal not seen since the horizon.
                rejections = await tx.execute(
                    "delete_expired_refusals",
                    horizon=tx.now - retention.rejections_s,
                    limit=retention.batch,
                )
                await tx.execute(
                    "delete_expired_refusal_batches", horizon=tx.now - retention.rejections_s
                )
            leases = resources = 0
            if retention.leases_s > 0:
                ended = await tx.all(
                    "delete_expired_leases",
                    horizon=tx.now - retention.leases_s,
                    limit=retention.batch,
                )
                leases = len(ended)
                resources = await _collect_resources(
                    tx, {row["resource"] for row in ended}, retention.batch
                )
            return Purged(effects, rejections, leases, resources)

        return await self.connector.write(operation)

    async def fence_restore(self, advance: int) -> int:
        """After a restore from backup: raise every epoch (and the floor under new
        resources) by `advance` past the highest the backup knows, and end every lease,
        so nothing issued since the backup is ever issued again. Returns the new floor."""

        async def operation(tx: Tx) -> int:
            return await fence_all(tx, advance, "fence-restore")

        return await self.connector.write(operation)


async def fence_all(tx: Tx, advance: int, reason: str, at_least: int = 0) -> int:
    """Fence everything issued before, in `tx`: `store fence-restore`, and the recovery
    after a failover or a restore that lost history (store/failover.py), are this one
    function. Every epoch (and the floor under new resources) is raised `advance` past
    the highest the store knows, or past `at_least` (a floor this process saw on a
    history the database no longer holds) if higher; every lease ends (`reason`). Returns
    the new floor."""
    await tx.execute("lock_all_resources")
    row = await tx.one("epoch_floor_and_max")
    assert row is not None
    floor = max(int(row["epoch_floor"]), int(row["max_epoch"]), at_least) + advance
    await tx.execute("set_epoch_floor", floor=floor)
    await tx.execute("advance_all_epochs", floor=floor)
    await tx.execute("end_all_leases", now=tx.now, reason=reason)
    # A proxy that remembers another store accepts this one once it was fenced after
    # the proxy last started (proxy/identity.py).
    await tx.execute("mark_fenced", now=tx.now)
    return floor


async def _collect_resources(tx: Tx, leased: set[str], batch: int) -> int:
    """Delete, of at most `batch` resource rows, those nothing refers to any more (no
    lease, no effect, and so no idempotency record, which has its effect), and raise
    the epoch floor to their highest epoch in the same transaction: a later acquire of
    one of those names starts above the floor, so it still gets an epoch higher than
    any ever issued for it.

    The rows looked at are those whose leases this pass deleted (usually their last
    reference), then, in the room left, the next rows of a sweep of the whole table in
    key order: a row whose last reference went another way (its effects kept longer
    than its leases), that never had one (a revocation of a name never leased), or
    that was in use when its leases went, is found on the sweep's next round."""
    locked = await tx.all("lock_resources", resources=_json(leased))
    names = {row["resource"] for row in locked}
    room = batch - len(leased)
    swept_to: str | None = None
    if room > 0:
        swept = [row["resource"] for row in await tx.all("sweep_resources", limit=room)]
        # Past the last row the sweep starts again from the first ('' sorts first).
        swept_to = swept[-1] if len(swept) >= room else ""
        names.update(swept)
    deleted = await tx.all("delete_unreferenced_resources", resources=_json(names)) if names else []
    # store_meta's row last: every clock move and floor raise waits for its lock, so it
    # is held for the end of the transaction only, not for the deletes.
    if swept_to is not None:
        await tx.execute("set_resources_swept_to", resource=swept_to)
    if deleted:
        await tx.execute("raise_epoch_floor", floor=max(int(row["epoch"]) for row in deleted))
    return len(deleted)


def _json(names: set[str]) -> str:
    """Resource names as one parameter on both backends (a JSON array)."""
    return json.dumps(sorted(names))
