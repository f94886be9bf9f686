"""Domain operations on the authority's records.

Each public method is one transaction: load records with named queries, ask a
pure decision in `core.fencing` or a step of `core.lifecycle`'s table, write what
it decided, checking that every guarded update changed the row it was decided on. Nothing here knows
which database answers.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from core import fencing, lifecycle
from core.codes import ErrorCode
from core.fencing import AdmissionRequest, Admit, Grant, LiveLeases, Replay
from core.leasing_advice import Ending, LeaseLife, holder_came_back
from core.lifecycle import Event, Key, Record, Transition
from core.probing import check_resolvable
from core.records import (
    EffectEvent,
    EffectRecord,
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    OpenEffect,
    Refusal,
    Rejection,
    ResourceState,
    StoredResponse,
)
from policies.model import Retention
from store.base import Connector, Row, StoreError, Tx
from store.history import RecoveryWindow, Replication, replication_of
from store.refusals import RefusalRecord
from store.rows import effect_record, idempotency_record, lease_record, response_meta

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewEffect:
    """What the proxy knows of a mutation before it asks to forward it."""

    route: str
    resource: str
    idempotency_key: str | None
    fingerprint: str
    method: str
    path: str
    max_in_flight: int
    upstream_timeout_s: float
    retain_s: float
    upstream_idempotent: bool = False


@dataclass(frozen=True)
class Admitted:
    effect: EffectRecord
    resends: tuple[str, ...] = ()


@dataclass(frozen=True)
class UnknownKey:
    """In the recovery window (store/history.py): the admission would forward a key the
    store does not know, which the old primary may have applied. Nothing was recorded;
    admit again with `key_cleared` once the upstream says it has not seen the key."""

    window: RecoveryWindow


@dataclass(frozen=True)
class Receipt:
    """What recording a dispatch's outcome did: the lifecycle step taken, and the
    effect as it stands after it (the worker's answer follows from both)."""

    transition: Transition
    effect: EffectRecord
    # Another effect that holds the operation's key now (named in a conflict).
    key_holder: str | None = None


@dataclass(frozen=True)
class LeaseView:
    resource: str
    epoch: int
    holder: str | None
    expires_at: float | None
    live: bool
    blocked: bool
    in_doubt: tuple[str, ...]
    client: str | None = None
    # What the next acquire or revoke gets: above `epoch`, and after fence-restore above
    # the floor too, so a resource never leased shows epoch 0 yet starts above the floor.
    next_epoch: int = 1

    def as_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "epoch": self.epoch,
            "next_epoch": self.next_epoch,
            "holder": self.holder,
            "client": self.client,
            "expires_at": self.expires_at,
            "live": self.live,
            "blocked": self.blocked,
            "in_doubt": list(self.in_doubt),
        }


@dataclass(frozen=True)
class Purged:
    """What one retention pass deleted."""

    effects: int
    rejections: int
    leases: int = 0
    resources: int = 0

    def full(self, batch: int) -> bool:
        """A full batch of any kind: there may be more to delete right away."""
        return max(self.effects, self.rejections, self.leases, self.resources) >= batch

    def __add__(self, other: Purged) -> Purged:
        return Purged(
            self.effects + other.effects,
            self.rejections + other.rejections,
            self.leases + other.leases,
            self.resources + other.resources,
        )

    def __bool__(self) -> bool:
        return any((self.effects, self.rejections, self.leases, self.resources))


@dataclass(frozen=True)
class StoreIdentity:
    """Who the store is: a random id created with its schema, when (by the store's
    clock), and when `store fence-restore` last advanced every epoch (None: never)."""

    store_id: str
    created_at: float
    fenced_at: float | None


# Effects admitted before retention ran from settlement did not record their route's.
DEFAULT_RETAIN_S = 86400.0
# What one lease-advice read takes at most of each (the newest): bounded whatever the
# store holds, and plenty for percentiles.
MAX_ADVICE_ROWS = 100_000
# How many replicas the status page lists: far more than any deployment runs.
MAX_REPLICAS = 100

# Told, once its transaction committed, how a lease ended (an Ending, or "came_back":
# its holder showed it was alive after the lease expired), with the turn's length for
# a release: the proxy's metrics (proxy/metrics.py) count them.
LeaseObserver = Callable[[str, str, float | None], None]
CAME_BACK = "came_back"


@dataclass(frozen=True)
class LeaseLives:
    """What lease-advice reads, as of one moment of the store's clock."""

    lives: tuple[LeaseLife, ...]
    latencies: tuple[tuple[str, float], ...]  # (route, admission to receipt, seconds)
    now: float


