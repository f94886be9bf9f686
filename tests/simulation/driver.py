"""The simulation's one door into the store: every `store.Store` call is made here.

The rest of the simulation sees only the small result types below, so a change of
the Store API means editing this file and nothing else (it was written against the
API before core/lifecycle.py, and adapted to it here).

What is called, and what each call stands for:

| simulation step        | Store calls                                           |
|------------------------|-------------------------------------------------------|
| acquire, renew         | acquire(resource, holder, ttl_s, token_hash),         |
|                        | renew(token_hash, ttl_s)                              |
| release, revoke        | release(token_hash), revoke(resource, reason)         |
| admit                  | admit(token_hash, NewEffect)                          |
| receipt (on time/late) | finish_effect(id, event, status, reason, response,    |
|                        | resends, admitted): the effect as admitted for about  |
|                        | half (one statement), None for the rest (steps)       |
| sweep                  | recover(None, margin_s)                               |
| restart                | close(); a new Store, same instance id; open();       |
|                        | recover(instance_id, margin_s)                        |
| probe (claim)          | claim_due_probes(limit, claim_s)                      |
| probe (answer)         | effect(id); now(); judge_probe (at the time asked,    |
|                        | from the latest send: sent_by)                        |
|                        | and next_probe_at as reconcile/prober.py does;        |
|                        | record_probe(id, event, status, detail, next, counted)|
| operator resolve       | resolve(id, outcome, reason, operator)                |
| garbage collection     | collect_garbage()                                     |
| read during a write    | effect_with_events(id), as the API's GET of an effect |
| (probe answer, receipt,| does, with the other replica's write committed       |
| sweep)                 | between its first statement and the next (`MidRead`)  |

Time: on SQLite the store reads `Authority.clock` (the simulated time); on
PostgreSQL the store reads the database's clock_timestamp() (and now()) +
store_meta.clock_offset_s, and the run's schema has clock functions of its own that
answer the simulated time (`SIMULATED_CLOCK`), ahead of pg_catalog's in the store's
search_path, flowing PG_CLOCK_SLOWER times slower than the machine's between two
moves: a loaded machine's slow steps move the store's clock by a twentieth of their
time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from core.fencing import Replay
from core.lifecycle import Answer, Event
from core.outcomes import Answered, DispatchResult, receipt_event
from core.probing import Conclusion, judge_probe, next_probe_at
from core.records import EffectRecord, EffectState, Refusal, StoredResponse
from core.send_deadline import sent_by
from policies import Route, StorePool
from store import Admitted, NewEffect, Store, UnknownKey, open_store
from store.base import Connector, Left, Operation, Row, SchemaOperation, T, Tx, Values
from store.history import RecoveryWindow, Replication
from tests.simulation.tables import EventRow, Moment, moment_of

Backend = Literal["sqlite", "postgres"]
Meanwhile = Callable[[], Coroutine[Any, Any, None]]

# Every duration the simulation uses is at least this far from any multiple of the
# simulated tick (see world.py), so a store clock this close to the simulated time
# cannot change a decision; further, and the run would not be deterministic.
MAX_PG_DRIFT_S = 0.45
# PostgreSQL's clock cannot stand still between two moves of the simulated clock, as
# SQLite's does (a run's reads must not tie, nor go back): it runs this many times
# slower than the machine's, from the simulated time of the last move. The steps
# between two moves may so take MAX_PG_DRIFT_S times this on a loaded machine, and
# two reads tie only when this many microseconds apart.
PG_CLOCK_SLOWER = 20

# The clock functions the store calls, in the run's schema, which the store URL's
# search_path puts ahead of pg_catalog's (`ahead_of_pg_catalog`): the simulated time,
# moved by `Authority.set_time`, flowing PG_CLOCK_SLOWER times slower than the
# machine's meanwhile. now() stays a transaction's start, before its clock_timestamp().
SIMULATED_CLOCK = (
    "CREATE TABLE simulated_time (at float8 NOT NULL, moved timestamptz NOT NULL)",
    f"""CREATE FUNCTION simulated(real_time timestamptz) RETURNS timestamptz
        LANGUAGE sql STABLE AS $$
        SELECT to_timestamp(at + extract(epoch FROM real_time - moved) / {PG_CLOCK_SLOWER})
        FROM simulated_time $$""",
    """CREATE FUNCTION clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
        SELECT simulated(pg_catalog.clock_timestamp()) $$""",
    """CREATE FUNCTION now() RETURNS timestamptz LANGUAGE sql STABLE AS $$
        SELECT simulated(pg_catalog.now()) $$""",
)
# The store's own reading of its clock (store/postgres.sql `now`).
STORE_CLOCK = (
    "SELECT extract(epoch FROM clock_timestamp())::float8 + clock_offset_s FROM store_meta"
)


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
    """What the app does with a dispatch's result: the state its receipt claims, and
    what the worker is told ("committed", "not_committed", "not_sent", "unknown" or
    "conflict")."""

    state: str
    reason: str
    told: str
    # The writer it was given: "one statement" (the effect as admitted, which the
    # request path passes; the store still takes the steps where the statement does
    # not apply: a key another open effect needs), "steps", or "steps, a resend's"
    # (a resend's receipt settles the sends it resent too: always the steps).
    path: str


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
# What each receipt event claims, as the state the app used to compute from it.
_CLAIMED = {
    Event.ANSWERED_COMMITTED: EffectState.COMMITTED,
    Event.ANSWERED_NOT_COMMITTED: EffectState.NOT_COMMITTED,
    Event.NOT_SENT: EffectState.NOT_SENT,
    Event.LOST: EffectState.UNKNOWN,
}


def _told(answer: Answer | None, event: Event, settled: EffectState) -> str:
    """What proxy/fenced.py tells the worker for this answer of the lifecycle table."""
    if answer is Answer.RESPONSE:
        return "committed" if event is Event.ANSWERED_COMMITTED else "not_committed"
    if answer is Answer.SETTLED:
        return "committed" if settled is EffectState.COMMITTED else "not_committed"
    if answer is Answer.NOT_SENT:
        return "not_sent"
    return "unknown" if answer is Answer.UNKNOWN else "conflict"


# -- a write committed in the middle of a read -------------------------------------

# On SQLite the interposed write runs on the event loop while the reader's thread waits
# for it; a write that took longer than this is stuck.
MID_READ_WAIT_S = 30.0


class _AfterFirstStatement:
    """A read's transaction that runs `meanwhile` once its first statement answered."""

    def __init__(self, tx: Tx, meanwhile: Meanwhile) -> None:
        self._tx = tx
        self._meanwhile: Meanwhile | None = meanwhile
        self.now = tx.now

    async def _then(self) -> None:
        meanwhile, self._meanwhile = self._meanwhile, None
        if meanwhile is not None:
            await meanwhile()

    async def one(self, query: str, **params: Any) -> Row | None:
        row = await self._tx.one(query, **params)
        await self._then()
        return row

    async def values(self, query: str, **params: Any) -> Values | None:
        found = await self._tx.values(query, **params)
        await self._then()
        return found

    async def all(self, query: str, **params: Any) -> list[Row]:
        rows = await self._tx.all(query, **params)
        await self._then()
        return rows

    async def execute(self, query: str, **params: Any) -> int:
        count = await self._tx.execute(query, **params)
        await self._then()
        return count


