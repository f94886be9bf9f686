"""The simulation's one door into the store: every `store.Store` call is made here.

The Store API is changing (finish_effect will return what the effect ended in and
what the worker is told; record_probe will take the time the probe was asked; a
new effect state for conflicting evidence; idempotency retention from
settlement). The rest of the simulation sees only the small result types below,
so adapting to the new API means editing this file (and, for a new state, the
state lists in tables.py) and nothing else.

What is called, and what each call stands for:

| simulation step        | Store calls                                           |
|------------------------|-------------------------------------------------------|
| acquire, renew         | acquire(resource, holder, ttl_s, token_hash),         |
|                        | renew(token_hash, ttl_s)                              |
| release, revoke        | release(token_hash), revoke(resource, reason)         |
| admit                  | admit(token_hash, NewEffect)                          |
| receipt (on time/late) | finish_effect(id, state, status, reason, response,    |
|                        | resends)                                              |
| sweep                  | recover(None, margin_s)                               |
| restart                | close(); a new Store, same instance id; open();       |
|                        | recover(instance_id, margin_s)                        |
| probe (claim)          | claim_due_probes(limit, claim_s)                      |
| probe (answer)         | effect(id); now(); judge_probe and next_probe_at as   |
|                        | reconcile/prober.py does; record_probe(...)           |
| operator resolve       | resolve(id, outcome, reason, operator)                |
| garbage collection     | collect_garbage()                                     |

Time: on SQLite the store reads `Authority.clock` (the simulated time); on
PostgreSQL the store reads the database's now() + store_meta.clock_offset_s, and
`Authority.set_time` sets that offset so that the two agree (see `set_time`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import asyncpg

from core.fencing import Replay
from core.outcomes import Answered, DispatchResult, settle_dispatch
from core.probing import Conclusion, judge_probe, next_probe_at
from core.records import EffectRecord, EffectState, Refusal, StoredResponse
from policies import Route
from store import Admitted, NewEffect, Store, open_store

Backend = Literal["sqlite", "postgres"]

# PostgreSQL's clock keeps flowing between two moves of the simulated clock. Every
# duration the simulation uses is at least this far from any multiple of the
# simulated tick (see world.py), so a drift below it cannot change a decision; a
# larger one means the machine is too slow for a deterministic run.
MAX_PG_DRIFT_S = 0.45


# -- results the simulation sees ---------------------------------------------------


@dataclass(frozen=True)
class Refused:
    code: str


@dataclass(frozen=True)
class Granted:
    epoch: int
    expires_at: float
    now: float


@dataclass(frozen=True)
class Released:
    epoch: int


@dataclass(frozen=True)
class AdmittedEffect:
    effect_id: str
    epoch: int
    created_at: float
    deadline: float
    resends: tuple[str, ...]


@dataclass(frozen=True)
class Replayed:
    effect_id: str
    state: str
    has_response: bool


@dataclass(frozen=True)
class Receipt:
    """What the app does with a dispatch's result: the state it records, and what the
    worker is told ("committed", "not_committed", "not_sent" or "unknown")."""

    state: str
    reason: str
    told: str


@dataclass(frozen=True)
class Claimed:
    """An effect a prober claimed. `record` is the store's, passed back unchanged."""

    effect_id: str
    created_at: float
    probe_attempts: int
    record: EffectRecord


@dataclass(frozen=True)
class ProbeRecorded:
    conclusion: str
    detail: str
    settles: str | None  # the state the prober asked to settle the effect in
    state_after: str | None  # the effect's state as record_probe returned it
    attempt_recorded: bool  # False: the effect was no longer UNKNOWN, nothing recorded
    asked_at: float
    judged_at: float


@dataclass(frozen=True)
class Resolved:
    state: str


AdmitResult = AdmittedEffect | Replayed | Refused

_SETTLES = {
    Conclusion.COMMITTED: EffectState.COMMITTED,
    Conclusion.NOT_COMMITTED: EffectState.NOT_COMMITTED,
}
_TOLD = {
    EffectState.COMMITTED: "committed",
    EffectState.NOT_COMMITTED: "not_committed",
    EffectState.NOT_SENT: "not_sent",
    EffectState.UNKNOWN: "unknown",
}