class Store:
    def __init__(self, connector: Connector, instance_id: str) -> None:
        self.connector = connector
        self.instance_id = instance_id
        # Every refusal is counted there and written by flush_refusal_counts.
        self.refusals = RefusalRecord(connector, instance_id)
        self.lease_observer: LeaseObserver | None = None

    def _observe(self, resource: str, how: str, turn_s: float | None = None) -> None:
        if self.lease_observer is not None:
            self.lease_observer(resource, how, turn_s)

    async def open(self) -> None:
        await self.connector.open()

    async def close(self) -> None:
        try:
            await self.flush_refusal_counts()
        except StoreError:
            log.warning("refusals counted since the last write are lost: the store failed")
        await self.connector.close()

    # -- leases ---------------------------------------------------------------

    async def acquire(
        self,
        resource: str,
        holder: str,
        ttl_s: float,
        token_hash: str,
        max_live_leases: int = 0,
        client: str | None = None,
    ) -> tuple[LeaseRecord, float] | Refusal:
        """Grant a new lease at a higher epoch; returns it with the transaction's clock.
        `max_live_leases` caps the live leases of the holder (0: no cap); `client` is
        the authenticated client taking it (None without `auth:`)."""

        superseded = False

        async def operation(tx: Tx) -> tuple[LeaseRecord, float] | Refusal:
            nonlocal superseded
            state = await _resource_state(tx, resource, lock=True)
            live = None
            if max_live_leases > 0:
                live = await _live_leases(tx, holder, client, max_live_leases)
            decision = fencing.decide_acquire(state, ttl_s, tx.now, live)
            if isinstance(decision, Refusal):
                return decision
            # A grant over a lease nobody ended: it expired, and is taken over now.
            superseded = state.current_lease() is not None
            if superseded:
                await tx.execute(
                    "end_lease",
                    resource=resource,
                    epoch=state.epoch,
                    ended_at=tx.now,
                    end_reason=Ending.SUPERSEDED,
                )
            await _grant(tx, resource, holder, token_hash, decision, ttl_s, client)
            lease = LeaseRecord(
                resource, decision.epoch, holder, tx.now, decision.expires_at, None, None, client
            )
            return lease, tx.now

        granted = await self.connector.write(operation)
        if superseded and not isinstance(granted, Refusal):
            self._observe(resource, Ending.SUPERSEDED)
        return granted

    async def renew(
        self, token_hash: str, ttl_s: float, clients: fencing.Clients = None
    ) -> tuple[LeaseRecord, float] | Refusal:
        """`clients`: the clients configured now (fencing.check_standing); None, the
        policy has no `auth:` block."""
        came_back: str | None = None

        async def operation(tx: Tx) -> tuple[LeaseRecord, float] | Refusal:
            nonlocal came_back
            came_back = None  # a retried transaction decides afresh
            lease, state = await _lease_and_state(tx, token_hash)
            refusal = fencing.decide_renew(lease, state, tx.now, clients)
            if refusal is not None:
                came_back = await _mark_came_back(tx, lease, refusal.code)
                return refusal
            assert lease is not None
            expires_at = tx.now + ttl_s
            await tx.execute(
                "extend_lease",
                resource=lease.resource,
                epoch=lease.epoch,
                expires_at=expires_at,
                ttl_s=ttl_s,
            )
            renewed = replace(lease, expires_at=expires_at, ended_at=None, end_reason=None)
            return renewed, tx.now

        renewed = await self.connector.write(operation)
        if came_back is not None:
            self._observe(came_back, CAME_BACK)
        return renewed

    async def release(self, token_hash: str) -> LeaseRecord | Refusal:
        """End the lease; the record returned has its ended_at (the turn's end)."""
        came_back: str | None = None

        async def operation(tx: Tx) -> LeaseRecord | Refusal:
            nonlocal came_back
            came_back = None  # a retried transaction decides afresh
            lease, state = await _lease_and_state(tx, token_hash)
            refusal = fencing.decide_release(lease, state, tx.now)
            if refusal is not None:
                came_back = await _mark_came_back(tx, lease, refusal.code)
                return refusal
            assert lease is not None
            await tx.execute(
                "end_lease",
                resource=lease.resource,
                epoch=lease.epoch,
                ended_at=tx.now,
                end_reason=Ending.RELEASED,
            )
            # Released after it expired (allowed, to tidy up): its holder was alive.
            came_back = await _mark_came_back(tx, lease, ErrorCode.LEASE_EXPIRED)
            return replace(lease, ended_at=tx.now, end_reason=Ending.RELEASED)

        released = await self.connector.write(operation)
        if not isinstance(released, Refusal):
            assert released.ended_at is not None
            self._observe(
                released.resource, Ending.RELEASED, released.ended_at - released.granted_at
            )
        if came_back is not None:
            self._observe(came_back, CAME_BACK)
        return released

    async def revoke(self, resource: str, reason: str, actor: str | None = None) -> tuple[int, int]:
        """Advance the epoch now; returns (old epoch, new epoch). `actor`, who asked, is
        kept in the ended lease's reason."""
        why = f"revoked by {actor}: {reason}" if actor else f"revoked: {reason}"

        ended = False

        async def operation(tx: Tx) -> tuple[int, int]:
            nonlocal ended
            state = await _resource_state(tx, resource, lock=True)
            ended = state.current_lease() is not None
            if ended:
                await tx.execute(
                    "end_lease",
                    resource=resource,
                    epoch=state.epoch,
                    ended_at=tx.now,
                    end_reason=why,
                )
            advanced = state.next_epoch()
            await tx.execute("set_resource_epoch", resource=resource, epoch=advanced)
            return state.epoch, advanced

        old, new = await self.connector.write(operation)
        if ended:
            self._observe(resource, Ending.REVOKED)
        return old, new

    async def lease_lives(self, since_s: float | None) -> LeaseLives:
        """The leases granted, and the fenced effects created, in the last `since_s`
        seconds of the store's clock (None: all), at most MAX_ADVICE_ROWS of each."""

        async def operation(tx: Tx) -> LeaseLives:
            since = tx.now - since_s if since_s is not None else float("-inf")
            # -inf is not a parameter every driver takes; 0 is before any record.
            since = max(since, 0.0)
            rows = await tx.all("lease_lives", since=since, limit=MAX_ADVICE_ROWS)
            effects = await tx.all("route_latencies", since=since, limit=MAX_ADVICE_ROWS)
            return LeaseLives(
                tuple(
                    LeaseLife(
                        resource=row["resource"],
                        epoch=int(row["epoch"]),
                        granted_at=float(row["granted_at"]),
                        expires_at=float(row["expires_at"]),
                        ended_at=_float_or_none(row["ended_at"]),
                        end_reason=row["end_reason"],
                        granted_ttl_s=_float_or_none(row["granted_ttl_s"]),
                        renewals=int(row["renewals"]),
                        came_back_at=_float_or_none(row["came_back_at"]),
                    )
                    for row in rows
                ),
                tuple((str(row["route"]), float(row["seconds"])) for row in effects),
                tx.now,
            )

        return await self.connector.read(operation)

    async def lease_view(self, resource: str) -> LeaseView:
        async def operation(tx: Tx) -> LeaseView:
            state = await _resource_state(tx, resource, lock=False)
            current = state.current_lease()
            return LeaseView(
                resource=resource,
                epoch=state.epoch,
                holder=current.holder if current else None,
                client=current.client if current else None,
                expires_at=current.expires_at if current else None,
                live=bool(current and current.live(tx.now)),
                blocked=bool(state.blocking()),
                in_doubt=state.blocking(),
                next_epoch=state.next_epoch(),
            )

        return await self.connector.read(operation)

    async def lease_of_token(self, token_hash: str) -> LeaseRecord | None:
        """The lease a token was issued for, current or ended long ago; None for a token
        never issued here (or whose lease retention has deleted)."""

        async def operation(tx: Tx) -> LeaseRecord | None:
            return lease_record(await tx.one("lease_by_token", token_hash=token_hash))

        return await self.connector.read(operation)

    # -- effects --------------------------------------------------------------

    async def admit(
        self,
        token_hash: str,
        new: NewEffect,
        clients: fencing.Clients = None,
        key_cleared: bool = False,
    ) -> Admitted | Replay | Refusal | UnknownKey:
        """Check the token (and, with `clients`, its client's standing: see `renew`) and
        record the effect as DISPATCHING, in one transaction. In the recovery window, a
        key the store does not know is `UnknownKey` unless `key_cleared`."""
        decided = await self.connector.write(
            self._admission(token_hash, new, clients, key_cleared), own_clock=True
        )
        if isinstance(decided, _Refused):
            # Counted once the transaction is over: a retried one must not count twice.
            self.refusals.count(decided.rejection)
            if decided.came_back is not None:
                self._observe(decided.came_back, CAME_BACK)
            return decided.refusal
        return decided

    def _admission(
        self, token_hash: str, new: NewEffect, clients: fencing.Clients, key_cleared: bool
    ) -> Callable[[Tx], Coroutine[Any, Any, Admitted | Replay | Refusal | UnknownKey | _Refused]]:
        async def operation(tx: Tx) -> Admitted | Replay | Refusal | UnknownKey | _Refused:
            # One statement reads it all, under the resource's lock (a round trip
            # each is what a fenced request costs on PostgreSQL).
            row = await tx.one(
                "admission_state",
                token_hash=token_hash,
                resource=new.resource,
                key=new.idempotency_key,
            )
            assert row is not None  # the query always answers one row
            if row["now"] is not None:  # the time once the lock was held
                tx.now = float(row["now"])
            lease, state, existing = _admission_records(row, new.resource, new.idempotency_key)
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
                    came_back = await _mark_came_back(tx, lease, decision.code)
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
                id=_new_effect_id(),
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
                deadline=tx.now + new.upstream_timeout_s,
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
            resent_as = {
                Event.ANSWERED_COMMITTED: Event.RESEND_COMMITTED,
                Event.ANSWERED_NOT_COMMITTED: Event.RESEND_NOT_COMMITTED,
            }.get(event)
            if resent_as is not None:
                why = f"resent as {effect_id}, which the upstream answered {upstream_status}"
                for earlier in resends:
                    await _apply(
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
                await _lock_resource(tx, admitted.resource)
                row = await tx.one("effect_for_update", id=effect_id)
            step = None
            if admitted is None or row is not None:
                step = await _apply(
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

        return await self.connector.write(operation)

    async def _receipt_as_admitted(
        self,
        admitted: EffectRecord,
        event: Event,
        upstream_status: int | None,
        reason: str,
        response: StoredResponse | None,
    ) -> Receipt | None:
        """The receipt as _apply would record it on the effect as admitted, as one
        statement (the `receipt` block); None if the backend has no such block, the
        effect had moved on (a sweep, an operator), or the receipt frees a key another
        effect under it still needs (`lifecycle.key_heir`): then nothing was written."""
        step = lifecycle.transition(admitted.state, event)
        # A settled step is the only kind a receipt takes on an effect as admitted
        # (DISPATCHING); anything else, the long way, which knows every kind.
        if step is None or step.record is not Record.SETTLED or step.key is Key.HOLD:
            return None
        has_key = admitted.idempotency_key is not None
        kept = response if step.store_response else None
        plain = step.next is not EffectState.UNKNOWN
        row = await self.connector.statement(
            "receipt",
            id=admitted.id,
            resource=admitted.resource,
            expected=admitted.state.value,
            state=step.next.value,
            upstream_status=upstream_status,
            reason=reason,
            probe_now=step.next is EffectState.UNKNOWN,
            key_action=step.key.name.lower() if has_key else "keep",
            idempotency_key=admitted.idempotency_key,
            fingerprint=admitted.fingerprint,
            epoch=admitted.epoch,
            default_retain_s=DEFAULT_RETAIN_S,
            status=kept.status if kept else None,
            headers=response_meta(kept) if kept else None,
            body=kept.body if kept else None,
            key_settled_by=None if kept else "receipt",
            kind="dispatch",
            actor=self.instance_id,
            # The plain receipt is in the effect's row; an UNKNOWN one is history.
            conclusion=None if plain else step.next.value.lower(),
        )
        if row is None or not row["applied"]:
            return None
        now = float(row["now"])
        after = replace(
            admitted,
            state=step.next,
            finished_at=now,
            upstream_status=upstream_status,
            reason=reason,
            next_probe_at=now if step.next is EffectState.UNKNOWN else None,
        )
        return Receipt(step, after)

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

    # -- effects in doubt -----------------------------------------------------

    async def recover(self, instance_id: str | None, margin_s: float) -> list[str]:
        """Turn DISPATCHING effects that can no longer be in flight into UNKNOWN.

        Any instance's more than `margin_s` past its deadline, and, at start, all of
        `instance_id`'s (a restart means its requests' fates were lost with the old
        process). Another live replica's in-flight requests are left alone.
        """

        async def candidates(tx: Tx) -> dict[str, Event]:
            found = {
                row["id"]: Event.PAST_DEADLINE
                for row in await tx.all("overdue_dispatching_effects", cutoff=tx.now - margin_s)
            }
            if instance_id is not None:
                own = await tx.all("dispatching_effects_of_instance", instance_id=instance_id)
                found.update({row["id"]: Event.RESTARTED for row in own})
            return found

        why = {
            Event.PAST_DEADLINE: "past its deadline with no receipt",
            Event.RESTARTED: "the proxy restarted while it was in flight",
        }
        marked = []
        for effect_id, event in sorted((await self.connector.read(candidates)).items()):
            # One transaction each, under the resource's lock: the effect's own receipt
            # or another replica's sweep may get there first, and then this one only
            # writes the audit trail.
            async def mark(tx: Tx, effect_id: str = effect_id, event: Event = event) -> bool:
                row = await _locked_effect(tx, effect_id, skip_locked=True)
                if row is None:
                    return False
                step = await _apply(
                    tx, effect_id, event, "recover", self.instance_id, why[event], row=row
                )
                return step is not None and step.moved

            if await self.connector.write(mark):
                marked.append(effect_id)
        return marked

    async def in_doubt(self, limit: int = 1000) -> list[EffectRecord]:
        async def operation(tx: Tx) -> list[EffectRecord]:
            return [effect_record(row) for row in await tx.all("in_doubt_effects", limit=limit)]

        return await self.connector.read(operation)

    async def effect_with_events(
        self, effect_id: str
    ) -> tuple[EffectRecord | None, list[EffectEvent]]:
        """An effect and every decision about it, as of one moment."""

        async def operation(tx: Tx) -> tuple[EffectRecord | None, list[EffectEvent]]:
            row = await tx.one("effect", id=effect_id)
            if row is None:
                return None, []
            events = await tx.all("effect_events", effect_id=effect_id)
            return effect_record(row), [EffectEvent(**event) for event in events]

        return await self.connector.read(operation)

    async def claim_due_probes(self, limit: int, claim_s: float) -> list[EffectRecord]:
        """UNKNOWN effects due for a probe, claimed so that one prober at a time works on each."""

        async def operation(tx: Tx) -> list[EffectRecord]:
            claimed = []
            for row in await tx.all("due_probes", now=tx.now, limit=limit):
                taken = await tx.execute(
                    "claim_probe",
                    id=row["id"],
                    instance_id=self.instance_id,
                    until=tx.now + claim_s,
                    now=tx.now,
                )
                if taken:
                    claimed.append(effect_record(row))
            return claimed

        return await self.connector.write(operation)

    async def record_probe(
        self,
        effect_id: str,
        event: Event,
        upstream_status: int | None,
        detail: str,
        next_probe_at: float | None,
        counted: bool = True,
        conclusion: str | None = None,
        actor: str | None = None,
    ) -> EffectRecord | None:
        """Record one probe answer as core/lifecycle.py says; an inconclusive one keeps
        the effect UNKNOWN and schedules the next attempt (None: attempts used up).
        `actor` is who asked for the probe (None: this instance, on its schedule)."""
        prober = actor or self.instance_id

        async def operation(tx: Tx) -> EffectRecord | None:
            row = await _locked_effect(tx, effect_id)
            if row is None:
                return None
            inconclusive = event is Event.PROBE_INCONCLUSIVE
            gave_up = False
            if row["state"] == EffectState.UNKNOWN:
                await tx.execute(
                    "record_probe_attempt",
                    id=effect_id,
                    next_probe_at=next_probe_at if inconclusive else None,
                    counted=1 if counted else 0,
                )
                gave_up = inconclusive and counted and next_probe_at is None
                row = await _effect_row(tx, effect_id)
            step = await _apply(
                tx,
                effect_id,
                event,
                "probe",
                prober,
                detail,
                upstream_status,
                settled_by="probe",
                row=row,
                conclusion=conclusion,
            )
            assert step is not None
            if gave_up:
                await _insert_event(
                    tx,
                    effect_id,
                    "probe",
                    prober,
                    None,
                    "gave_up",
                    "no probe attempts left; an operator must resolve this effect",
                )
            return step.effect

        return await self.connector.write(operation)

    async def resolve(
        self, effect_id: str, outcome: EffectState, reason: str, operator: str
    ) -> EffectRecord | Refusal:
        """An operator's decision on an effect in doubt, recorded with who and why."""
        event = {
            EffectState.COMMITTED: Event.OPERATOR_COMMITTED,
            EffectState.NOT_COMMITTED: Event.OPERATOR_NOT_COMMITTED,
        }[outcome]

        async def operation(tx: Tx) -> EffectRecord | Refusal:
            row = await _locked_effect(tx, effect_id)
            if row is None:
                return Refusal("not_found", f"no effect {effect_id}", {"effect_id": effect_id})
            refusal = check_resolvable(effect_record(row), tx.now)
            if refusal is not None:
                return refusal
            actor = f"operator:{operator}"
            step = await _apply(
                tx, effect_id, event, "resolve", actor, reason, settled_by=actor, row=row
            )
            assert step is not None
            return step.effect

        return await self.connector.write(operation)

    async def counts(self) -> tuple[dict[str, int], int, float]:
        """Effects in doubt by state (DISPATCHING, UNKNOWN, CONFLICTING: never the settled
        history, which would mean reading all of it), blocked resources, and the age of
        the oldest in-doubt effect."""

        async def operation(tx: Tx) -> tuple[dict[str, int], int, float]:
            rows = await tx.all("count_in_doubt_effects_by_state")
            by_state = {r["state"]: int(r["n"]) for r in rows}
            blocked = await tx.one("blocked_resources")
            oldest = await tx.one("oldest_in_doubt")
            started = oldest["oldest"] if oldest else None
            return (
                by_state,
                int(blocked["n"]) if blocked else 0,
                max(0.0, tx.now - started) if started is not None else 0.0,
            )

        return await self.connector.read(operation)

    # -- refusals and housekeeping -------------------------------------------

    async def record_rejection(self, rejection: Rejection) -> None:
        """Count a refusal on the record (store/refusals.py): no I/O until the next
        flush_refusal_counts."""
        self.refusals.count(rejection)

    async def flush_refusal_counts(self) -> int:
        """Write the refusals counted since the last flush (and a batch an earlier
        flush may not have written), a transaction a batch; how many kinds were
        written. Their first and last time seen are the flush's, so they are as exact
        as the flushes are frequent. A flush that failed or was cancelled leaves its
        counts for the next, which never writes them twice."""
        return await self.refusals.flush()

    async def rejections(self, resource: str | None = None, limit: int = 100) -> list[Rejection]:
        """Newest first: the refusals on record, all of them or those of `resource`,
        each kind with its count and first and last time seen."""
        return await self.refusals.listing(resource, limit)

    async def collect_garbage(self) -> int:
        """Delete idempotency records past their retention whose effect is settled."""

        async def operation(tx: Tx) -> int:
            lock = await tx.one("gc_lock")
            if not (lock and lock["acquired"]):
                return 0  # another replica is collecting right now
            return await tx.execute("expired_idempotency_records", now=tx.now)

        return await self.connector.write(operation)

    async def apply_retention(self, retention: Retention) -> Purged:
        """One bounded pass of retention, in one transaction: at most `batch` settled
        effects that settled more than `effects_s` ago (with their history and expired
        idempotency records; never one in doubt or conflicting, never one a retained key
        points to, nor one whose key an open effect under it still needs), at most
        `batch` rejections older than `rejections_s`, at most `batch` leases that
        expired more than `leases_s` ago, and, of at most `batch` resource rows, those
        nothing refers to any more (`_collect_resources`). 0 keeps forever. One replica
        at a time; the others' passes delete nothing."""

        async def operation(tx: Tx) -> Purged:
            lock = await tx.one("retention_lock")
            if not (lock and lock["acquired"]):
                return Purged(0, 0)
            effects = rejections = 0
            if retention.effects_s > 0:
                picked = await tx.all(
                    "expired_effects",
                    horizon=tx.now - retention.effects_s,
                    now=tx.now,
                    limit=retention.batch,
                )
                if picked:
                    ids = json.dumps([row["id"] for row in picked])
                    await tx.execute("delete_events_of_effects", ids=ids)
                    await tx.execute("delete_keys_of_effects", ids=ids, now=tx.now)
                    effects = await tx.execute("delete_effects", ids=ids)
            if retention.rejections_s > 0:
                # Kinds of refusal not seen since the horizon.
                rejections = await tx.execute(
                    "delete_expired_refusals",
                    horizon=tx.now - retention.rejections_s,
                    limit=retention.batch,
                )
                await tx.execute(
                    "delete_expired_refusal_batches", horizon=tx.now - retention.rejections_s
                )
            leases = resources = 0
            if retention.leases_s > 0:
                ended = await tx.all(
                    "delete_expired_leases",
                    horizon=tx.now - retention.leases_s,
                    limit=retention.batch,
                )
                leases = len(ended)
                resources = await _collect_resources(
                    tx, {row["resource"] for row in ended}, retention.batch
                )
            return Purged(effects, rejections, leases, resources)

        return await self.connector.write(operation)

    async def fence_restore(self, advance: int) -> int:
        """After a restore from backup: raise every epoch (and the floor under new
        resources) by `advance` past the highest the backup knows, and end every lease,
        so nothing issued since the backup is ever issued again. Returns the new floor."""

        async def operation(tx: Tx) -> int:
            await tx.execute("lock_all_resources")
            row = await tx.one("epoch_floor_and_max")
            assert row is not None
            floor = max(int(row["epoch_floor"]), int(row["max_epoch"])) + advance
            await tx.execute("set_epoch_floor", floor=floor)
            await tx.execute("advance_all_epochs", floor=floor)
            await tx.execute("end_all_leases", now=tx.now, reason="fence-restore")
            # A proxy that remembers another store accepts this one once it was fenced
            # after the proxy last started (proxy/identity.py).
            await tx.execute("mark_fenced", now=tx.now)
            return floor

        return await self.connector.write(operation)

    @property
    def recovery(self) -> RecoveryWindow | None:
        """The recovery window after lost history (store/history.py), as last read: on
        every new connection to the store, and by `refresh_recovery`."""
        return self.connector.recovery

    @property
    def replication(self) -> Replication | None:
        """What the PostgreSQL primary said of its standbys when last asked (None on
        SQLite): on every new connection, and by `refresh_recovery`."""
        return self.connector.replication

    async def refresh_recovery(self) -> RecoveryWindow | None:
        """Read the recovery window again (another replica's operator may have closed
        it), and the replication state with it."""

        async def operation(tx: Tx) -> tuple[RecoveryWindow | None, Replication | None]:
            row = await tx.one("recovery_window")
            assert row is not None
            opened = row["recovery_opened_at"]
            window = None
            if opened is not None:
                window = RecoveryWindow(float(opened), str(row["recovery_reason"]))
            return window, replication_of(row)

        self.connector.recovery, self.connector.replication = await self.connector.read(operation)
        return self.connector.recovery

    async def close_recovery(self) -> bool:
        """Close the recovery window (an operator's decision: every key the store does
        not know is new again); False if none was open."""

        async def operation(tx: Tx) -> bool:
            return await tx.execute("close_recovery_window") > 0

        closed = await self.connector.write(operation)
        self.connector.recovery = None
        return closed

    async def now(self) -> float:
        """The authority's clock: lease expiry and settle windows are judged by it."""

        async def operation(tx: Tx) -> float:
            return tx.now

        return await self.connector.read(operation)

    async def identity(self) -> StoreIdentity:
        async def operation(tx: Tx) -> StoreIdentity:
            row = await tx.one("store_identity")
            assert row is not None  # created by the schema's migration
            fenced_at = row["fenced_at"]
            return StoreIdentity(
                str(row["store_id"]),
                float(row["created_at"]),
                None if fenced_at is None else float(fenced_at),
            )

        return await self.connector.read(operation)

    async def heartbeat(self) -> float:
        """Write one small row: proves that the store takes durable writes now (a read
        succeeds on a full disk or a read-only file). Returns the store's clock."""

        async def operation(tx: Tx) -> float:
            await tx.execute("heartbeat", instance_id=self.instance_id, now=tx.now)
            return tx.now

        return await self.connector.write(operation)

    async def ping(self) -> None:
        async def operation(tx: Tx) -> None:
            await tx.one("ping")

        await self.connector.read(operation)

    # -- the status page (issue 12) ------------------------------------------

    async def record_replica(
        self, version: str, up_s: float, sweep_age_s: float | None, probe_age_s: float | None
    ) -> None:
        """This instance's row in `replicas`, seen now by the store's clock; the other
        instants are given as ages, so they land on the same clock."""

        async def operation(tx: Tx) -> None:
            def ago(age_s: float | None) -> float | None:
                return None if age_s is None else tx.now - age_s

            await tx.execute(
                "record_replica",
                instance_id=self.instance_id,
                version=version,
                started_at=tx.now - up_s,
                now=tx.now,
                last_sweep_at=ago(sweep_age_s),
                last_probe_at=ago(probe_age_s),
            )

        await self.connector.write(operation)

    async def replicas(self, within_s: float, limit: int = MAX_REPLICAS) -> tuple[Replica, ...]:
        """The instances that wrote their row in the last `within_s` seconds."""

        async def operation(tx: Tx) -> tuple[Replica, ...]:
            rows = await tx.all("replicas_seen", since=tx.now - within_s, limit=limit)
            return tuple(
                Replica(
                    instance_id=str(row["instance_id"]),
                    version=str(row["version"]),
                    started_at=float(row["started_at"]),
                    seen_at=float(row["seen_at"]),
                    last_sweep_at=_float_or_none(row["last_sweep_at"]),
                    last_probe_at=_float_or_none(row["last_probe_at"]),
                )
                for row in rows
            )

        return await self.connector.read(operation)

    async def recent_leases(self, within_s: float, limit: int) -> RecentLeases:
        """Leases nobody ended yet, and those granted in the last `within_s` seconds
        that have expired or ended since, at most `limit` of each."""

        async def operation(tx: Tx) -> RecentLeases:
            current = await tx.all("unended_leases", limit=limit)
            ended = await tx.all(
                "leases_ended_since", since=tx.now - within_s, now=tx.now, limit=limit
            )
            # An expired lease nobody ended yet is selected by both queries: keep it once.
            over = {
                (row["resource"], row["epoch"]): row
                for row in [*ended, *(row for row in current if row["expires_at"] <= tx.now)]
            }
            return RecentLeases(
                live=tuple(_lease_entry(row) for row in current if row["expires_at"] > tx.now),
                ended=tuple(
                    _lease_entry(row)
                    for row in sorted(
                        over.values(), key=lambda row: float(row["expires_at"]), reverse=True
                    )[:limit]
                ),
                now=tx.now,
            )

        return await self.connector.read(operation)


@dataclass(frozen=True)
class Replica:
    """A proxy instance as its last row in `replicas` tells (store clock seconds)."""

    instance_id: str
    version: str
    started_at: float
    seen_at: float
    last_sweep_at: float | None
    last_probe_at: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "version": self.version,
            "started_at": self.started_at,
            "seen_at": self.seen_at,
            "last_sweep_at": self.last_sweep_at,
            "last_probe_at": self.last_probe_at,
        }


@dataclass(frozen=True)
class LeaseEntry:
    resource: str
    epoch: int
    holder: str
    client: str | None
    granted_at: float
    expires_at: float
    ended_at: float | None
    end_reason: str | None
    # The holder showed it was alive after the lease expired: a false expiry.
    came_back_at: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "epoch": self.epoch,
            "holder": self.holder,
            "client": self.client,
            "granted_at": self.granted_at,
            "expires_at": self.expires_at,
            "ended_at": self.ended_at,
            "end_reason": self.end_reason,
            "came_back_at": self.came_back_at,
        }