def _on_the_loop(meanwhile: Meanwhile) -> Meanwhile:
    """`meanwhile` for a thread other than the event loop's: run on the loop, and waited
    for without suspending."""
    loop = asyncio.get_running_loop()

    async def waited_for() -> None:
        asyncio.run_coroutine_threadsafe(meanwhile(), loop).result(MID_READ_WAIT_S)

    return waited_for


class MidRead:
    """A replica's connector whose reads run `meanwhile` (another replica's write, on a
    connection of its own) between their first statement and the next: the moment a
    read that is not one snapshot would see half of the write. Anything else passes
    through."""

    def __init__(self, inner: Connector, meanwhile: Meanwhile) -> None:
        self._inner = inner
        self._meanwhile = meanwhile
        self.backend = inner.backend

    # What the connector learns as it runs (a recovery window, the standbys) is the
    # inner one's, read through.
    @property
    def recovery(self) -> RecoveryWindow | None:
        return self._inner.recovery

    @recovery.setter
    def recovery(self, window: RecoveryWindow | None) -> None:
        self._inner.recovery = window

    @property
    def instance_id(self) -> str | None:
        return self._inner.instance_id

    @instance_id.setter
    def instance_id(self, instance_id: str | None) -> None:
        self._inner.instance_id = instance_id

    @property
    def replication(self) -> Replication | None:
        return self._inner.replication

    @replication.setter
    def replication(self, replication: Replication | None) -> None:
        self._inner.replication = replication

    @property
    def writes_queued(self) -> int:
        return self._inner.writes_queued

    async def open(self) -> None:
        await self._inner.open()

    async def change_schema(self, operation: SchemaOperation[T]) -> T:
        return await self._inner.change_schema(operation)

    async def ready(self) -> None:
        await self._inner.ready()

    async def close(self) -> None:
        await self._inner.close()

    async def write(
        self,
        operation: Operation[T],
        own_clock: bool = False,
        resource: str | None = None,
        left: Left | None = None,
    ) -> T:
        return await self._inner.write(operation, own_clock, resource, left)

    async def statement(self, query: str, **params: Any) -> Values | None:
        return await self._inner.statement(query, **params)

    async def read(self, operation: Operation[T]) -> T:
        async def interposed(tx: Tx) -> T:
            return await operation(_AfterFirstStatement(tx, self._meanwhile))

        return await self._inner.read(interposed)


