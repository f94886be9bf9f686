"""Domain operations on the authority's records.

Each public method is one transaction: load records with named queries, ask a
pure decision in `core.fencing`, write what it decided. Nothing here knows
which database answers.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from core import fencing
from core.fencing import AdmissionRequest, Admit, Grant, Replay
from core.probing import check_resolvable
from core.records import (
    EffectEvent,
    EffectRecord,
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    Refusal,
    Rejection,
    ResourceState,
    StoredResponse,
)
from store.base import Connector, Row, Tx


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
class LeaseView:
    resource: str
    epoch: int
    holder: str | None
    expires_at: float | None
    live: bool
    blocked: bool
    in_doubt: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "epoch": self.epoch,
            "holder": self.holder,
            "expires_at": self.expires_at,
            "live": self.live,
            "blocked": self.blocked,
            "in_doubt": list(self.in_doubt),
        }


class Store:
    def __init__(self, connector: Connector, instance_id: str) -> None:
        self.connector = connector
        self.instance_id = instance_id

    async def open(self) -> None:
        await self.connector.open()

    async def close(self) -> None:
        await self.connector.close()

    # -- leases ---------------------------------------------------------------

    async def acquire(
        self, resource: str, holder: str, ttl_s: float, token_hash: str
    ) -> tuple[LeaseRecord, float] | Refusal:
        """Grant a new lease at a higher epoch; returns it with the transaction's clock."""

        async def operation(tx: Tx) -> tuple[LeaseRecord, float] | Refusal:
            state = await _resource_state(tx, resource, lock=True)
            decision = fencing.decide_acquire(state, ttl_s, tx.now)
            if isinstance(decision, Refusal):
                return decision
            await _grant(tx, resource, holder, token_hash, decision)
            lease = LeaseRecord(
                resource, decision.epoch, holder, tx.now, decision.expires_at, None, None
            )
            return lease, tx.now

        return await self.connector.write(operation)

    async def renew(self, token_hash: str, ttl_s: float) -> tuple[LeaseRecord, float] | Refusal:
        async def operation(tx: Tx) -> tuple[LeaseRecord, float] | Refusal:
            lease, state = await _lease_and_state(tx, token_hash)
            refusal = fencing.decide_renew(lease, state, tx.now)
            if refusal is not None:
                return refusal
            assert lease is not None
            expires_at = tx.now + ttl_s
            await tx.execute(
                "extend_lease", resource=lease.resource, epoch=lease.epoch, expires_at=expires_at
            )
            renewed = LeaseRecord(
                lease.resource, lease.epoch, lease.holder, lease.granted_at, expires_at, None, None
            )
            return renewed, tx.now

        return await self.connector.write(operation)

    async def release(self, token_hash: str) -> LeaseRecord | Refusal:
        async def operation(tx: Tx) -> LeaseRecord | Refusal:
            lease, state = await _lease_and_state(tx, token_hash)
            refusal = fencing.decide_release(lease, state, tx.now)
            if refusal is not None:
                return refusal
            assert lease is not None
            await tx.execute(
                "end_lease",
                resource=lease.resource,
                epoch=lease.epoch,
                ended_at=tx.now,
                end_reason="released",
            )
            return lease

        return await self.connector.write(operation)

    async def revoke(self, resource: str, reason: str) -> tuple[int, int]:
        """Advance the epoch now; returns (old epoch, new epoch)."""

        async def operation(tx: Tx) -> tuple[int, int]:
            state = await _resource_state(tx, resource, lock=True)
            if state.current_lease() is not None:
                await tx.execute(
                    "end_lease",
                    resource=resource,
                    epoch=state.epoch,
                    ended_at=tx.now,
                    end_reason=f"revoked: {reason}",
                )
            advanced = state.next_epoch()
            await tx.execute("set_resource_epoch", resource=resource, epoch=advanced)
            return state.epoch, advanced

        return await self.connector.write(operation)

    async def lease_view(self, resource: str) -> LeaseView:
        async def operation(tx: Tx) -> LeaseView:
            state = await _resource_state(tx, resource, lock=False)
            current = state.current_lease()
            return LeaseView(
                resource=resource,
                epoch=state.epoch,
                holder=current.holder if current else None,
                expires_at=current.expires_at if current else None,
                live=bool(current and current.live(tx.now)),
                blocked=bool(state.unknown_effects),
                in_doubt=state.in_doubt,
            )

        return await self.connector.read(operation)

    # -- effects --------------------------------------------------------------

    async def admit(self, token_hash: str, new: NewEffect) -> Admitted | Replay | Refusal:
        """Check the token and record the effect as DISPATCHING, in one transaction."""

        async def operation(tx: Tx) -> Admitted | Replay | Refusal:
            lease, state = await _lease_and_state(tx, token_hash)
            if lease is not None and lease.resource != new.resource:
                state = None
            existing = None
            if new.idempotency_key is not None and state is not None:
                existing = _idempotency(
                    await tx.one(
                        "idempotency_record", resource=new.resource, key=new.idempotency_key
                    )
                )
            request = AdmissionRequest(
                new.resource,
                new.idempotency_key,
                new.fingerprint,
                new.max_in_flight,
                new.upstream_timeout_s,
                new.upstream_idempotent,
            )
            decision = fencing.decide_admission(request, lease, state, existing, tx.now)
            if isinstance(decision, Replay):
                return decision
            if isinstance(decision, Refusal):
                await _insert_rejection(
                    tx,
                    Rejection(
                        code=decision.code,
                        method=new.method,
                        path=new.path,
                        route=new.route,
                        resource=new.resource,
                        holder=lease.holder if lease else None,
                        epoch=lease.epoch if lease else None,
                        fingerprint=new.fingerprint,
                    ),
                )
                return decision
            assert isinstance(decision, Admit) and lease is not None
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
            await tx.execute(
                "insert_effect",
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
            )
            if new.idempotency_key is not None:
                await tx.execute(
                    "claim_idempotency_key",
                    resource=new.resource,
                    key=new.idempotency_key,
                    fingerprint=new.fingerprint,
                    effect_id=effect.id,
                    epoch=lease.epoch,
                    expires_at=tx.now + new.retain_s,
                )
            return Admitted(effect, decision.resends)

        return await self.connector.write(operation)

    async def finish_effect(
        self,
        effect_id: str,
        state: EffectState,
        upstream_status: int | None,
        reason: str | None,
        response: StoredResponse | None,
        resends: tuple[str, ...] = (),
    ) -> None:
        """Record the receipt. A committed response is kept for replays; a key whose
        request provably did not take effect is freed so the holder can send it again.
        A definite answer to a resend settles the effects in doubt it resent."""

        async def operation(tx: Tx) -> None:
            if state is EffectState.UNKNOWN:
                await _insert_event(
                    tx,
                    effect_id,
                    "dispatch",
                    self.instance_id,
                    upstream_status,
                    "unknown",
                    reason or "outcome unknown",
                )
            if state in (EffectState.COMMITTED, EffectState.NOT_COMMITTED):
                why = f"resent as {effect_id}, which the upstream answered {upstream_status}"
                for earlier in resends:
                    await _insert_event(
                        tx,
                        earlier,
                        "resend",
                        self.instance_id,
                        upstream_status,
                        state.value.lower(),
                        why,
                    )
                    await _settle(tx, earlier, state, f"resend:{effect_id}", why)
            await tx.execute(
                "finish_effect",
                id=effect_id,
                state=state.value,
                finished_at=tx.now,
                upstream_status=upstream_status,
                reason=reason,
            )
            if state is EffectState.COMMITTED and response is not None:
                await tx.execute(
                    "store_response",
                    effect_id=effect_id,
                    status=response.status,
                    headers=json.dumps(response.headers),
                    body=response.body,
                )
            elif state in (EffectState.NOT_COMMITTED, EffectState.NOT_SENT):
                await tx.execute("free_idempotency_key", effect_id=effect_id)

        await self.connector.write(operation)

    async def effect(self, effect_id: str) -> EffectRecord | None:
        async def operation(tx: Tx) -> EffectRecord | None:
            row = await tx.one("effect", id=effect_id)
            return _effect(row) if row else None

        return await self.connector.read(operation)

    async def effects(
        self, resource: str | None = None, state: str | None = None, limit: int = 100
    ) -> list[EffectRecord]:
        async def operation(tx: Tx) -> list[EffectRecord]:
            rows = await tx.all("effects", resource=resource, state=state, limit=limit)
            return [_effect(row) for row in rows]

        return await self.connector.read(operation)

    # -- effects in doubt -----------------------------------------------------

    async def recover(self, instance_id: str | None, margin_s: float) -> list[str]:
        """Turn DISPATCHING effects that can no longer be in flight into UNKNOWN.

        Any instance's more than `margin_s` past its deadline, and, at start, all of
        `instance_id`'s (a restart means its requests' fates were lost with the old
        process). Another live replica's in-flight requests are left alone.
        """

        async def operation(tx: Tx) -> list[str]:
            reasons: dict[str, str] = {}
            cutoff = tx.now - margin_s
            for row in await tx.all("overdue_dispatching_effects", cutoff=cutoff):
                reasons[row["id"]] = "past its deadline with no receipt"
            if instance_id is not None:
                own = await tx.all("dispatching_effects_of_instance", instance_id=instance_id)
                for row in own:
                    reasons[row["id"]] = "the proxy restarted while it was in flight"
            marked = []
            for effect_id, why in reasons.items():
                # Another replica's sweep or the effect's own receipt may have got there
                # first; only the transaction that changed the row records the change.
                if await tx.execute("mark_unknown", id=effect_id, reason=why, now=tx.now):
                    await _insert_event(
                        tx, effect_id, "recover", self.instance_id, None, "unknown", why
                    )
                    marked.append(effect_id)
            return marked

        return await self.connector.write(operation)

    async def in_doubt(self, limit: int = 1000) -> list[EffectRecord]:
        async def operation(tx: Tx) -> list[EffectRecord]:
            return [_effect(row) for row in await tx.all("in_doubt_effects", limit=limit)]

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
            return _effect(row), [EffectEvent(**event) for event in events]

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
                    claimed.append(_effect(row))
            return claimed

        return await self.connector.write(operation)

    async def record_probe(
        self,
        effect_id: str,
        upstream_status: int | None,
        conclusion: str,
        detail: str,
        next_probe_at: float | None,
        settles: EffectState | None,
    ) -> EffectRecord | None:
        """Record one probe attempt; settle the effect if the answer was conclusive."""

        async def operation(tx: Tx) -> EffectRecord | None:
            row = await tx.one("effect_for_update", id=effect_id)
            if row is None or row["state"] != EffectState.UNKNOWN:
                return _effect(row) if row else None
            await tx.execute("record_probe_attempt", id=effect_id, next_probe_at=next_probe_at)
            await _insert_event(
                tx, effect_id, "probe", self.instance_id, upstream_status, conclusion, detail
            )
            if settles is not None:
                await _settle(tx, effect_id, settles, "probe", detail)
            elif next_probe_at is None:
                await _insert_event(
                    tx,
                    effect_id,
                    "probe",
                    self.instance_id,
                    None,
                    "gave_up",
                    "no probe attempts left; an operator must resolve this effect",
                )
            return _effect(await tx.one("effect", id=effect_id) or row)

        return await self.connector.write(operation)

    async def resolve(
        self, effect_id: str, outcome: EffectState, reason: str, operator: str
    ) -> EffectRecord | Refusal:
        """An operator's decision on an effect in doubt, recorded with who and why."""

        async def operation(tx: Tx) -> EffectRecord | Refusal:
            row = await tx.one("effect_for_update", id=effect_id)
            if row is None:
                return Refusal("not_found", f"no effect {effect_id}", {"effect_id": effect_id})
            refusal = check_resolvable(_effect(row), tx.now)
            if refusal is not None:
                return refusal
            actor = f"operator:{operator}"
            await _insert_event(
                tx, effect_id, "resolve", actor, None, outcome.value.lower(), reason
            )
            await _settle(tx, effect_id, outcome, actor, reason)
            settled = await tx.one("effect", id=effect_id)
            assert settled is not None
            return _effect(settled)

        return await self.connector.write(operation)

    async def counts(self) -> tuple[dict[str, int], int, float]:
        """Effects by state, blocked resources, and the age of the oldest in-doubt effect."""

        async def operation(tx: Tx) -> tuple[dict[str, int], int, float]:
            by_state = {r["state"]: int(r["n"]) for r in await tx.all("count_effects_by_state")}
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
        async def operation(tx: Tx) -> None:
            await _insert_rejection(tx, rejection)

        await self.connector.write(operation)

    async def rejections(self, resource: str | None = None, limit: int = 100) -> list[Rejection]:
        async def operation(tx: Tx) -> list[Rejection]:
            rows = await tx.all("rejections", resource=resource, limit=limit)
            return [Rejection(**row) for row in rows]

        return await self.connector.read(operation)

    async def collect_garbage(self) -> int:
        """Delete idempotency records past their retention whose effect is settled."""

        async def operation(tx: Tx) -> int:
            lock = await tx.one("gc_lock")
            if not (lock and lock["acquired"]):
                return 0  # another replica is collecting right now
            return await tx.execute("expired_idempotency_records", now=tx.now)

        return await self.connector.write(operation)

    async def fence_restore(self, advance: int) -> int:
        """After a restore from backup: raise every epoch (and the floor under new
        resources) by `advance` past the highest the backup knows, and end every lease,
        so nothing issued since the backup is ever issued again. Returns the new floor."""

        async def operation(tx: Tx) -> int:
            row = await tx.one("epoch_floor_and_max")
            assert row is not None
            floor = max(int(row["epoch_floor"]), int(row["max_epoch"])) + advance
            await tx.execute("set_epoch_floor", floor=floor)
            await tx.execute("advance_all_epochs", floor=floor)
            await tx.execute("end_all_leases", now=tx.now, reason="fence-restore")
            return floor

        return await self.connector.write(operation)

    async def now(self) -> float:
        """The authority's clock: lease expiry and settle windows are judged by it."""

        async def operation(tx: Tx) -> float:
            return tx.now

        return await self.connector.read(operation)

    async def ping(self) -> None:
        async def operation(tx: Tx) -> None:
            await tx.one("ping")

        await self.connector.read(operation)