@dataclass(frozen=True)
class RecentLeases:
    live: tuple[LeaseEntry, ...]  # latest expiry first
    ended: tuple[LeaseEntry, ...]  # expired or ended lately, latest expiry first
    now: float


def _lease_entry(row: Row) -> LeaseEntry:
    return LeaseEntry(
        resource=str(row["resource"]),
        epoch=int(row["epoch"]),
        holder=str(row["holder"]),
        client=row["client"],
        granted_at=float(row["granted_at"]),
        expires_at=float(row["expires_at"]),
        ended_at=_float_or_none(row["ended_at"]),
        end_reason=row["end_reason"],
        came_back_at=_float_or_none(row["came_back_at"]),
    )


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _new_effect_id() -> str:
    """Time first, so ids sort by creation and index inserts land on the B-tree's edge."""
    return f"eff_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


async def _resource_state(tx: Tx, resource: str, lock: bool) -> ResourceState:
    """The resource's records; `lock` first takes the resource's lock where the backend
    needs one, so the decision made on them holds until the transaction ends. Every
    change to a resource's effects and keys takes the same lock, so what is read here
    is one consistent view."""
    if lock:
        await _lock_resource(tx, resource)
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


async def _collect_resources(tx: Tx, leased: set[str], batch: int) -> int:
    """Delete, of at most `batch` resource rows, those nothing refers to any more (no
    lease, no effect, and so no idempotency record, which has its effect), and raise
    the epoch floor to their highest epoch in the same transaction: a later acquire of
    one of those names starts above the floor, so it still gets an epoch higher than
    any ever issued for it.

    The rows looked at are those whose leases this pass deleted (usually their last
    reference), then, in the room left, the next rows of a sweep of the whole table in
    key order: a row whose last reference went another way (its effects kept longer
    than its leases), that never had one (a revocation of a name never leased), or
    that was in use when its leases went, is found on the sweep's next round."""
    locked = await tx.all("lock_resources", resources=_json(leased))
    names = {row["resource"] for row in locked}
    room = batch - len(leased)
    swept_to: str | None = None
    if room > 0:
        swept = [row["resource"] for row in await tx.all("sweep_resources", limit=room)]
        # Past the last row the sweep starts again from the first ('' sorts first).
        swept_to = swept[-1] if len(swept) >= room else ""
        names.update(swept)
    deleted = await tx.all("delete_unreferenced_resources", resources=_json(names)) if names else []
    # store_meta's row last: every clock move and floor raise waits for its lock, so it
    # is held for the end of the transaction only, not for the deletes.
    if swept_to is not None:
        await tx.execute("set_resources_swept_to", resource=swept_to)
    if deleted:
        await tx.execute("raise_epoch_floor", floor=max(int(row["epoch"]) for row in deleted))
    return len(deleted)


