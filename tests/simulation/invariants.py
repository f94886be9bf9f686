"""The invariants, checked after every step against the store's tables and the
upstream's own records.

I1  epochs never decrease; nothing is admitted (or renewed, released, granted)
    under a lease that is stale, expired, revoked or released at the store's time;
    at most max_in_flight effects of a resource are DISPATCHING.
I2  at most one upstream effect per (resource, idempotency key), unless the route
    is upstream_idempotent.                                          [truthful runs]
I3  every effect a worker was told is committed (a receipt or a replay) exists
    upstream.                                                        [truthful runs]
I4  no key is freed while an effect under it may have committed:
    - I4 (upstream): while the upstream holds the key's operation, the store lets
      nobody send it again, until retain_s after the store settled it COMMITTED;
      and no effect the upstream applied is held as NOT_COMMITTED/NOT_SENT.
                                                                      [truthful runs]
    - I4s (the store's own word): while an effect under a key is in doubt, or until
      retain_s after one settled COMMITTED, the key is not admitted again.
                                                                          [all runs]
    "Admitted again" is judged as admission would: a key is kept by a live
    idempotency record whose effect is in doubt or committed, or by a resource
    blocked by an effect in doubt. Retention is counted from settlement (the
    contract the fix introduces; today's count from admission is bug (c)).
I5  a resource is blocked while any of its effects is DISPATCHING (takeover),
    UNKNOWN or in a state these checks do not know (conflicting evidence): no grant,
    and no admission other than an allowed resend; and, after the drain phase,
    nothing is left in doubt (liveness).                                  [all runs]
I6  a contradiction is never silently dropped: evidence (a receipt, a probe
    answer) that contradicts how the effect was settled changes the effect's record
    or is recorded as an event.                                           [all runs]
I7  the key belongs to whichever effect under it is still open: while an effect
    under a key is DISPATCHING, UNKNOWN or CONFLICTING, the key's record exists and
    names an effect under that key that is open or COMMITTED, never none (a probe
    settling the first send NOT_COMMITTED while its resend is on its way must not
    take the resend's key with it).                                      [all runs]
I8  a read sees one moment: an effect and its history as a read answers them (the
    API's GET of an effect, `effect_with_events`) are both those the store held
    before a write that committed during the read, or both those after it; never
    the row of one moment beside the events of another (a probe's event beside the
    next_probe_at from before the probe).                                 [all runs]

Each violation carries a cause, read off the records (what the step did, how the
key was last freed). Causes of the known bugs of today's code are listed in
EXPECTED_TO_FAIL_BEFORE_FIX; once the fixes land, remove them from that set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from policies import Route
from tests.simulation import tables
from tests.simulation.tables import EffectRow, KeyRow, Moment, Tables
from tests.simulation.upstream import SimUpstream


class Evidence(Enum):
    TRUTHFUL = "truthful"
    HOSTILE = "hostile"


# -- causes ---------------------------------------------------------------------

BUG_A = "late-receipt-frees-committed-key"
BUG_B = "probe-judged-when-answered"
BUG_C = "retention-from-admission"
BUG_D = "resend-frees-committed-key"
BUG_E = "single-attempt-spent-in-settle-window"
CONTRADICTION_DROPPED = "contradiction-dropped"
# An open effect left without its key's record, by an effect under
# the same key settling NOT_* (a probe's "not found" while a resend is on its way), or
# by garbage collection of a committed send's expired record.
KEY_FREED_UNDER_OPEN = "key-freed-under-an-open-effect"
KEY_COLLECTED_UNDER_OPEN = "key-collected-under-an-open-effect"
# A read's statements each saw their own snapshot (PostgreSQL at READ COMMITTED).
TORN_READ = "read-of-two-moments"

BUG_LETTERS = {BUG_A: "a", BUG_B: "b", BUG_C: "c", BUG_D: "d", BUG_E: "e"}

# Causes a run tolerates (reports without stopping). The known bugs (a)-(e) and the
# dropped contradiction were found on the code before core/lifecycle.py and are
# fixed: every check is fatal now. Add a cause here only while its fix is pending.
EXPECTED_TO_FAIL_BEFORE_FIX: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Violation:
    invariant: str
    cause: str
    detail: str
    subjects: tuple[str, ...]  # keys ("r/k") and effects ("E12") it is about


# -- what a step tells the checker ------------------------------------------------


@dataclass(frozen=True)
class TokenView:
    """The simulation's own record of a lease, from what the store answered."""

    number: int
    resource: str
    epoch: int
    expires_at: float
    ended: str | None
    current_epoch: int  # the resource's epoch as the simulation knows it