# -- the authority: one database, its clock ----------------------------------------


class Authority:
    """The database both replicas share, and the simulated clock the store reads."""

    def __init__(self, backend: Backend, store_url: str) -> None:
        self.backend = backend
        self.store_url = store_url
        self.sim_time = 0.0
        self._pg: asyncpg.Connection | None = None

    def clock(self) -> float:
        """SQLite's clock: exactly the simulated time."""
        return self.sim_time

    async def open(self) -> None:
        """On PostgreSQL, before the store is created: the simulated clock at
        `sim_time`, so that the store reads no other, its creation included."""
        if self.backend == "postgres":
            self._pg = await asyncpg.connect(self.store_url, timeout=10)
            async with self._pg.transaction():
                for statement in SIMULATED_CLOCK:
                    await self._pg.execute(statement)
                await self._pg.execute(
                    "INSERT INTO simulated_time VALUES ($1, pg_catalog.clock_timestamp())",
                    self.sim_time,
                )

    async def close(self) -> None:
        if self._pg is not None:
            await self._pg.close()
            self._pg = None

    async def set_time(self, sim_time: float) -> None:
        """Move the store's clock to `sim_time` (forward only), once it is checked to
        have stayed within MAX_PG_DRIFT_S of the simulated time since the last move."""
        assert sim_time >= self.sim_time
        if self._pg is not None:
            read = float(await self._pg.fetchval(STORE_CLOCK))
            if not self.sim_time <= read < self.sim_time + MAX_PG_DRIFT_S:
                raise RuntimeError(
                    f"PostgreSQL's store reads the time {read:.6f} where the simulated time "
                    f"is {self.sim_time:.6f}: a clock the simulation does not set, or a "
                    "machine too slow for a deterministic run"
                )
            await self._pg.execute(
                "UPDATE simulated_time SET at = $1, moved = pg_catalog.clock_timestamp()",
                sim_time,
            )
        self.sim_time = sim_time


# -- a replica: one Store object with an instance id -------------------------------