def _json(names: set[str]) -> str:
    """Resource names as one parameter on both backends (a JSON array)."""
    return json.dumps(sorted(names))


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


def _admission_records(
    row: Row, resource: str, key: str | None
) -> tuple[LeaseRecord | None, ResourceState | None, IdempotencyRecord | None]:
    """The token's lease, and, for a token of this very resource, the resource's state
    and the key's record, from admission_state's one row."""
    if row["t_resource"] is None:
        return None, None, None
    lease = lease_record({name: row[f"t_{name}"] for name in _LEASE_COLUMNS})
    assert lease is not None
    if lease.resource != resource:
        return lease, None, None
    current = None
    if row["holder"] is not None:
        current = lease_record({**row, "resource": resource})
    if current is not None and current.epoch == lease.epoch:
        lease = current  # the same row, both read under the lock
    state = ResourceState(
        resource=resource,
        epoch=int(row["epoch"] or 0),
        lease=current,
        open_effects=tuple(
            OpenEffect(
                id=effect_id,
                state=EffectState(effect_state),
                epoch=int(epoch),
                idempotency_key=key,
                fingerprint=fingerprint,
            )
            for effect_id, effect_state, epoch, key, fingerprint in json.loads(row["open_effects"])
        ),
        epoch_floor=int(row["epoch_floor"] or 0),
    )
    existing = None
    if row["i_effect_id"] is not None:
        existing = idempotency_record(
            {
                "resource": resource,
                "key": key,
                **{name: row[f"i_{name}"] for name in _KEY_COLUMNS},
            }
        )
    return lease, state, existing


