"""The store's side of reconciliation: effects in doubt found, probed, resolved and
counted."""

from __future__ import annotations

from core import lifecycle
from core.codes import ErrorCode
from core.lifecycle import Event, check_resolvable
from core.records import EffectEvent, EffectRecord, EffectState, Refusal
from store.base import Tx
from store.part import StorePart
from store.reads import effect_row, locked_effect
from store.rows import effect_record
from store.steps import apply_event, insert_event


class Reconciliation(StorePart):
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
                row = await locked_effect(tx, effect_id, skip_locked=True)
                if row is None:
                    return False
                step = await apply_event(
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
            row = await locked_effect(tx, effect_id)
            if row is None:
                return None
            gave_up = False
            if EffectState(row["state"]) in lifecycle.PROBED:
                inconclusive = event is Event.PROBE_INCONCLUSIVE
                await tx.execute(
                    "record_probe_attempt",
                    id=effect_id,
                    next_probe_at=next_probe_at if inconclusive else None,
                    counted=1 if counted else 0,
                )
                gave_up = lifecycle.gives_up(event, counted, next_probe_at)
                row = await effect_row(tx, effect_id)
            step = await apply_event(
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
                await insert_event(
                    tx,
                    effect_id,
                    "probe",
                    prober,
                    None,
                    lifecycle.GAVE_UP,
                    lifecycle.GAVE_UP_DETAIL,
                )
            return step.effect

        return await self.connector.write(operation)

    async def resolve(
        self, effect_id: str, outcome: EffectState, reason: str, operator: str
    ) -> EffectRecord | Refusal:
        """An operator's decision on an effect in doubt, recorded with who and why."""
        event = lifecycle.OPERATOR_DECIDES[outcome]

        async def operation(tx: Tx) -> EffectRecord | Refusal:
            row = await locked_effect(tx, effect_id)
            if row is None:
                return Refusal(
                    ErrorCode.NOT_FOUND, f"no effect {effect_id}", {"effect_id": effect_id}
                )
            refusal = check_resolvable(effect_record(row), tx.now)
            if refusal is not None:
                return refusal
            actor = f"operator:{operator}"
            step = await apply_event(
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
