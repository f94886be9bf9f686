"""One effect record for the unit tests of the rules that look at a single effect."""

from __future__ import annotations

from core.records import EffectRecord, EffectState


def an_effect(state: EffectState, deadline: float) -> EffectRecord:
    """An order on supplier:widget, dispatched 5 s before `deadline`."""
    return EffectRecord(
        id="eff-1",
        route="place-order",
        resource="supplier:widget",
        holder="worker-1",
        epoch=3,
        idempotency_key="order-1",
        fingerprint="fp-1",
        method="POST",
        path="/orders/widget",
        state=state,
        instance_id="host:8080",
        created_at=deadline - 5.0,
        deadline=deadline,
        finished_at=None,
        upstream_status=None,
        reason=None,
    )
