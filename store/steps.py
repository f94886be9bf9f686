"""One lifecycle event written to an effect, its key and its history: what
core/lifecycle.py's `plan` says, and nothing it does not."""

from __future__ import annotations

from dataclasses import dataclass

from core import lifecycle
from core.lifecycle import Event, Key, Plan, Transition
from core.records import EffectRecord, StoredResponse
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
    """Write what core/lifecycle.py's `plan` says `event` does to the effect."""
    if row is None:
        row = await locked_effect(tx, effect_id)
        if row is None:
            return None
    before = effect_record(row)
    key_record_holder = None
    if lifecycle.asks_key_holder(before, event):
        holder = await tx.one(
            "idempotency_record", resource=before.resource, key=before.idempotency_key
        )
        key_record_holder = None if holder is None else str(holder["effect_id"])
    plan = lifecycle.plan(
        before,
        event,
        detail,
        upstream_status=upstream_status,
        response=response,
        settled_by=settled_by,
        conclusion=conclusion,
        key_record_holder=key_record_holder,
    )
    if plan is None:
        raise StoreError(f"{event.value} is not allowed on a {before.state.value} effect")
    after = plan.effect_after(before, tx.now)
    if plan.moves:
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
    await _write_key(tx, before, row, plan)
    if plan.history is not None:
        await insert_event(tx, effect_id, kind, actor, upstream_status, plan.history, plan.reason)
    return Step(plan.step, after, plan.moves, plan.key_holder)


async def _write_key(tx: Tx, effect: EffectRecord, row: Row, plan: Plan) -> None:
    if plan.key is Key.KEEP:
        return
    if plan.key is Key.FREE:
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
    if plan.key is Key.HOLD:
        await tx.execute("hold_idempotency_key", **where)
        return
    retain_s = row["retain_s"] if row["retain_s"] is not None else DEFAULT_RETAIN_S
    response = plan.response
    await tx.execute(
        "commit_idempotency_key",
        **where,
        expires_at=tx.now + float(retain_s),
        status=response.status if response else None,
        headers=response_meta(response) if response else None,
        body=response.body if response else None,
        settled_by=plan.key_settled_by,
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