# -- the authority: one database, its clock ----------------------------------------


class Authority:
    """The database both replicas share, and the simulated clock the store reads."""

    def __init__(self, backend: Backend, store_url: str) -> None:
        self.backend = backend
        self.store_url = store_url
        self.sim_time = 0.0
        self._pg: asyncpg.Connection | None = None
        self._synced_at = 0.0  # monotonic time of the last PostgreSQL clock move

    def clock(self) -> float:
        """SQLite's clock: exactly the simulated time."""
        return self.sim_time

    async def open(self) -> None:
        if self.backend == "postgres":
            self._pg = await asyncpg.connect(self.store_url, timeout=10)

    async def close(self) -> None:
        if self._pg is not None:
            await self._pg.close()
            self._pg = None

    async def set_time(self, sim_time: float) -> None:
        """Move the store's clock to `sim_time` (forward only).

        PostgreSQL: the offset is chosen so that now() + offset is `sim_time` at the
        moment of the update; from then on the database's time flows from there
        until the next move (the run makes one at least every few steps)."""
        assert sim_time >= self.sim_time
        self.sim_time = sim_time
        if self._pg is not None:
            await self._pg.execute(
                "UPDATE store_meta SET clock_offset_s ="
                " $1::float8 - extract(epoch FROM clock_timestamp())::float8",
                sim_time,
            )
            self._synced_at = time.monotonic()

    def check_drift(self) -> None:
        if self._pg is not None and time.monotonic() - self._synced_at > MAX_PG_DRIFT_S:
            raise RuntimeError(
                f"PostgreSQL's clock drifted more than {MAX_PG_DRIFT_S}s from the simulated "
                "time between two clock moves: the machine is too slow for a deterministic run"
            )


# -- a replica: one Store object with an instance id -------------------------------


