"""Records read inside a transaction, under their resource's lock where a decision
rests on them: every part of the Store reads the same way."""

from __future__ import annotations

from typing import Any

from core.records import IdempotencyRecord, LeaseRecord, ResourceState
from store import rows
from store.base import Row, Tx


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
    return rows.resource_state(row, resource)


def admission_records(
    row: Row, resource: str, key: str | None
) -> tuple[LeaseRecord | None, ResourceState | None, IdempotencyRecord | None]:
    """The token's lease, and, for a token of this very resource, the resource's state
    and the key's record, from admission_state's one row: its t_* columns are
    lease_by_token's, its own resource_state's, its i_* idempotency_record's."""
    if row["t_resource"] is None:
        return None, None, None
    lease = rows.lease_record({name: row[f"t_{name}"] for name in _LEASE_COLUMNS})
    assert lease is not None
    if lease.resource != resource:
        return lease, None, None
    state = rows.resource_state(row, resource)
    existing = None
    if row["i_effect_id"] is not None:
        existing = rows.idempotency_record(
            {"resource": resource, "key": key, **{name: row[f"i_{name}"] for name in _KEY_COLUMNS}}
        )
    return tokens_lease(lease, state), state, existing


def tokens_lease(lease: LeaseRecord, state: ResourceState) -> LeaseRecord | None:
    """The lease a token names, as its resource's state (read under the lock) shows it:
    a concurrent renew or release shows. None: epochs only grow, so a resource whose
    epoch is below the lease's lost both to retention while this waited for the lock
    (PostgreSQL), and the token names no lease any more."""
    if state.lease is not None and state.lease.epoch == lease.epoch:
        return state.lease
    if state.epoch < lease.epoch:
        return None
    return lease


_LEASE_COLUMNS = (
    "resource",
    "epoch",
    "holder",
    "granted_at",
    "expires_at",
    "ended_at",
    "end_reason",
    "client",
)
_KEY_COLUMNS = (
    "fingerprint",
    "effect_id",
    "effect_state",
    "epoch",
    "expires_at",
    "response_status",
    "response_headers",
    "response_body",
    "settled_by",
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