def _new_effect_id() -> str:
    """Time first, so ids sort by creation and index inserts land on the B-tree's edge."""
    return f"eff_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


async def _resource_state(tx: Tx, resource: str, lock: bool) -> ResourceState:
    """The resource's records; `lock` first takes the resource's lock where the backend
    needs one, so the decision made on them holds until the transaction ends."""
    if lock:
        locked = await tx.one("lock_resource", resource=resource)
        if locked is not None:  # a backend whose lock can be waited for says when it got it
            tx.now = float(locked["now"])
    row = await tx.one("resource_state", resource=resource)
    assert row is not None  # the query always answers one row
    epoch = int(row["epoch"] or 0)
    lease = _lease(row) if row["holder"] is not None else None
    in_doubt = await tx.all("effects_in_doubt", resource=resource)
    unknown = [r for r in in_doubt if r["state"] == EffectState.UNKNOWN]
    return ResourceState(
        resource=resource,
        epoch=epoch,
        lease=lease,
        unknown_effects=tuple(r["id"] for r in unknown),
        dispatching_effects=tuple(
            r["id"] for r in in_doubt if r["state"] == EffectState.DISPATCHING
        ),
        unknown_operations=tuple((r["idempotency_key"], r["fingerprint"]) for r in unknown),
        epoch_floor=int(row["epoch_floor"] or 0),
    )