async def _lock_resource(tx: Tx, resource: str) -> None:
    locked = await tx.one("lock_resource", resource=resource)
    if locked is not None:  # a backend whose lock can be waited for says when it got it
        tx.now = float(locked["now"])


async def _live_leases(tx: Tx, holder: str, client: str | None, cap: int) -> LiveLeases:
    """The quota subject's live leases: the authenticated client's (all the leases it
    took, whatever holders they name), else the holder's (proxy/quotas.py
    quota_subject). Counted under the subject's lock (taken after the resource's, see
    lock_quota_subject) so that concurrent acquires of one subject on different
    resources cannot both find room under the cap."""
    subject = client if client is not None else holder
    locked = await tx.one("lock_quota_subject", subject=subject)
    if locked is not None:
        tx.now = float(locked["now"])
    if client is not None:
        row = await tx.one("live_leases_of_client", client=client, now=tx.now)
    else:
        row = await tx.one("live_leases_of_holder", holder=holder, now=tx.now)
    assert row is not None  # an aggregate always answers one row
    earliest = row["earliest"]
    return LiveLeases(subject, cap, int(row["n"]), None if earliest is None else float(earliest))


async def _effect_row(tx: Tx, effect_id: str) -> Row:
    row = await tx.one("effect", id=effect_id)
    assert row is not None
    return row


