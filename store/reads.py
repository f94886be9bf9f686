"""Records read inside a transaction, under their resource's lock where a decision
rests on them: every part of the Store reads the same way."""

from __future__ import annotations

from typing import Any

from core.records import IdempotencyRecord, LeaseRecord, ResourceState
from store import rows
from store.base import Row, Tx, Values


def float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


# The columns of resource_state and admission_state, in the order both backends answer
# them (store/sqlite.sql; store/postgres.sql, whose admission_state is the function
# fenceproxy_admission_state of store/schema/postgresql.sql): their readers take them
# by position. tests/integration/app/test_receipt_paths.py checks the order on both.
RESOURCE_STATE_COLUMNS = ("resource", *rows.STATE_COLUMNS)
ADMISSION_COLUMNS = (
    "now",  # the time once the lock was held (NULL: the connector's own)
    "store_id",
    *(f"t_{name}" for name in rows.LEASE_COLUMNS),  # the token's lease
    *rows.STATE_COLUMNS,  # its resource's
    *(f"i_{name}" for name in rows.KEY_COLUMNS),  # the key's record
)
ADMISSION_NOW = ADMISSION_COLUMNS.index("now")
_STATE_AT = RESOURCE_STATE_COLUMNS.index(rows.STATE_COLUMNS[0])
_ADMISSION_LEASE_AT = ADMISSION_COLUMNS.index(f"t_{rows.LEASE_COLUMNS[0]}")
_ADMISSION_STATE_AT = ADMISSION_COLUMNS.index(rows.STATE_COLUMNS[0])
_ADMISSION_KEY_AT = ADMISSION_COLUMNS.index(f"i_{rows.KEY_COLUMNS[0]}")


async def resource_state(tx: Tx, resource: str, lock: bool) -> ResourceState:
    """The resource's records; `lock` first takes the resource's lock where the backend
    needs one, so the decision made on them holds until the transaction ends. Every
    change to a resource's effects and keys takes the same lock, so what is read here
    is one consistent view."""
    if lock:
        await lock_resource(tx, resource)
    values = await tx.values("resource_state", resource=resource)
    assert values is not None  # the query always answers one row
    return rows.resource_state(values, _STATE_AT, resource)


def admission_records(
    values: Values, resource: str, key: str | None
) -> tuple[LeaseRecord | None, ResourceState | None, IdempotencyRecord | None]:
    """The token's lease, and, for a token of this very resource, the resource's state
    and the key's record, from admission_state's one row (ADMISSION_COLUMNS)."""
    if values[_ADMISSION_LEASE_AT] is None:
        return None, None, None
    lease = rows.lease_at(values, _ADMISSION_LEASE_AT)
    if lease.resource != resource:
        return lease, None, None
    state = rows.resource_state(values, _ADMISSION_STATE_AT, resource)
    existing = rows.key_record(values, _ADMISSION_KEY_AT, resource, key)
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
