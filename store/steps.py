"""One lifecycle event written to an effect, its key and its history: what
core/lifecycle.py's `plan` says, and nothing it does not.

A plan has two writers. `apply_event` writes any plan, statement by statement, inside
the caller's transaction. `write_in_one_statement` writes a receipt's plan as the
backend's `receipt` block, a transaction of one statement (on PostgreSQL the
fenceproxy_receipt function): what the request path pays for a receipt. Both take the
same `Plan`, and tests/integration/app/test_receipt_paths.py runs every receipt's plan
the lifecycle table can produce through both, on both backends, and compares the rows
they leave; the seeded simulation takes both at random."""

from __future__ import annotations

from dataclasses import dataclass

from core import lifecycle
from core.lifecycle import Event, Key, Plan, Transition
from core.records import EffectRecord, StoredResponse
from store.base import Connector, Row, StoreError, Tx
from store.reads import locked_effect
from store.rows import effect_record, response_meta
from store.types import DEFAULT_RETAIN_S

# The `receipt` block's columns, in order (store/schema/postgresql.sql's
# fenceproxy_receipt; SQLite's connector answers the same): read by position.
RECEIPT_COLUMNS = ("store_id", "now", "applied")
RECEIPT_NOW = RECEIPT_COLUMNS.index("now")
RECEIPT_APPLIED = RECEIPT_COLUMNS.index("applied")


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
    after = await _write_plan(tx, before, row, plan, kind, actor, upstream_status)
    return Step(plan.step, after, plan.moves, plan.key_holder)


async def _write_plan(
    tx: Tx,
    before: EffectRecord,
    row: Row,
    plan: Plan,
    kind: str,
    actor: str,
    upstream_status: int | None,
) -> EffectRecord:
    effect_id = before.id
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
    return after


def writes_in_one_statement(plan: Plan) -> bool:
    """Whether the `receipt` block writes this plan: a receipt's (the only events with
    an answer: the history row states the upstream status the effect's row does, and
    the time of writing is the effect's finished_at) that moves the effect, settled by
    nobody but its receipt, its key (if any) kept, freed or committed (a conflict's
    HOLD, and who holds the key then, need the long way). A receipt on an effect as its
    admission left it (DISPATCHING) always is."""
    return (
        plan.step.answer is not None
        and plan.moves
        and plan.settled_by is None
        and plan.key is not Key.HOLD
    )


async def write_in_one_statement(
    connector: Connector, before: EffectRecord, plan: Plan, kind: str, actor: str
) -> float | None:
    """Write `plan`, planned on `before`, as the `receipt` block: a write transaction of
    one statement that reads nothing back. The time it was written at; None when
    nothing was written: the backend has no such block, the effect is no longer in
    `before.state` (a sweep, an operator), or the plan frees a key another open effect
    under it still needs (`lifecycle.key_heir`). The caller then writes it with
    `apply_event`."""
    assert writes_in_one_statement(plan)
    kept = plan.response
    values = await connector.statement(
        "receipt",
        id=before.id,
        resource=before.resource,
        expected=before.state.value,
        state=plan.state.value,
        upstream_status=plan.upstream_status,
        reason=plan.reason,
        probe_now=plan.probe_now,
        key_action=plan.key.name.lower(),
        idempotency_key=before.idempotency_key,
        fingerprint=before.fingerprint,
        epoch=before.epoch,
        default_retain_s=DEFAULT_RETAIN_S,
        status=kept.status if kept else None,
        headers=response_meta(kept) if kept else None,
        body=kept.body if kept else None,
        key_settled_by=plan.key_settled_by,
        kind=kind,
        actor=actor,
        conclusion=plan.history,
    )
    if values is None or not values[RECEIPT_APPLIED]:
        return None
    return float(values[RECEIPT_NOW])


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