async def _locked_effect(tx: Tx, effect_id: str, skip_locked: bool = False) -> Row | None:
    """The effect's row, read under its resource's lock (taken first, as admission does,
    so that the two never wait on each other in opposite orders). With `skip_locked`,
    None if another transaction holds the effect's row."""
    row = await tx.one("effect", id=effect_id)
    if row is None:
        return None
    await _lock_resource(tx, row["resource"])
    query = "effect_for_update_skip_locked" if skip_locked else "effect_for_update"
    return await tx.one(query, id=effect_id)


@dataclass(frozen=True)
class _Step:
    transition: Transition
    effect: EffectRecord  # as it stands after the step
    moved: bool
    key_holder: str | None = None


async def _apply(
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
) -> _Step | None:
    """Apply one lifecycle event to an effect, as core/lifecycle.py's table says."""
    if row is None:
        row = await _locked_effect(tx, effect_id)
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
        await _insert_event(tx, effect_id, kind, actor, upstream_status, conclusion, detail)
    return _Step(step, after, moved, key_holder)


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


async def _lease_and_state(
    tx: Tx, token_hash: str
) -> tuple[LeaseRecord | None, ResourceState | None]:
    lease = lease_record(await tx.one("lease_by_token", token_hash=token_hash))
    if lease is None:
        return None, None
    state = await _resource_state(tx, lease.resource, lock=True)
    if state.lease is not None and state.lease.epoch == lease.epoch:
        lease = state.lease  # read under the lock: a concurrent release or renew shows
    elif state.epoch < lease.epoch:
        # Epochs only grow: retention deleted the lease and its resource's row while
        # this waited for the lock (PostgreSQL). The token names no lease any more.
        return None, None
    return lease, state