@dataclass(frozen=True)
class Admission:
    effect_id: str
    resource: str
    route: Route
    key: str | None
    fingerprint: str
    epoch: int
    created_at: float
    resends: tuple[str, ...]
    token: TokenView
    # (id, state) of the resource's other unsettled effects right after the admission
    # committed: what it was admitted among, before the rest of its step (a probe, the
    # landing, the receipt) moved them on.
    among: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Ack:
    """A worker was told its operation committed."""

    seq: int
    resource: str
    key: str | None
    how: str


@dataclass(frozen=True)
class Applied:
    seq: int
    resource: str
    key: str | None
    idempotent_route: bool


@dataclass(frozen=True)
class EvidenceSeen:
    """Conclusive evidence about an effect: `committed` True or False."""

    effect_id: str
    committed: bool
    source: str
    events_before: int


@dataclass(frozen=True)
class ProbeSeen:
    asked_inside_settle: bool
    disagreeing: bool
    # every probe of this effect recorded so far was asked inside its settle window
    all_inside_settle: bool


@dataclass(frozen=True)
class ReadSeen:
    """A replica read an effect with its history while another's write committed."""

    effect_id: str
    reader: str
    seen: Moment | None
    before: Moment | None  # the store's, just before the read began
    after: Moment | None  # the store's, once the read returned

    @property
    def torn(self) -> bool:
        return self.seen != self.before and self.seen != self.after

    def when(self) -> str:
        """Which moment the read's effect, and its history, are from."""
        if self.seen is None:
            return "no effect"
        before, after = self.before, self.after

        def which(part: object, was: object, became: object) -> str:
            if part == was:
                return "before the write"
            return "after it" if part == became else "neither before nor after it"

        row = which(self.seen.row, before and before.row, after and after.row)
        events = which(self.seen.events, before and before.events, after and after.events)
        return f"the effect as {row}, its history as {events}"


@dataclass
class StepInfo:
    number: int
    kind: str
    text: str = ""
    touched: set[str] = field(default_factory=set)
    granted: str | None = None  # resource acquired
    admission: Admission | None = None
    acks: list[Ack] = field(default_factory=list)
    applied: list[Applied] = field(default_factory=list)
    evidence: list[EvidenceSeen] = field(default_factory=list)
    receipts: dict[str, str] = field(default_factory=dict)  # effect id -> state recorded
    resent_by: dict[str, str] = field(default_factory=dict)  # earlier effect -> resend's id
    probes: dict[str, ProbeSeen] = field(default_factory=dict)
    resolved: dict[str, bool] = field(default_factory=dict)  # effect id -> truthful
    reads: list[ReadSeen] = field(default_factory=list)
    model_violations: list[Violation] = field(default_factory=list)


# -- what the checker remembers ---------------------------------------------------


@dataclass
class EffectInfo:
    seq: int
    id: str
    route: Route
    resource: str
    key: str | None
    fingerprint: str
    created_at: float
    state: str = tables.DISPATCHING
    settled_by: str | None = None
    settled_seen: float | None = None  # simulated time it was first seen settled
    probe_attempts: int = 0
    next_probe_at: float | None = None
    freed_cause: str | None = None  # why the store holds it NOT_COMMITTED / NOT_SENT

    @property
    def name(self) -> str:
        return f"E{self.seq}"


@dataclass
class KeyInfo:
    resource: str
    key: str
    route: Route
    effects: list[int] = field(default_factory=list)
    removal_cause: str | None = None  # why its record last disappeared

    @property
    def name(self) -> str:
        return f"{self.resource}/{self.key}"


