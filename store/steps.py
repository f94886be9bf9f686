"""One lifecycle event written to an effect, its key and its history, as
core/lifecycle.py's table says."""

from __future__ import annotations

from dataclasses import dataclass, replace

from core import lifecycle
from core.lifecycle import Event, Key, Record, Transition
from core.records import EffectRecord, EffectState, StoredResponse
from store.base import Row, StoreError, Tx
from store.reads import locked_effect
from store.rows import effect_record, response_meta
from store.types import DEFAULT_RETAIN_S


@dataclass(frozen=True)
class Step:
    transition: Transition
    effect: EffectRecord  # as it stands after the step
    moved: bool
    key_holder: str | None = None


async def apply_event(
    tx: Tx,
    effect_id: str,
    event: Event,
    kind: str,
    actor: str,
    detail: str,
    upstream_status: int | None = None,
    response: StoredResponse | None = None,
    settled_by: str | None = None,
    row: Row | None = None,
    conclusion: str | None = None,
) -> Step | None:
    """Apply one lifecycle event to an effect, as core/lifecycle.py's table says."""
    if row is None:
        row = await locked_effect(tx, effect_id)
        if row is None:
            return None
    before = effect_record(row)
    step = lifecycle.transition(before.state, event)
    if step is None:
        raise StoreError(f"{event.value} is not allowed on a {before.state.value} effect")
    receipt = event in lifecycle.RECEIPTS
    key_holder = None
    if step.key is Key.HOLD and before.idempotency_key is not None:
        holder = await tx.one(
            "idempotency_record", resource=before.resource, key=before.idempotency_key
        )
        if holder is not None and holder["effect_id"] != effect_id:
            key_holder = holder["effect_id"]
    if step.record is Record.LATE:
        detail = f"{detail} (the effect was already {before.state.value}; nothing changed)"
    elif step.record is Record.CONFLICT:
        detail = (
            f"conflicting evidence: {detail}; the effect was "
            f"{before.state.value} (settled by {before.settled_by or 'its receipt'})"
            + (f"; its key is now held by {key_holder}" if key_holder else "")
        )
    moved = step.next is not before.state
    after = before
    if moved:
        settles = step.next not in lifecycle.BLOCKING
        # What the guarded update writes, so the caller gets the effect without a re-read.
        after = replace(
            before,
            state=step.next,
            finished_at=tx.now if receipt or settles else before.finished_at,
            upstream_status=upstream_status if receipt else before.upstream_status,
            reason=detail,
            settled_by=settled_by if step.record is Record.SETTLED else before.settled_by,
            next_probe_at=tx.now if step.next is EffectState.UNKNOWN else None,
        )
        changed = await tx.execute(
            "transition_effect",
            id=effect_id,
            expected=before.state.value,
            state=after.state.value,
            finished_at=after.finished_at,
            upstream_status=after.upstream_status,
            reason=after.reason,
            settled_by=after.settled_by,
            next_probe_at=after.next_probe_at,
        )
        if changed != 1:
            raise StoreError(f"{effect_id} changed under its resource's lock; nothing recorded")
    await _apply_key(tx, before, row, step, response if step.store_response else None, settled_by)
    plain_receipt = (
        receipt and step.record is Record.SETTLED and step.next is not EffectState.UNKNOWN
    )
    if not plain_receipt and step.record is not Record.NOTHING:
        # The plain receipt is in the effect's row; everything else is history.
        if conclusion is None:
            conclusion = step.record.value
            if step.record is Record.SETTLED:
                inconclusive = event is Event.PROBE_INCONCLUSIVE
                conclusion = "inconclusive" if inconclusive else step.next.value.lower()
        await insert_event(tx, effect_id, kind, actor, upstream_status, conclusion, detail)
    return Step(step, after, moved, key_holder)


async def _apply_key(
    tx: Tx,
    effect: EffectRecord,
    row: Row,
    step: Transition,
    response: StoredResponse | None,
    settled_by: str | None,
) -> None:
    if effect.idempotency_key is None or step.key is Key.KEEP:
        return
    if step.key is Key.FREE:
        under_key = {
            str(r["id"]): r
            for r in await tx.all(
                "open_effects_under_key", resource=effect.resource, key=effect.idempotency_key
            )
        }
        heir = lifecycle.key_heir(effect.id, under_key)
        if heir is None:
            await tx.execute("free_idempotency_key", effect_id=effect.id)
        else:
            await tx.execute(
                "pass_idempotency_key",
                effect_id=effect.id,
                heir=heir,
                fingerprint=under_key[heir]["fingerprint"],
                epoch=under_key[heir]["epoch"],
            )
        return
    where = {
        "resource": effect.resource,
        "key": effect.idempotency_key,
        "fingerprint": effect.fingerprint,
        "effect_id": effect.id,
        "epoch": effect.epoch,
    }
    if step.key is Key.HOLD:
        await tx.execute("hold_idempotency_key", **where)
        return
    retain_s = row["retain_s"] if row["retain_s"] is not None else DEFAULT_RETAIN_S
    await tx.execute(
        "commit_idempotency_key",
        **where,
        expires_at=tx.now + float(retain_s),
        status=response.status if response else None,
        headers=response_meta(response) if response else None,
        body=response.body if response else None,
        # Who established it, when no response was ever seen to replay.
        settled_by=None if response else (settled_by or "receipt"),
    )


async def insert_event(
    tx: Tx,
    effect_id: str,
    kind: str,
    actor: str,
    upstream_status: int | None,
    conclusion: str,
    detail: str,
) -> None:
    await tx.execute(
        "insert_event",
        effect_id=effect_id,
        at=tx.now,
        kind=kind,
        actor=actor,
        upstream_status=upstream_status,
        conclusion=conclusion,
        detail=detail,
    )
