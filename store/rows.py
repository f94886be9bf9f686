"""Rows of the backends' named queries → the records of core/records.py.

Both backends answer with the same columns (their SQL files share query names and
result shapes), so one set of mappers serves both. The rows an admission reads are
read by position (store/base.py `Values`), without a dict per row.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from operator import itemgetter

from core.records import (
    EffectRecord,
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    OpenEffect,
    ResourceState,
    StoredResponse,
)
from store.base import Row, Values

# The columns the positional readers below read, in this order: a lease's
# (lease_by_token's; admission_state's t_*), a resource's state (resource_state's after
# its `resource`; admission_state's, between its t_* and i_*) and a key's record
# (admission_state's i_*). store/reads.py names whole rows with them.
LEASE_COLUMNS = (
    "resource",
    "epoch",
    "holder",
    "granted_at",
    "expires_at",
    "ended_at",
    "end_reason",
    "client",
)
STATE_COLUMNS = (
    "epoch",
    "epoch_floor",
    "holder",
    "granted_at",
    "expires_at",
    "ended_at",
    "end_reason",
    "client",
    "open_effects",
)
KEY_COLUMNS = (
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
_lease_values = itemgetter(*LEASE_COLUMNS)


def lease_record(row: Row | None) -> LeaseRecord | None:
    if row is None:
        return None
    return lease_at(_lease_values(row), 0)


def lease_at(values: Values, at: int) -> LeaseRecord:
    """The lease whose LEASE_COLUMNS start at values[at]."""
    resource, epoch, holder, granted_at, expires_at, ended_at, end_reason, client = values[
        at : at + len(LEASE_COLUMNS)
    ]
    return LeaseRecord(
        resource=resource,
        epoch=int(epoch),
        holder=holder,
        granted_at=float(granted_at),
        expires_at=float(expires_at),
        ended_at=ended_at,
        end_reason=end_reason,
        client=client,
    )


def resource_state(values: Values, at: int, resource: str) -> ResourceState:
    """The resource's state from its STATE_COLUMNS, which start at values[at]: the
    highest epoch issued (NULL or 0: never), the epoch floor, the lease granted at that
    epoch (NULL holder: none), and `open_effects`, the resource's BLOCKING effects in
    admission order as a JSON array of [id, state, epoch, idempotency_key, fingerprint]
    (one column, not a query of its own: a round trip fewer)."""
    epoch, epoch_floor, holder, granted_at, expires_at, ended_at, end_reason, client, effects = (
        values[at : at + len(STATE_COLUMNS)]
    )
    lease = None
    if holder is not None:
        lease = lease_at(
            (resource, epoch, holder, granted_at, expires_at, ended_at, end_reason, client), 0
        )
    return ResourceState(
        resource=resource,
        epoch=int(epoch or 0),
        lease=lease,
        open_effects=tuple(
            OpenEffect(
                id=effect_id,
                state=EffectState(state),
                epoch=int(effect_epoch),
                idempotency_key=key,
                fingerprint=fingerprint,
            )
            for effect_id, state, effect_epoch, key, fingerprint in json.loads(effects)
        ),
        epoch_floor=int(epoch_floor or 0),
    )


def key_record(values: Values, at: int, resource: str, key: str | None) -> IdempotencyRecord | None:
    """The record of `key` under `resource` from its KEY_COLUMNS, which start at
    values[at]; None: the key has none (NULL effect_id)."""
    fingerprint, effect_id, effect_state, epoch, expires_at, status, meta, body, settled_by = (
        values[at : at + len(KEY_COLUMNS)]
    )
    if effect_id is None:
        return None
    assert key is not None  # no record joins a NULL key
    return IdempotencyRecord(
        resource=resource,
        key=key,
        fingerprint=fingerprint,
        effect_id=effect_id,
        effect_state=EffectState(effect_state),
        epoch=int(epoch),
        expires_at=float(expires_at) if expires_at is not None else None,
        response=None if status is None else stored_response(int(status), meta, bytes(body or b"")),
        settled_by=settled_by,
    )


def effect_record(row: Row) -> EffectRecord:
    return EffectRecord(
        id=row["id"],
        route=row["route"],
        resource=row["resource"],
        holder=row["holder"],
        epoch=int(row["epoch"]),
        idempotency_key=row["idempotency_key"],
        fingerprint=row["fingerprint"],
        method=row["method"],
        path=row["path"],
        state=EffectState(row["state"]),
        instance_id=row["instance_id"],
        created_at=float(row["created_at"]),
        deadline=float(row["deadline"]),
        finished_at=row["finished_at"],
        upstream_status=row["upstream_status"],
        reason=row["reason"],
        probe_attempts=int(row["probe_attempts"]),
        next_probe_at=row["next_probe_at"],
        settled_by=row["settled_by"],
    )


def response_meta(response: StoredResponse) -> str:
    """The `response_headers` column: the headers with the reason phrase and whether the
    body was kept (one JSON object; rows written before these were kept hold a list)."""
    # Written out as json.dumps writes this object, with its own string encoder: a
    # receipt writes one per committed write, and json.dumps took 3.7-4.0 µs against
    # 1.5 (tests/unit/test_response_meta.py holds the two to the same text).
    headers = ", ".join(
        f"[{encode_basestring_ascii(name)}, {encode_basestring_ascii(value)}]"
        for name, value in response.headers
    )
    reason = "null" if response.reason is None else encode_basestring_ascii(response.reason)
    kept = "true" if response.body_kept else "false"
    return f'{{"headers": [{headers}], "reason": {reason}, "body_kept": {kept}}}'


def stored_response(status: int, meta: str | None, body: bytes) -> StoredResponse:
    decoded = json.loads(meta or "[]")
    if isinstance(decoded, list):
        decoded = {"headers": decoded}
    headers = tuple((str(k), str(v)) for k, v in decoded["headers"])
    reason = decoded.get("reason")
    return StoredResponse(
        status,
        headers,
        body,
        reason=None if reason is None else str(reason),
        body_kept=bool(decoded.get("body_kept", True)),
    )
