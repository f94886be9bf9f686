"""Fenced effects: admission (a token checked and an effect recorded in one
transaction) and receipts (a dispatch's outcome, as core/lifecycle.py says)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from core import fencing, lifecycle
from core.fencing import AdmissionRequest, Admit, Replay
from core.lifecycle import Event
from core.records import (
    EffectRecord,
    EffectState,
    Refusal,
    Rejection,
    StoredResponse,
)
from core.send_deadline import in_flight_until
from store.base import AdmissionInDoubt, CommitUnknown, StoreError, Tx
from store.leases import mark_came_back
from store.part import StorePart
from store.reads import ADMISSION_NOW, admission_records, lock_resource
from store.rows import effect_record
from store.steps import apply_event, write_in_one_statement, writes_in_one_statement
from store.types import CAME_BACK, Admitted, NewEffect, Receipt, UnknownKey


class Effects(StorePart):
    async def admit(
        self,
        token_hash: str,
        new: NewEffect,
        clients: fencing.Clients = None,
        key_cleared: bool = False,
        left: Callable[[AdmissionInDoubt], None] | None = None,
    ) -> Admitted | Replay | Refusal | UnknownKey:
        """Check the token (and, with `clients`, its client's standing: see `renew`) and
        record the effect as DISPATCHING, in one transaction. In the recovery window, a
        key the store does not know is `UnknownKey` unless `key_cleared`. `left` is told
        of an effect this admission recorded, or may have, after its caller stopped
        waiting (store/operation_queue.py): nobody will send it."""
        # Made before the transaction, so that an admission whose COMMIT's answer is lost
        # names the effect it may have recorded (an attempt the connector repeats after a
        # serialization failure was rolled back: its id was never stored).
        effect_id = _new_effect_id()
        caller_left = None
        if left is not None:

            def caller_left(ok: bool, decided: Any) -> None:
                if (ok and isinstance(decided, Admitted)) or isinstance(decided, CommitUnknown):
                    why = "its caller stopped waiting while its admission ran in a batch"
                    left(AdmissionInDoubt(why, effect_id, new.resource))

        try:
            decided = await self.connector.write(
                self._admission(token_hash, new, clients, key_cleared, effect_id),
                own_clock=True,
                resource=new.resource,
                left=caller_left,
            )
        except CommitUnknown as exc:
            raise AdmissionInDoubt(str(exc), effect_id, new.resource) from exc
        if isinstance(decided, _Refused):
            # Counted once the transaction is over: a retried one must not count twice.
            self.refusals.count(decided.rejection)
            if decided.came_back is not None:
                self._observe(decided.came_back, CAME_BACK)
            return decided.refusal
        return decided

    def _admission(
        self,
        token_hash: str,
        new: NewEffect,
        clients: fencing.Clients,
        key_cleared: bool,
        effect_id: str,
    ) -> Callable[[Tx], Coroutine[Any, Any, Admitted | Replay | Refusal | UnknownKey | _Refused]]:
        async def operation(tx: Tx) -> Admitted | Replay | Refusal | UnknownKey | _Refused:
            # One statement reads it all, under the resource's lock (a round trip
            # each is what a fenced request costs on PostgreSQL).
            values = await tx.values(
                "admission_state",
                token_hash=token_hash,
                resource=new.resource,
                key=new.idempotency_key,
            )
            assert values is not None  # the query always answers one row
            now = values[ADMISSION_NOW]
            if now is not None:  # the time once the lock was held
                tx.now = float(now)
            lease, state, existing = admission_records(values, new.resource, new.idempotency_key)
            request = AdmissionRequest(
                new.resource,
                new.idempotency_key,
                new.fingerprint,
                new.max_in_flight,
                new.upstream_timeout_s,
                new.upstream_idempotent,
            )
            decision = fencing.decide_admission(request, lease, state, existing, tx.now, clients)
            if isinstance(decision, Replay):
                return decision
            if isinstance(decision, Refusal):
                rejection = Rejection(
                    code=decision.code,
                    method=new.method,
                    path=new.path,
                    route=new.route,
                    resource=new.resource,
                    holder=lease.holder if lease else None,
                    epoch=lease.epoch if lease else None,
                    fingerprint=new.fingerprint,
                )
                # Only a token of this very resource: another's says nothing of its lease.
                came_back = None
                if state is not None:
                    came_back = await mark_came_back(tx, lease, decision.code)
                return _Refused(decision, rejection, came_back)
            assert isinstance(decision, Admit) and lease is not None
            window = self.recovery
            if (
                window is not None
                and new.idempotency_key is not None
                and existing is None
                and not key_cleared
            ):
                return UnknownKey(window)
            effect = EffectRecord(
                id=effect_id,
                route=new.route,
                resource=new.resource,
                holder=lease.holder,
                epoch=lease.epoch,
                idempotency_key=new.idempotency_key,
                fingerprint=new.fingerprint,
                method=new.method,
                path=new.path,
                state=EffectState.DISPATCHING,
                instance_id=self.instance_id,
                created_at=tx.now,
                deadline=in_flight_until(tx.now, new.send_window_s, new.upstream_timeout_s),
                finished_at=None,
                upstream_status=None,
                reason=None,
            )
            # A resend leaves the key with the operation in doubt it resends, so that
            # the resend's own failure to connect cannot free it.
            resending = existing is not None and existing.effect_id in decision.resends
            await tx.execute(
                "admit_effect",
                claim=new.idempotency_key is not None and not resending,
                id=effect.id,
                route=effect.route,
                resource=effect.resource,
                holder=effect.holder,
                epoch=effect.epoch,
                idempotency_key=effect.idempotency_key,
                fingerprint=effect.fingerprint,
                method=effect.method,
                path=effect.path,
                instance_id=effect.instance_id,
                created_at=effect.created_at,
                deadline=effect.deadline,
                retain_s=new.retain_s,
            )
            return Admitted(effect, decision.resends)

        return operation

    async def settle_unsent(
        self, effect_id: str, resource: str, reason: str
    ) -> EffectRecord | None:
        """After `AdmissionInDoubt`, when nothing was sent: the effect as it stands once
        settled NOT_SENT (a NOT_SENT receipt, which frees its key), or None if the
        admission did not commit. The resource's lock is taken first: the admission held
        it until its transaction ended, so on PostgreSQL this waits for a COMMIT still
        on its way to the old connection's backend to land or not, and None is final."""

        async def operation(tx: Tx) -> EffectRecord | None:
            await lock_resource(tx, resource)
            row = await tx.one("effect_for_update", id=effect_id)
            if row is None:
                return None
            step = await apply_event(
                tx, effect_id, Event.NOT_SENT, "dispatch", self.instance_id, reason, row=row
            )
            assert step is not None  # the row was read under the lock
            return step.effect

        return await self.connector.write(operation, resource=resource)

    async def finish_effect(
        self,
        effect_id: str,
        event: Event,
        upstream_status: int | None,
        reason: str,
        response: StoredResponse | None,
        resends: tuple[str, ...] = (),
        admitted: EffectRecord | None = None,
    ) -> Receipt:
        """Record a dispatch's receipt, as core/lifecycle.py says. A definite answer to a
        resend settles the effects in doubt it resent. `admitted`, the effect as its
        admission recorded it, lets the receipt be decided before the store is asked,
        and written in one statement if the effect is still as admitted."""
        assert event in lifecycle.RECEIPTS
        if admitted is not None and not resends:
            fast = await self._receipt_as_admitted(
                admitted, event, upstream_status, reason, response
            )
            if fast is not None:
                return fast

        async def operation(tx: Tx) -> Receipt:
            resent_as = lifecycle.RESENT_AS.get(event)
            if resent_as is not None:
                why = f"resent as {effect_id}, which the upstream answered {upstream_status}"
                for earlier in resends:
                    await apply_event(
                        tx,
                        earlier,
                        resent_as,
                        "resend",
                        self.instance_id,
                        why,
                        upstream_status,
                        settled_by=f"resend:{effect_id}",
                    )
            row = None
            if admitted is not None:
                # Its resource is known: lock it and read the effect once, not twice.
                await lock_resource(tx, admitted.resource)
                row = await tx.one("effect_for_update", id=effect_id)
            step = None
            if admitted is None or row is not None:
                step = await apply_event(
                    tx,
                    effect_id,
                    event,
                    "dispatch",
                    self.instance_id,
                    reason,
                    upstream_status,
                    response,
                    row=row,
                )
            if step is None:
                # Only retention deletes effects, and only long-settled ones: this receipt
                # comes from a proxy that stalled for longer than effects_days.
                raise StoreError(f"{effect_id} is no longer in the store (retention deleted it)")
            assert step.transition is not None
            return Receipt(step.transition, step.effect, step.key_holder)

        locks = admitted.resource if admitted is not None else None
        return await self.connector.write(operation, resource=locks)

    async def _receipt_as_admitted(
        self,
        admitted: EffectRecord,
        event: Event,
        upstream_status: int | None,
        reason: str,
        response: StoredResponse | None,
    ) -> Receipt | None:
        """The receipt's plan (core/lifecycle.py) on the effect as admitted, written in one
        statement (store/steps.py `write_in_one_statement`); None if nothing was written:
        the plan is not one that statement writes, or it did not write it."""
        plan = lifecycle.plan(
            admitted, event, reason, upstream_status=upstream_status, response=response
        )
        if plan is None or not writes_in_one_statement(plan):
            return None
        now = await write_in_one_statement(
            self.connector, admitted, plan, "dispatch", self.instance_id
        )
        if now is None:
            return None
        return Receipt(plan.step, plan.effect_after(admitted, now))

    async def effect(self, effect_id: str) -> EffectRecord | None:
        async def operation(tx: Tx) -> EffectRecord | None:
            row = await tx.one("effect", id=effect_id)
            return effect_record(row) if row else None

        return await self.connector.read(operation)

    async def effects(
        self, resource: str | None = None, state: str | None = None, limit: int = 100
    ) -> list[EffectRecord]:
        # One query per filter, so that each reads one index range (see the SQL files).
        if resource is not None:
            query, params = "effects_of_resource", {"resource": resource, "state": state}
        elif state is None:
            query, params = "effects", {}
        elif state in {s.value for s in lifecycle.BLOCKING}:
            query, params = "in_doubt_effects_in_state", {"state": state}
        else:
            query, params = "effects_in_state", {"state": state}

        async def operation(tx: Tx) -> list[EffectRecord]:
            return [effect_record(row) for row in await tx.all(query, **params, limit=limit)]

        return await self.connector.read(operation)


def _new_effect_id() -> str:
    """Time first, so ids sort by creation and index inserts land on the B-tree's edge."""
    return f"eff_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


@dataclass(frozen=True)
class _Refused:
    """An admission refused: the refusal to count once its transaction is over, and
    the resource whose holder it proved back after its lease expired, if newly so."""

    refusal: Refusal
    rejection: Rejection
    came_back: str | None