class Replica:
    def __init__(self, authority: Authority, instance_id: str) -> None:
        self.authority = authority
        self.instance_id = instance_id
        self._store: Store | None = None
        # Each effect as its admission recorded it, passed with its receipt as
        # proxy/fenced.py does (the receipt is then decided from it, in one statement
        # on PostgreSQL, if the effect is still as admitted).
        self._admitted: dict[str, EffectRecord] = {}

    @property
    def store(self) -> Store:
        assert self._store is not None, f"{self.instance_id} is not started"
        return self._store

    async def start(self) -> None:
        clock: Callable[[], float] = self.authority.clock
        self._store = open_store(
            self.authority.store_url, clock, self.instance_id, pool=StorePool(1, 2)
        )
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
        result = await self.store.acquire(resource, holder, ttl_s, token_hash)
        if isinstance(result, Refusal):
            return Refused(result.code)
        lease, now = result
        return Granted(lease.epoch, lease.expires_at, now)

    async def renew(self, token_hash: str, ttl_s: float) -> Granted | Refused:
        result = await self.store.renew(token_hash, ttl_s)
        if isinstance(result, Refusal):
            return Refused(result.code)
        lease, now = result
        return Granted(lease.epoch, lease.expires_at, now)

    async def release(self, token_hash: str) -> Released | Refused:
        result = await self.store.release(token_hash)
        if isinstance(result, Refusal):
            return Refused(result.code)
        return Released(result.epoch)

    async def revoke(self, resource: str) -> tuple[int, int]:
        return await self.store.revoke(resource, "simulated operator revoke")

    # -- effects ----------------------------------------------------------------

    async def admit(
        self, token_hash: str, route: Route, resource: str, key: str | None, fingerprint: str
    ) -> AdmitResult:
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
            send_window_s=route.upstream.send_window_s,
        )
        decision = await self.store.admit(token_hash, new)
        if isinstance(decision, Admitted):
            effect = decision.effect
            self._admitted[effect.id] = effect
            return AdmittedEffect(
                effect.id, effect.epoch, effect.created_at, effect.deadline, decision.resends
            )
        if isinstance(decision, Replay):
            record = decision.record
            return Replayed(
                record.effect_id, record.effect_state.value, record.response is not None
            )
        # The simulated store never loses history: no recovery window opens.
        assert not isinstance(decision, UnknownKey)
        return Refused(decision.code)

    async def finish(
        self,
        effect_id: str,
        route: Route,
        result: DispatchResult,
        resends: tuple[str, ...],
        one_statement: bool,
    ) -> Receipt:
        """The receipt, as proxy/fenced.py `_dispatch_admitted` computes and records it;
        without `one_statement`, as if the effect as admitted were not known (the store
        then writes the receipt step by step)."""
        event, reason = receipt_event(result, route.outcomes)
        stored = None
        upstream_status = result.status if isinstance(result, Answered) else None
        if event is Event.ANSWERED_COMMITTED and upstream_status is not None:
            stored = StoredResponse(upstream_status, (("Content-Type", "application/json"),), b"{}")
        admitted = self._admitted.pop(effect_id, None) if one_statement else None
        self._admitted.pop(effect_id, None)
        receipt = await self.store.finish_effect(
            effect_id, event, upstream_status, reason, stored, resends, admitted
        )
        told = _told(receipt.transition.answer, event, receipt.effect.state)
        path = "steps" if admitted is None else "one statement"
        if resends:
            path = "steps, a resend's"
        return Receipt(_CLAIMED[event].value, reason, told, path)

    async def sweep(self, margin_s: float) -> list[str]:
        return await self.store.recover(None, margin_s)

    async def claim_probes(self, limit: int, claim_s: float) -> list[Claimed]:
        claimed = await self.store.claim_due_probes(limit, claim_s)
        return [Claimed(e.id, e.created_at, e.probe_attempts, e) for e in claimed]

    async def record_probe(
        self, claimed: Claimed, route: Route, status: int | None, asked_at: float
    ) -> ProbeRecorded:
        """What reconcile/prober.py `probe_effect` does once the upstream answered
        `status` to a probe asked at `asked_at`: judged at the time it was asked."""
        assert route.reconcile is not None
        effect = claimed.record
        now = await self.store.now()
        sent = sent_by(
            effect.created_at, effect.deadline, route.upstream.timeout_s, effect.finished_at
        )
        verdict = judge_probe(status, None, route.reconcile, sent, asked_at)
        settles = _SETTLES.get(verdict.conclusion)
        retry_at = None
        counted = not verdict.early
        if settles is None:
            attempts = effect.probe_attempts + (1 if counted else 0)
            retry_at = next_probe_at(attempts, route.reconcile, sent, now)
        # record_probe counts an attempt only on an effect still UNKNOWN; a read just
        # before tells the checks whether it was.
        current = await self.store.effect(effect.id)
        attempt_recorded = current is not None and current.state is EffectState.UNKNOWN
        recorded = await self.store.record_probe(
            effect.id, verdict.event, status, verdict.detail, retry_at, counted=counted
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
        outcome = EffectState.COMMITTED if committed else EffectState.NOT_COMMITTED
        result = await self.store.resolve(effect_id, outcome, reason, "sim")
        if isinstance(result, Refusal):
            return Refused(result.code)
        return Resolved(result.state.value)

    async def look(self, effect_id: str, meanwhile: Meanwhile) -> Moment | None:
        """The effect with its history, as the API's GET of an effect reads them
        (`effect_with_events`), with `meanwhile` committed between the read's first
        statement and the next.

        On PostgreSQL the read's transaction waits on its connection while the write
        runs on another. On SQLite an operation may not suspend (store/sqlite.py): its
        statements run in the reader connection's thread, which waits there while the
        write runs on the event loop (another replica's store: its own connections and
        threads)."""
        between = meanwhile if self.authority.backend == "postgres" else _on_the_loop(meanwhile)
        view = Store(MidRead(self.store.connector, between), self.instance_id)
        effect, events = await view.effect_with_events(effect_id)
        if effect is None:
            return None
        return moment_of(
            (
                effect.state.value,
                effect.finished_at,
                effect.upstream_status,
                effect.reason,
                effect.probe_attempts,
                effect.next_probe_at,
                effect.settled_by,
            ),
            [
                EventRow(e.at, e.kind, e.actor, e.upstream_status, e.conclusion, e.detail)
                for e in events
            ],
        )

    async def collect_garbage(self) -> int:
        return await self.store.collect_garbage()


def sqlite_url(directory: Path) -> str:
    # Durability is not under test here: NORMAL skips the fsync per commit.
    return f"sqlite:///{directory / 'sim.db'}?synchronous=NORMAL"


def ahead_of_pg_catalog(store_url: str) -> str:
    """A store URL whose search_path names one schema, with pg_catalog after it: the
    schema's functions (SIMULATED_CLOCK) are found before pg_catalog's."""
    parts = urlsplit(store_url)
    query = [
        (name, f"{value},pg_catalog" if name == "search_path" else value)
        for name, value in parse_qsl(parts.query)
    ]
    assert [name for name, _ in query].count("search_path") == 1, store_url
    return urlunsplit(parts._replace(query=urlencode(query)))
