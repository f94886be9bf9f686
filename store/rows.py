"""Rows of the backends' named queries → the records of core/records.py.

Both backends answer with the same column names (their SQL files share query names
and result shapes), so one set of mappers serves both.
"""

from __future__ import annotations

import json

from core.records import (
    EffectRecord,
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    OpenEffect,
    ResourceState,
    StoredResponse,
)
from store.base import Row


def lease_record(row: Row | None) -> LeaseRecord | None:
    if row is None:
        return None
    return LeaseRecord(
        resource=row["resource"],
        epoch=int(row["epoch"]),
        holder=row["holder"],
        granted_at=float(row["granted_at"]),
        expires_at=float(row["expires_at"]),
        ended_at=row["ended_at"],
        end_reason=row["end_reason"],
        client=row["client"],
    )


def resource_state(row: Row, resource: str) -> ResourceState:
    """The columns resource_state and admission_state share: the highest epoch issued
    (NULL or 0: never), the lease granted at it (NULL holder: none), the epoch floor, and
    `open_effects`, the resource's BLOCKING effects in admission order as a JSON array
    of [id, state, epoch, idempotency_key, fingerprint] (one column, not a query of its
    own: a round trip fewer)."""
    return ResourceState(
        resource=resource,
        epoch=int(row["epoch"] or 0),
        lease=lease_record({**row, "resource": resource}) if row["holder"] is not None else None,
        open_effects=tuple(
            OpenEffect(
                id=effect_id,
                state=EffectState(state),
                epoch=int(epoch),
                idempotency_key=key,
                fingerprint=fingerprint,
            )
            for effect_id, state, epoch, key, fingerprint in json.loads(row["open_effects"])
        ),
        epoch_floor=int(row["epoch_floor"] or 0),
    )


def idempotency_record(row: Row | None) -> IdempotencyRecord | None:
    if row is None:
        return None
    response = None
    if row["response_status"] is not None:
        response = stored_response(
            int(row["response_status"]), row["response_headers"], bytes(row["response_body"] or b"")
        )
    return IdempotencyRecord(
        resource=row["resource"],
        key=row["key"],
        fingerprint=row["fingerprint"],
        effect_id=row["effect_id"],
        effect_state=EffectState(row["effect_state"]),
        epoch=int(row["epoch"]),
        expires_at=float(row["expires_at"]) if row["expires_at"] is not None else None,
        response=response,
        settled_by=row["settled_by"],
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
    return json.dumps(
        {"headers": response.headers, "reason": response.reason, "body_kept": response.body_kept}
    )


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