async def _mark_came_back(tx: Tx, lease: LeaseRecord | None, code: str) -> str | None:
    """Mark `lease` if `code`, refusing its token now, proves its holder alive after the
    lease expired (core.leasing_advice.holder_came_back); its resource if newly marked. In the
    transaction that looked the token up: no round trip of its own."""
    if lease is None or not holder_came_back(lease, code, tx.now):
        return None
    # Once per lease: a holder that retries its refused call is not counted again.
    marked = await tx.execute(
        "mark_came_back", resource=lease.resource, epoch=lease.epoch, now=tx.now
    )
    return lease.resource if marked else None


async def _grant(
    tx: Tx,
    resource: str,
    holder: str,
    token_hash: str,
    grant: Grant,
    ttl_s: float,
    client: str | None,
) -> None:
    await tx.execute("set_resource_epoch", resource=resource, epoch=grant.epoch)
    await tx.execute(
        "insert_lease",
        resource=resource,
        epoch=grant.epoch,
        holder=holder,
        token_hash=token_hash,
        granted_at=tx.now,
        expires_at=grant.expires_at,
        ttl_s=ttl_s,
        client=client,
    )


async def _insert_event(
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


@dataclass(frozen=True)
class _Refused:
    """An admission refused: the refusal to count once its transaction is over, and
    the resource whose holder it proved back after its lease expired, if newly so."""

    refusal: Refusal
    rejection: Rejection
    came_back: str | None