async def _lease_and_state(
    tx: Tx, token_hash: str
) -> tuple[LeaseRecord | None, ResourceState | None]:
    lease = _lease(await tx.one("lease_by_token", token_hash=token_hash))
    if lease is None:
        return None, None
    state = await _resource_state(tx, lease.resource, lock=True)
    if state.lease is not None and state.lease.epoch == lease.epoch:
        lease = state.lease  # read under the lock: a concurrent release or renew shows
    return lease, state


async def _grant(tx: Tx, resource: str, holder: str, token_hash: str, grant: Grant) -> None:
    await tx.execute("set_resource_epoch", resource=resource, epoch=grant.epoch)
    await tx.execute(
        "insert_lease",
        resource=resource,
        epoch=grant.epoch,
        holder=holder,
        token_hash=token_hash,
        granted_at=tx.now,
        expires_at=grant.expires_at,
    )


async def _settle(tx: Tx, effect_id: str, state: EffectState, settled_by: str, reason: str) -> None:
    """Settle an effect in doubt: a committed one's key replays "committed by
    reconciliation"; a not-committed one's key is freed so the holder may send again."""
    await tx.execute(
        "settle_effect",
        id=effect_id,
        state=state.value,
        settled_by=settled_by,
        reason=reason,
        now=tx.now,
    )
    if state is EffectState.COMMITTED:
        await tx.execute("mark_key_settled", effect_id=effect_id, settled_by=settled_by)
    else:
        await tx.execute("free_idempotency_key", effect_id=effect_id)


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


async def _insert_rejection(tx: Tx, rejection: Rejection) -> None:
    await tx.execute(
        "insert_rejection",
        at=tx.now,
        code=rejection.code,
        method=rejection.method,
        path=rejection.path,
        route=rejection.route,
        resource=rejection.resource,
        holder=rejection.holder,
        epoch=rejection.epoch,
        fingerprint=rejection.fingerprint,
    )


def _lease(row: Row | None) -> LeaseRecord | None:
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
    )


def _idempotency(row: Row | None) -> IdempotencyRecord | None:
    if row is None:
        return None
    response = None
    if row["response_status"] is not None:
        headers = tuple((str(k), str(v)) for k, v in json.loads(row["response_headers"] or "[]"))
        response = StoredResponse(
            int(row["response_status"]), headers, bytes(row["response_body"] or b"")
        )
    return IdempotencyRecord(
        resource=row["resource"],
        key=row["key"],
        fingerprint=row["fingerprint"],
        effect_id=row["effect_id"],
        effect_state=EffectState(row["effect_state"]),
        epoch=int(row["epoch"]),
        expires_at=float(row["expires_at"]),
        response=response,
        settled_by=row["settled_by"],
    )


def _effect(row: Row) -> EffectRecord:
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