class Checker:
    def __init__(self, tables_: Tables, upstream: SimUpstream, evidence: Evidence) -> None:
        self.tables = tables_
        self.upstream = upstream
        self.evidence = evidence
        self.truthful = evidence is Evidence.TRUTHFUL
        self.effects: dict[int, EffectInfo] = {}
        self.by_id: dict[str, EffectInfo] = {}
        self.keys: dict[tuple[str, str], KeyInfo] = {}
        self.active_keys: set[tuple[str, str]] = set()
        self.max_epoch: dict[str, int] = {}
        self.model_epoch: dict[str, int] = {}
        self.key_rows: dict[tuple[str, str], KeyRow] = {}
        self.tainted: dict[str, str] = {}  # subject -> the cause that tainted it
        self.doubtful: set[str] = set()  # ids of effects last seen in doubt
        # Reads a write changed the effect under, between their first statement and the
        # next (the race I8 is about happened, whatever the read saw).
        self.reads_overtaken = 0

    # -- registration -------------------------------------------------------------

    def register(
        self,
        seq: int,
        effect_id: str,
        route: Route,
        resource: str,
        key: str | None,
        fingerprint: str,
        created_at: float,
    ) -> EffectInfo:
        info = EffectInfo(seq, effect_id, route, resource, key, fingerprint, created_at)
        self.effects[seq] = info
        self.by_id[effect_id] = info
        self.doubtful.add(effect_id)
        if key is not None:
            k = self.keys.setdefault((resource, key), KeyInfo(resource, key, route))
            k.effects.append(seq)
            self.active_keys.add((resource, key))
        return info

    def set_model_epoch(self, resource: str, epoch: int) -> None:
        self.model_epoch[resource] = epoch

    def in_doubt(self) -> list[EffectInfo]:
        return sorted((self.by_id[i] for i in self.doubtful), key=lambda e: e.seq)

    def taint(self, violation: Violation) -> None:
        for subject in violation.subjects:
            self.tainted.setdefault(subject, violation.cause)

    def is_consequence(self, violation: Violation) -> bool:
        return any(s in self.tainted for s in violation.subjects)

    # -- the key rules --------------------------------------------------------------

    def store_needs_until(self, key: KeyInfo) -> float:
        """Until when the store's own records require the key to be kept: forever while
        an effect under it is in doubt, retain_s after the last COMMITTED settlement;
        -inf if every effect under it is settled as not having taken effect."""
        until = -math.inf
        for seq in key.effects:
            info = self.effects[seq]
            if info.state in tables.FREED_STATES:
                continue
            if tables.in_doubt(info.state):
                return math.inf
            assert info.settled_seen is not None
            until = max(until, info.settled_seen + key.route.idempotency.retain_s)
        return until

    def retry_horizon(self, resource: str, key: str, now: float, margin: float) -> bool:
        """May a worker still send this key again? Not once the store may legitimately
        have forgotten it (that would be a new operation under an old key)."""
        info = self.keys.get((resource, key))
        if info is None:
            return True
        until = self.store_needs_until(info)
        return until == -math.inf or now < until - margin

    def kept(self, key: KeyInfo, now: float, blocked: set[str]) -> bool:
        """Would admission refuse or replay this key now (rather than send it again)?"""
        if key.resource in blocked:
            return True
        # A key whose effect is being forwarded or is in doubt is refused whatever its
        # record says (request_in_progress, resource_blocked).
        if any(tables.in_doubt(self.effects[seq].state) for seq in key.effects):
            return True
        row = self.key_rows.get((key.resource, key.key))
        if row is None or row.effect_state in tables.FREED_STATES:
            return False
        # Retention runs from settlement: no expiry while the effect is unsettled.
        return row.expires_at is None or tables.in_doubt(row.effect_state) or row.expires_at > now

    # -- after each step --------------------------------------------------------------

    async def after_step(self, step: StepInfo, now: float) -> list[Violation]:
        found = list(step.model_violations)
        epochs, in_doubt, new_key_rows = await self.tables.snapshot()
        found += self._epochs(epochs)

        rows = await self._changed_effects(step, in_doubt)
        before = {row.id: self.by_id[row.id].state for row in rows if row.id in self.by_id}
        for ev in step.evidence:
            before.setdefault(ev.effect_id, self.by_id[ev.effect_id].state)
        for row in rows:
            self._update(row, step, before, now)
        self._note_removed_keys(step, new_key_rows, before, now)
        self.key_rows = new_key_rows

        if step.granted is not None:
            found += await self._check_grant(step.granted)
        if step.admission is not None:
            found += await self._check_admission(step.admission)
        found += self._check_gave_up(step)
        found += self._check_keys(step, now)
        found += self._check_key_holders(step)
        found += self._check_applied(step)
        if self.truthful:
            found += self._check_acks(step)
        found += await self._check_evidence(step, before)
        found += self._check_reads(step)
        return found

    def _epochs(self, epochs: dict[str, int]) -> list[Violation]:
        found = []
        for resource, epoch in sorted(epochs.items()):
            if epoch < self.max_epoch.get(resource, 0):
                found.append(
                    Violation(
                        "I1",
                        "epoch-decreased",
                        f"{resource}: epoch {epoch} after {self.max_epoch[resource]}",
                        (resource,),
                    )
                )
            self.max_epoch[resource] = max(epoch, self.max_epoch.get(resource, 0))
            expected = self.model_epoch.get(resource, 0)
            if epoch != expected:
                found.append(
                    Violation(
                        "I1",
                        "epoch-disagrees",
                        f"{resource}: the store holds epoch {epoch}, its answers said {expected}",
                        (resource,),
                    )
                )
        return found

    async def _changed_effects(self, step: StepInfo, rows: list[EffectRow]) -> list[EffectRow]:
        seen = {row.id for row in rows}
        wanted = set(step.touched)
        wanted |= self.doubtful  # in doubt at the last check, perhaps no longer
        rows += await self.tables.effects_by_id(sorted(wanted - seen))
        return rows

    def _update(self, row: EffectRow, step: StepInfo, before: dict[str, str], now: float) -> None:
        info = self.by_id.get(row.id)
        if info is None:
            return  # not one of ours: cannot happen, every effect is admitted by the run
        info.state = row.state
        if tables.in_doubt(row.state):
            self.doubtful.add(row.id)
        else:
            self.doubtful.discard(row.id)
        info.settled_by = row.settled_by
        info.probe_attempts = row.probe_attempts
        info.next_probe_at = row.next_probe_at
        if tables.in_doubt(row.state):
            info.settled_seen = None  # (again) in doubt: retention restarts at settlement
        elif info.settled_seen is None:
            info.settled_seen = now
        if row.state in tables.FREED_STATES and before.get(row.id) not in tables.FREED_STATES:
            info.freed_cause = self._why_freed(info, step, before)
        if info.key is not None and not tables.in_doubt(row.state):
            self.active_keys.add((info.resource, info.key))

    def _why_freed(self, info: EffectInfo, step: StepInfo, before: dict[str, str]) -> str:
        """Why `info` (or its key) was just let go by this step, read off what it did."""
        was = before.get(info.id)
        if info.id in step.receipts:
            if was == tables.COMMITTED:
                return BUG_A
            return "receipt-says-not-committed"
        if info.id in step.resent_by:
            return "resend-answer-settled-it"
        if info.id in step.probes:
            probe = step.probes[info.id]
            if probe.disagreeing:
                return "disagreeing-probe"
            if probe.asked_inside_settle:
                return BUG_B
            return "probe-found-nothing"
        if info.id in step.resolved:
            return "operator-said-so" if step.resolved[info.id] else "operator-was-wrong"
        return f"freed-by-{step.kind}"

    def _note_removed_keys(
        self,
        step: StepInfo,
        rows: dict[tuple[str, str], KeyRow],
        before: dict[str, str],
        now: float,
    ) -> None:
        for k, old in self.key_rows.items():
            if k in rows:
                continue
            key = self.keys.get(k)
            if key is None:
                continue
            key.removal_cause = self._removal_cause(key, old, step, before, now)
            self.active_keys.add(k)

    def _removal_cause(
        self, key: KeyInfo, old: KeyRow, step: StepInfo, before: dict[str, str], now: float
    ) -> str:
        """Why the key's record disappeared in this step (effects already updated)."""
        if step.kind.endswith("gc"):
            expired = old.expires_at is not None and old.expires_at <= now
            return BUG_C if expired else "gc-removed-a-live-key"
        touched = [
            self.effects[s] for s in reversed(key.effects) if self.effects[s].id in step.touched
        ]
        for info in touched:
            if info.id in step.receipts and before.get(info.id) == tables.COMMITTED:
                return BUG_A  # a receipt for an effect already settled COMMITTED
        for info in touched:
            if info.state not in tables.FREED_STATES:
                continue
            others = [self.effects[s] for s in key.effects if s != info.seq]
            if any(tables.in_doubt(o.state) for o in others):
                # It ended NOT_*, and the key went with it, while another effect under
                # the key is still open (a resend on its way).
                return KEY_FREED_UNDER_OPEN
            if key.route.upstream_idempotent and any(o.state == tables.COMMITTED for o in others):
                # One effect of the operation ended NOT_*, and the key went with it, while
                # another effect of the same operation is committed.
                return BUG_D
            return info.freed_cause or self._why_freed(info, step, before)
        return f"removed-by-{step.kind}"

    async def _check_grant(self, resource: str) -> list[Violation]:
        doubt = await self.tables.effect_states_of(resource)
        if not doubt:
            return []
        names = ", ".join(f"{self._name(i)}:{s}" for i, s in sorted(doubt))
        return [
            Violation(
                "I5",
                "grant-while-in-doubt",
                f"{resource} was leased while effects were in doubt: {names}",
                (resource,),
            )
        ]

    async def _check_admission(self, a: Admission) -> list[Violation]:
        found = []
        name = self._name(a.effect_id)
        token = a.token
        if token.epoch != token.current_epoch or token.ended is not None:
            why = token.ended or f"superseded (epoch {token.epoch} < {token.current_epoch})"
            found.append(
                Violation("I1", "stale-admission", f"{name} admitted under a lease {why}", (name,))
            )
        elif a.created_at >= token.expires_at:
            found.append(
                Violation(
                    "I1", "expired-admission", f"{name} admitted under an expired lease", (name,)
                )
            )
        lease = await self.tables.lease(a.resource, a.epoch)
        if lease is None or lease.ended_at is not None or lease.expires_at <= a.created_at:
            found.append(
                Violation(
                    "I1",
                    "admission-without-live-lease",
                    f"{name} at epoch {a.epoch}: the lease row is {lease}",
                    (name,),
                )
            )
        doubt = [(i, s) for i, s in a.among if i != a.effect_id]
        dispatching = [i for i, s in doubt if s == tables.DISPATCHING]
        if len(dispatching) + 1 > a.route.max_in_flight:
            found.append(
                Violation(
                    "I1",
                    "over-max-in-flight",
                    f"{name}: {len(dispatching) + 1} DISPATCHING on {a.resource}, "
                    f"max_in_flight {a.route.max_in_flight}",
                    (name,),
                )
            )
        blocking = sorted(i for i, s in doubt if tables.blocks_admission(s))
        if blocking:
            states = dict(doubt)
            same_operation = all(
                (self.by_id[i].key, self.by_id[i].fingerprint) == (a.key, a.fingerprint)
                and states[i] == tables.UNKNOWN
                for i in blocking
                if i in self.by_id
            )
            allowed = (
                a.route.upstream_idempotent
                and a.key is not None
                and same_operation
                and set(blocking) == set(a.resends)
            )
            if not allowed:
                names = ", ".join(self._name(i) for i in blocking)
                found.append(
                    Violation(
                        "I5",
                        "admission-while-blocked",
                        f"{name} admitted on {a.resource} while {names} in doubt",
                        (name,),
                    )
                )
        return found

    def _check_gave_up(self, step: StepInfo) -> list[Violation]:
        """Probing may give up on an effect (then only an operator settles it), but not
        before one probe was asked when its answer could settle it: after settle_s."""
        found = []
        for effect_id, probe in sorted(step.probes.items()):
            info = self.by_id[effect_id]
            if info.state != tables.UNKNOWN or info.next_probe_at is not None:
                continue
            if probe.all_inside_settle:
                reconcile = info.route.reconcile
                attempts = reconcile.attempts if reconcile else 0
                found.append(
                    Violation(
                        "I5",
                        BUG_E,
                        f"probing gave up on {info.name} ({info.route.name}, attempts: {attempts})"
                        " and every probe was asked inside its settle window: only an operator"
                        " can settle it now",
                        (info.name,),
                    )
                )
        return found

    def _check_keys(self, step: StepInfo, now: float) -> list[Violation]:
        found = []
        blocked = {
            self.by_id[i].resource
            for i in self.doubtful
            if tables.blocks_admission(self.by_id[i].state)
        }
        for k in sorted(self.active_keys):
            key = self.keys[k]
            if key.name in self.tainted:
                self.active_keys.discard(k)  # reported already
                continue
            store_until = self.store_needs_until(key)
            applied = self.upstream.applications(key.resource, key.key) > 0
            if self.truthful and applied and store_until == -math.inf:
                store_until = math.inf  # the store holds as not done what the upstream did
            if now >= store_until:
                self.active_keys.discard(k)
                continue
            if self.kept(key, now, blocked):
                continue
            cause = self._unkept_cause(key, now)
            invariant = "I4" if applied and self.truthful else "I4s"
            owner = "the upstream's records" if invariant == "I4" else "the store's own records"
            found.append(
                Violation(
                    invariant,
                    cause,
                    f"key {key.name} can be admitted again while {owner} say it must be kept"
                    f" (effects: {self._states(key)})",
                    (key.name,),
                )
            )
        if self.truthful:
            candidates = {self.by_id[i].seq for i in step.touched if i in self.by_id}
            candidates |= {a.seq for a in step.applied}
            for seq in sorted(candidates):
                info = self.effects[seq]
                if info.state in tables.FREED_STATES and seq in self.upstream.applied_effects:
                    subjects = (info.name,) + ((f"{info.resource}/{info.key}",) if info.key else ())
                    found.append(
                        Violation(
                            "I4",
                            info.freed_cause or "unclassified",
                            f"{info.name} is held {info.state} but the upstream applied it",
                            subjects,
                        )
                    )
        return found

    def _check_key_holders(self, step: StepInfo) -> list[Violation]:
        """I7: a key with an effect under it still open is held, by one of its effects
        that is open or COMMITTED (a freed effect's record is deleted, never kept)."""
        found = []
        cause = KEY_COLLECTED_UNDER_OPEN if step.kind.endswith("gc") else KEY_FREED_UNDER_OPEN
        open_keys = sorted(
            {
                (info.resource, info.key)
                for info in (self.by_id[i] for i in self.doubtful)
                if info.key is not None
            }
        )
        for k in open_keys:
            key = self.keys[k]
            if key.name in self.tainted:
                continue
            row = self.key_rows.get(k)
            under = {self.effects[s].id for s in key.effects}
            if row and row.effect_id in under and row.effect_state not in tables.FREED_STATES:
                continue
            holder = "no record" if row is None else f"the record of {self._name(row.effect_id)}"
            found.append(
                Violation(
                    "I7",
                    cause,
                    f"key {key.name} has {holder} while an effect under it is open"
                    f" (effects: {self._states(key)}; last removed by: {key.removal_cause})",
                    (key.name,),
                )
            )
        return found

    def _unkept_cause(self, key: KeyInfo, now: float) -> str:
        row = self.key_rows.get((key.resource, key.key))
        if row is not None and row.expires_at is not None and row.expires_at <= now:
            return BUG_C
        if row is None:
            if key.removal_cause is not None:
                return key.removal_cause
            freed = [self.effects[s].freed_cause for s in key.effects]
            return next((c for c in reversed(freed) if c), "unclassified")
        return "record-of-a-settled-effect"

    def _check_applied(self, step: StepInfo) -> list[Violation]:
        found = []
        for a in step.applied:
            if a.key is None:
                continue
            self.active_keys.add((a.resource, a.key))
            if not self.truthful or a.idempotent_route:
                continue
            count = self.upstream.applications(a.resource, a.key)
            if count > 1:
                key = self.keys[(a.resource, a.key)]
                found.append(
                    Violation(
                        "I2",
                        key.removal_cause or "unclassified",
                        f"the upstream applied {key.name} {count} times (E{a.seq} last)",
                        (key.name,),
                    )
                )
        return found

    def _check_acks(self, step: StepInfo) -> list[Violation]:
        found = []
        for ack in step.acks:
            if not self.upstream.holds(ack.seq, ack.resource, ack.key):
                subject = f"{ack.resource}/{ack.key}" if ack.key else f"E{ack.seq}"
                found.append(
                    Violation(
                        "I3",
                        "told-committed-but-not-upstream",
                        f"E{ack.seq} ({ack.how}) was told committed; "
                        "the upstream has no such effect",
                        (subject, f"E{ack.seq}"),
                    )
                )
        return found

    async def _check_evidence(self, step: StepInfo, before: dict[str, str]) -> list[Violation]:
        found = []
        for ev in step.evidence:
            was = before.get(ev.effect_id)
            if was is None or tables.in_doubt(was):
                continue
            if (was == tables.COMMITTED) == ev.committed:
                continue  # agrees with how it was settled
            info = self.by_id[ev.effect_id]
            if info.route.upstream_idempotent:
                # There an effect is settled by its operation (a resend may have applied
                # it): its own request's fate, or a probe asked before the resend
                # landed, does not contradict that.
                continue
            if info.state != was:
                continue  # the record changed: not dropped
            if await self.tables.event_count(ev.effect_id) > ev.events_before:
                continue  # recorded as an event
            said = "committed" if ev.committed else "not committed"
            probe = step.probes.get(ev.effect_id) if ev.source.startswith("a probe") else None
            # A "not found" asked inside the settle window proves nothing; today it is
            # believed when it arrives after the window (bug b), and contradicts.
            cause = BUG_B if probe is not None and probe.asked_inside_settle else None
            found.append(
                Violation(
                    "I6",
                    cause or CONTRADICTION_DROPPED,
                    f"{info.name} was settled {was}; {ev.source} said {said}, and the store "
                    "kept no trace of it",
                    (info.name,) + ((f"{info.resource}/{info.key}",) if info.key else ()),
                )
            )
        return found

    def _check_reads(self, step: StepInfo) -> list[Violation]:
        found = []
        for read in step.reads:
            if read.before != read.after:
                self.reads_overtaken += 1
            if not read.torn:
                continue
            name = self._name(read.effect_id)
            seen = read.seen.describe() if read.seen else "nothing"
            before = read.before.describe() if read.before else "nothing"
            after = read.after.describe() if read.after else "nothing"
            found.append(
                Violation(
                    "I8",
                    TORN_READ,
                    f"{read.reader} read {name} while a write committed: {read.when()}"
                    f" (read: {seen}; before: {before}; after: {after})",
                    (name,),
                )
            )
        return found

    # -- liveness -----------------------------------------------------------------------

    def liveness(self) -> list[Violation]:
        found = []
        for info in sorted(self.in_doubt(), key=lambda e: e.seq):
            if info.state not in tables.IN_DOUBT_STATES or info.state == tables.CONFLICTING:
                continue  # conflicting evidence waits for an operator by design
            reconcile = info.route.reconcile
            gave_up = info.state == tables.UNKNOWN and info.next_probe_at is None
            if gave_up and reconcile is not None and reconcile.attempts == 1:
                cause = BUG_E
            elif gave_up:
                cause = "probes-gave-up"
            else:
                cause = "never-settled"
            found.append(
                Violation(
                    "I5",
                    cause,
                    f"{info.name} ({info.route.name}) is still {info.state} after the drain "
                    f"(probe attempts {info.probe_attempts}, next probe {info.next_probe_at})",
                    (info.name,),
                )
            )
        return found

    # -- naming -------------------------------------------------------------------------

    def _name(self, effect_id: str) -> str:
        info = self.by_id.get(effect_id)
        return info.name if info else effect_id

    def _states(self, key: KeyInfo) -> str:
        return ", ".join(
            f"{self.effects[s].name}:{self.effects[s].state}" for s in key.effects[-4:]
        )