class Replica:
    def __init__(self, authority: Authority, instance_id: str) -> None:
        self.authority = authority
        self.instance_id = instance_id
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        assert self._store is not None, f"{self.instance_id} is not started"
        return self._store

    async def start(self) -> None:
        clock: Callable[[], float] = self.authority.clock
        self._store = open_store(self.authority.store_url, clock, self.instance_id, pool=(1, 2))
        await self._store.open()

    async def stop(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None

    async def restart(self, margin_s: float) -> list[str]:
        """A new process with the same instance id: a fresh Store, then the recovery the
        app runs before its listener opens."""
        await self.stop()
        await self.start()
        return await self.store.recover(self.instance_id, margin_s)

    # -- leases -----------------------------------------------------------------

    async def acquire(
        self, resource: str, holder: str, ttl_s: float, token_hash: str
    ) -> Granted | Refused:
        self.authority.check_drift()
        result = await self.store.acquire(resource, holder, ttl_s, token_hash)
        if isinstance(result, Refusal):
            return Refused(result.code)
        lease, now = result
        return Granted(lease.epoch, lease.expires_at, now)

    async def renew(self, token_hash: str, ttl_s: float) -> Granted | Refused:
        self.authority.check_drift()
        result = await self.store.renew(token_hash, ttl_s)
        if isinstance(result, Refusal):
            return Refused(result.code)
        lease, now = result
        return Granted(lease.epoch, lease.expires_at, now)

    async def release(self, token_hash: str) -> Released | Refused:
        self.authority.check_drift()
        result = await self.store.release(token_hash)
        if isinstance(result, Refusal):
            return Refused(result.code)
        return Released(result.epoch)

    async def revoke(self, resource: str) -> tuple[int, int]:
        self.authority.check_drift()
        return await self.store.revoke(resource, "simulated operator revoke")

    # -- effects ----------------------------------------------------------------

    async def admit(
        self, token_hash: str, route: Route, resource: str, key: str | None, fingerprint: str
    ) -> AdmitResult:
        self.authority.check_drift()
        path = f"/{route.name}/{resource.partition(':')[2]}"
        new = NewEffect(
            route=route.name,
            resource=resource,
            idempotency_key=key,
            fingerprint=fingerprint,
            method="POST",
            path=path,
            max_in_flight=route.max_in_flight,
            upstream_timeout_s=route.upstream.timeout_s,
            retain_s=route.idempotency.retain_s,
            upstream_idempotent=route.upstream_idempotent,
        )
        decision = await self.store.admit(token_hash, new)
        if isinstance(decision, Admitted):
            effect = decision.effect
            return AdmittedEffect(
                effect.id, effect.epoch, effect.created_at, effect.deadline, decision.resends
            )
        if isinstance(decision, Replay):
            record = decision.record
            return Replayed(
                record.effect_id, record.effect_state.value, record.response is not None
            )
        return Refused(decision.code)

    async def finish(
        self,
        effect_id: str,
        route: Route,
        result: DispatchResult,
        resends: tuple[str, ...],
    ) -> Receipt:
        """The receipt, as proxy/app.py `_dispatch_admitted` computes and records it."""
        self.authority.check_drift()
        state, reason = settle_dispatch(result, route.outcomes)
        stored = None
        upstream_status = result.status if isinstance(result, Answered) else None
        if state is EffectState.COMMITTED and upstream_status is not None:
            stored = StoredResponse(upstream_status, (("Content-Type", "application/json"),), b"{}")
        # Today finish_effect returns nothing and the worker is told what the dispatch
        # showed; once it returns a result, `told` comes from that result.
        await self.store.finish_effect(effect_id, state, upstream_status, reason, stored, resends)
        return Receipt(state.value, reason, _TOLD[state])

    async def sweep(self, margin_s: float) -> list[str]:
        self.authority.check_drift()
        return await self.store.recover(None, margin_s)

    async def claim_probes(self, limit: int, claim_s: float) -> list[Claimed]:
        self.authority.check_drift()
        claimed = await self.store.claim_due_probes(limit, claim_s)
        return [Claimed(e.id, e.created_at, e.probe_attempts, e) for e in claimed]

    async def record_probe(
        self, claimed: Claimed, route: Route, status: int | None, asked_at: float
    ) -> ProbeRecorded:
        """What reconcile/prober.py `probe_effect` does once the upstream answered
        `status` to a probe asked at `asked_at` (today's prober ignores when it asked)."""
        self.authority.check_drift()
        assert route.reconcile is not None
        effect = claimed.record
        now = await self.store.now()
        verdict = judge_probe(status, None, route.reconcile, effect.created_at, now)
        settles = _SETTLES.get(verdict.conclusion)
        retry_at = None
        if settles is None:
            retry_at = next_probe_at(
                effect.probe_attempts + 1, route.reconcile, effect.created_at, now
            )
        # Today record_probe records nothing for an effect that is no longer UNKNOWN and
        # does not say so; the simulation is the only client, so a read just before tells.
        current = await self.store.effect(effect.id)
        attempt_recorded = current is not None and current.state is EffectState.UNKNOWN
        recorded = await self.store.record_probe(
            effect.id, status, verdict.conclusion.value, verdict.detail, retry_at, settles
        )
        return ProbeRecorded(
            verdict.conclusion.value,
            verdict.detail,
            settles.value if settles else None,
            recorded.state.value if recorded else None,
            attempt_recorded,
            asked_at,
            now,
        )

    async def resolve(self, effect_id: str, committed: bool, reason: str) -> Resolved | Refused:
        self.authority.check_drift()
        outcome = EffectState.COMMITTED if committed else EffectState.NOT_COMMITTED
        result = await self.store.resolve(effect_id, outcome, reason, "sim")
        if isinstance(result, Refusal):
            return Refused(result.code)
        return Resolved(result.state.value)

    async def collect_garbage(self) -> int:
        self.authority.check_drift()
        return await self.store.collect_garbage()


def sqlite_url(directory: Path) -> str:
    # Durability is not under test here: NORMAL skips the fsync per commit.
    return f"sqlite:///{directory / 'sim.db'}?synchronous=NORMAL"
