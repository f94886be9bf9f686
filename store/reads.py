"""Records read inside a transaction, under their resource's lock where a decision
rests on them: every part of the Store reads the same way."""

from __future__ import annotations

from typing import Any

from core.records import EffectState, OpenEffect, ResourceState
from store.base import Row, Tx
from store.rows import lease_record


def float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


async def resource_state(tx: Tx, resource: str, lock: bool) -> ResourceState:
    """The resource's records; `lock` first takes the resource's lock where the backend
    needs one, so the decision made on them holds until the transaction ends. Every
    change to a resource's effects and keys takes the same lock, so what is read here
    is one consistent view."""
    if lock:
        await lock_resource(tx, resource)
    row = await tx.one("resource_state", resource=resource)
    assert row is not None  # the query always answers one row
    epoch = int(row["epoch"] or 0)
    lease = lease_record(row) if row["holder"] is not None else None
    open_effects = tuple(
        OpenEffect(
            id=r["id"],
            state=EffectState(r["state"]),
            epoch=int(r["epoch"]),
            idempotency_key=r["idempotency_key"],
            fingerprint=r["fingerprint"],
        )
        for r in await tx.all("effects_in_doubt", resource=resource)
    )
    return ResourceState(
        resource=resource,
        epoch=epoch,
        lease=lease,
        open_effects=open_effects,
        epoch_floor=int(row["epoch_floor"] or 0),
    )


async def lock_resource(tx: Tx, resource: str) -> None:
    locked = await tx.one("lock_resource", resource=resource)
    if locked is not None:  # a backend whose lock can be waited for says when it got it
        tx.now = float(locked["now"])


async def effect_row(tx: Tx, effect_id: str) -> Row:
    row = await tx.one("effect", id=effect_id)
    assert row is not None
    return row


async def locked_effect(tx: Tx, effect_id: str, skip_locked: bool = False) -> Row | None:
    """The effect's row, read under its resource's lock (taken first, as admission does,
    so that the two never wait on each other in opposite orders). With `skip_locked`,
    None if another transaction holds the effect's row."""
    row = await tx.one("effect", id=effect_id)
    if row is None:
        return None
    await lock_resource(tx, row["resource"])
    query = "effect_for_update_skip_locked" if skip_locked else "effect_for_update"
    return await tx.one(query, id=effect_id)
