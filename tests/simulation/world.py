"""The simulated world: workers and their leases, two proxy replicas, the requests
in flight, the upstream, an operator, and the seeded scheduler that interleaves them.

Time. The simulated clock moves in ticks of TICK_S seconds from T0 and only at
"advance" steps, so every other step of a tick happens at the same simulated
time. Every duration the store compares against (lease TTLs, upstream timeouts,
settle_s, retain_s, the probe claim, and the fixed ones: the 2 s deadline margin
and the prober's backoffs of 0.5, 1, 2, ... 30 s) lies at least 0.5 s away from
any multiple of TICK_S, so no comparison is ever "equal" up to PostgreSQL's clock
flowing between two clock moves (the simulated one, twenty times slower than the
machine's: see driver.SIMULATED_CLOCK and MAX_PG_DRIFT_S). That is what makes a
PostgreSQL run as deterministic as a SQLite one.

Every choice comes from one `random.Random(seed)`, and everything that comes
back unordered (sets, rows) is sorted first. Effects are named by the order they
were admitted (E1, E2, ...), never by the store's ids, which hold wall-clock
time and random bits.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

from core.lifecycle import DEADLINE_MARGIN_S
from core.outcomes import Answered, DispatchResult, Lost, NotSent, TooLateToSend
from core.send_deadline import sent_by
from policies import Policy, Route, parse_policy
from tests.simulation import driver, tables
from tests.simulation.driver import Authority, Claimed, Replica
from tests.simulation.invariants import (
    Ack,
    Admission,
    Applied,
    Checker,
    Evidence,
    EvidenceSeen,
    ProbeSeen,
    ReadSeen,
    StepInfo,
    TokenView,
    Violation,
)
from tests.simulation.upstream import Landing, SimUpstream

TICK_S = 7.0
T0 = 1_800_000_000.0
CLAIM_S = 10.5
PROBE_BATCH = 64
MAX_STEPS_WITHOUT_ADVANCE = 12
TTLS = (17.5, 31.5, 52.5, 73.5)
RESEND_RACE = 0.3  # how often a probe pass runs between a resend's admission and landing
# How often a replica pauses between an admission and its send (the send deadline's case).
HELD = 0.1
# How often a cancelled handler's receipt waits until its replica, stopped at the
# `cancelled` failpoint (core/failpoints.py), is continued, rather than being written
# at once.
CANCELLED_RECEIPT_LATER = 0.5
OP_LIFETIME_TICKS = 40  # a worker gives up retrying an operation after this long
# How often a write that moves an effect (a probe's answer, a receipt, a sweep) commits
# while the other replica is reading that effect with its history (the API's GET).
# Drawn from a stream of its own: the steps a seed takes are those it took before.
READ_DURING_WRITE = 0.15
HOLDERS = ("w0", "w1", "w2", "w3")
REPLICAS = ("proxy-a", "proxy-b")

T = TypeVar("T")

# Durations are k * TICK_S + 3.5 (settle_s, retain_s, TTLs, claim) or
# k * TICK_S + 1.75 (timeouts: timeout + the 2 s margin and TTL - timeout then fall
# at +3.75 and +1.75), all at least 0.5 s from the tick grid. The send window is one
# tick: the deadline (admission + window + timeout) keeps the timeout's offset.
POLICY = """\
version: 1
store: "sqlite:///unused.db"
leases: {min_ttl_s: 1, max_ttl_s: 600, default_ttl_s: 10.5}
upstreams:
  slow: {url: "http://upstream.invalid", timeout_s: 8.75, connect_timeout_s: 1, send_window_s: 7}
  fast: {url: "http://upstream.invalid", timeout_s: 1.75, connect_timeout_s: 1, send_window_s: 7}
routes:
  # Orders: a key per operation; the upstream does not deduplicate.
  - name: orders
    upstream: slow
    match: {methods: [POST], path: "/orders/{sku}"}
    resource: "order:{sku}"
    idempotency: {required: true, retain_s: 38.5}
    reconcile:
      probe: {method: GET, path: "/orders/by-key/{idempotency_key}"}
      committed: ["200"]
      not_committed: ["404"]
      settle_s: 10.5
      attempts: 5
  # Payments: the upstream deduplicates by key, so a resend is allowed; two in flight.
  - name: payments
    upstream: fast
    match: {methods: [POST], path: "/payments/{acct}"}
    resource: "pay:{acct}"
    max_in_flight: 2
    upstream_idempotent: true
    idempotency: {required: true, retain_s: 24.5}
    reconcile:
      probe: {method: GET, path: "/payments/by-key/{idempotency_key}"}
      committed: ["200"]
      not_committed: ["404"]
      settle_s: 3.5
      attempts: 3
  # Rules: a key is optional; probed by the Fence-Effect-Id the upstream records.
  - name: rules
    upstream: fast
    match: {methods: [POST], path: "/rules/{rule}"}
    resource: "rule:{rule}"
    max_in_flight: 2
    forward_fence_headers: true
    idempotency: {required: false, retain_s: 24.5}
    reconcile:
      probe: {method: GET, path: "/rules/{rule}/effects"}
      committed: ["200"]
      not_committed: ["404"]
      settle_s: 17.5
      attempts: 4
  # One probe attempt only.
  - name: once
    upstream: slow
    match: {methods: [POST], path: "/once/{id}"}
    resource: "once:{id}"
    idempotency: {required: true, retain_s: 52.5}
    reconcile:
      probe: {method: GET, path: "/once/by-key/{idempotency_key}"}
      committed: ["200"]
      not_committed: ["404"]
      settle_s: 10.5
      attempts: 1
"""

RESOURCES = {
    "order:a": "orders",
    "order:b": "orders",
    "pay:a": "payments",
    "pay:b": "payments",
    "rule:a": "rules",
    "rule:b": "rules",
    "once:a": "once",
}

WEIGHTS = {
    "acquire": 8.0,
    "renew": 4.0,
    "release": 1.5,
    "revoke": 0.7,
    "advance": 9.0,
    "admit": 24.0,
    "land": 6.0,
    "respond": 3.0,
    "receive": 14.0,
    "send": 3.0,
    "cancel": 1.0,
    "stall": 1.0,
    "unstall": 2.0,
    "restart": 0.5,
    "sweep": 3.0,
    "probe": 6.0,
    "probe_answer": 4.0,
    "resolve": 2.0,
    "gc": 2.0,
}


def sim_policy() -> Policy:
    return parse_policy(POLICY, "<simulation policy>")


class Fate(Enum):
    REFUSED = "connection refused"
    COMMIT = "applies it"
    REJECT = "refuses it (4xx)"


class AnswerMode(Enum):
    PROMPT = "answers"
    LOST = "answer lost"
    LATE = "answers late"


@dataclass
class Token:
    number: int
    hash: str
    resource: str
    holder: str
    epoch: int
    expires_at: float
    ended: str | None = None

    @property
    def name(self) -> str:
        return f"#{self.number}({self.holder}@e{self.epoch})"


@dataclass
class Op:
    resource: str
    key: str
    fingerprint: str
    born: int  # tick
    acked: bool = False


@dataclass
class Dispatch:
    seq: int
    effect_id: str
    replica: str
    route: Route
    resource: str
    key: str | None
    fingerprint: str
    created_at: float
    deadline: float
    resends: tuple[str, ...]
    fate: Fate
    mode: AnswerMode
    status: int  # what the upstream answers if it answers (set at landing)
    land_by_tick: int
    landed: bool = False
    answer_at: float | None = None  # simulated time the answer reached the proxy
    orphaned: bool = False  # its replica restarted: no receipt will ever be recorded
    # The proxy is slow to record this receipt (a pause in the middle of the request):
    # not before this tick.
    record_not_before: int = 0
    recorded: bool = False
    # Its proxy paused between the admission and the send: nothing has left yet, and
    # a `send` step decides, by the send deadline, whether anything ever does.
    held: bool = False
    admitted_tick: int = 0
    too_late: bool = False  # the send step found the send deadline passed: never sent
    # Its handler was cancelled before the answer came (`serve` past a stop's grace): the
    # receipt says the outcome is unknown, whatever the request did; held, it never leaves.
    cancelled: bool = False

    @property
    def name(self) -> str:
        return f"E{self.seq}"

    @property
    def in_transit(self) -> bool:
        return not self.landed and self.fate is not Fate.REFUSED and not self.held


@dataclass
class PendingProbe:
    replica: str
    claimed: Claimed
    seq: int
    status: int
    asked_at: float
    asked_inside_settle: bool
    disagreeing: bool
    not_before: int = 0  # a slow answer arrives at this tick at the earliest


@dataclass
class ReplicaState:
    name: str
    driver: Replica
    stalled: bool = False
    restarts: int = 0


@dataclass
class World:
    seed: int
    evidence: Evidence
    authority: Authority
    checker: Checker
    upstream: SimUpstream
    policy: Policy
    replicas: dict[str, ReplicaState]
    rng: random.Random
    # Which writer each receipt is given (store/steps.py has two): drawn apart from
    # `rng`, so that the choice leaves the rest of a seed's run as it was.
    receipt_paths: random.Random
    trace: deque[str] = field(default_factory=lambda: deque(maxlen=60))
    tick: int = 0
    step_number: int = 0
    steps_since_advance: int = 0
    tokens: dict[str, list[Token]] = field(default_factory=dict)
    token_count: int = 0
    ops: dict[str, list[Op]] = field(default_factory=dict)
    key_count: int = 0
    dispatches: dict[int, Dispatch] = field(default_factory=dict)
    pending: list[int] = field(default_factory=list)  # dispatches not recorded nor orphaned
    orphans: list[int] = field(default_factory=list)  # orphaned dispatches still in transit
    probes: list[PendingProbe] = field(default_factory=list)
    # per effect, for each probe recorded: was it asked inside the settle window?
    probe_history: dict[int, list[bool]] = field(default_factory=dict)
    seq: int = 0
    receipts_by_path: Counter[str] = field(default_factory=Counter)
    # Whether handlers are cancelled in the middle of a dispatch (the `cancel` step), and
    # how their receipts came: "receipt at once" or "receipt later".
    cancellations: bool = True
    cancelled_receipts: Counter[str] = field(default_factory=Counter)
    step: StepInfo = field(default_factory=lambda: StepInfo(0, "start"))
    reads_rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.reads_rng = random.Random(f"{self.seed}:{self.evidence.value}:reads")

    # -- helpers ----------------------------------------------------------------------

    @property
    def now(self) -> float:
        return T0 + self.tick * TICK_S

    @property
    def hostile(self) -> bool:
        return self.evidence is Evidence.HOSTILE

    def route_of(self, resource: str) -> Route:
        route = self.policy.route_named(RESOURCES[resource])
        assert route is not None
        return route

    def running(self) -> list[ReplicaState]:
        return [r for r in self.replicas.values() if not r.stalled]

    def pick_running(self) -> ReplicaState:
        return self.rng.choice(self.running())

    def note(self, text: str) -> None:
        self.step.text = f"{self.step.text}; {text}" if self.step.text else text

    def current_token(self, resource: str) -> Token | None:
        tokens = self.tokens.get(resource, [])
        return tokens[-1] if tokens else None

    def token_view(self, token: Token) -> TokenView:
        return TokenView(
            token.number,
            token.resource,
            token.epoch,
            token.expires_at,
            token.ended,
            self.checker.model_epoch.get(token.resource, 0),
        )

    def model_violation(self, cause: str, detail: str, subject: str) -> None:
        self.step.model_violations.append(Violation("I1", cause, detail, (subject,)))

    async def read_meanwhile(
        self, effect_id: str | None, writer: str, write: Callable[[], Awaitable[T]]
    ) -> T:
        """`write`, by replica `writer`; sometimes committed while the other replica
        reads the effect with its history, after the read's first statement."""
        readers = [r for r in self.running() if r.name != writer]
        if effect_id is None or not readers or self.reads_rng.random() >= READ_DURING_WRITE:
            return await write()
        reader = readers[0]
        before = await self.checker.tables.moment(effect_id)
        done: list[T] = []

        async def meanwhile() -> None:
            done.append(await write())

        seen = await reader.driver.look(effect_id, meanwhile)
        read = ReadSeen(
            effect_id, reader.name, seen, before, await self.checker.tables.moment(effect_id)
        )
        self.step.reads.append(read)
        self.note(
            f"{reader.name} read {self.checker.by_id[effect_id].name} meanwhile: {read.when()}"
        )
        return done[0]

    # -- the scheduler ----------------------------------------------------------------------

    def enabled(self) -> dict[str, float]:
        running = self.running()
        has_tokens = any(self.tokens.get(r) for r in RESOURCES)
        stalled = [r for r in self.replicas.values() if r.stalled]
        enabled = {
            "advance": True,
            "acquire": bool(running),
            "renew": bool(running) and has_tokens,
            "release": bool(running) and has_tokens,
            "revoke": bool(running),
            "admit": bool(running) and has_tokens,
            "land": bool(self._unlanded()),
            "respond": bool(self._late_answers()),
            "receive": bool(self._receivable()),
            "send": bool(self._sendable()),
            "cancel": self.cancellations and bool(self._cancellable()),
            "stall": len(running) > 1,
            "unstall": bool(stalled),
            "restart": True,
            "sweep": bool(running),
            "probe": bool(running),
            "probe_answer": bool(self._deliverable_probes()),
            "resolve": bool(running) and bool(self.checker.doubtful),
            "gc": bool(running),
        }
        return {kind: WEIGHTS[kind] for kind, on in enabled.items() if on}

    def choose(self) -> str:
        if self.steps_since_advance >= MAX_STEPS_WITHOUT_ADVANCE:
            return "advance"
        weights = self.enabled()
        kinds = sorted(weights)
        return self.rng.choices(kinds, weights=[weights[k] for k in kinds])[0]

    async def run_step(self, kind: str) -> StepInfo:
        self.step_number += 1
        self.step = StepInfo(self.step_number, kind)
        self.steps_since_advance = 0 if kind == "advance" else self.steps_since_advance + 1
        await getattr(self, f"do_{kind}")()
        self.trace.append(f"{self.step_number:>7} t={self.tick:<5} {kind:<12} {self.step.text}")
        return self.step

    # -- clock --------------------------------------------------------------------------------

    async def do_advance(self, ticks: int | None = None) -> None:
        if ticks is None:
            ticks = 1 if self.rng.random() < 0.8 else self.rng.randint(2, 5)
        target = self.tick + ticks
        # A request lands before settle_s has passed since its dispatch (the upstream's
        # worst case, which settle_s is configured to cover).
        for seq in self._unlanded():
            d = self.dispatches[seq]
            if d.in_transit and d.land_by_tick < target:
                self.land(d)
        self.tick = target
        await self.authority.set_time(self.now)
        self.note(f"+{ticks} tick(s)")

    # -- leases -------------------------------------------------------------------------------

    def new_token_hash(self) -> tuple[int, str]:
        self.token_count += 1
        digest = hashlib.sha256(f"sim:{self.seed}:{self.token_count}".encode()).hexdigest()
        return self.token_count, digest

    async def do_acquire(self) -> None:
        free = sorted(
            r
            for r in RESOURCES
            if not (self.tokens.get(r) and self.lease_ok(self.tokens[r][-1], self.now))
        )
        resource = self.rng.choice(free if free and self.rng.random() < 0.8 else sorted(RESOURCES))
        holder = self.rng.choice(HOLDERS)
        ttl = self.rng.choice(TTLS)
        replica = self.pick_running()
        number, token_hash = self.new_token_hash()
        current = self.current_token(resource)
        result = await replica.driver.acquire(resource, holder, ttl, token_hash)
        if isinstance(result, driver.Refused):
            self.note(f"{holder} acquire {resource} via {replica.name}: {result.code}")
            return
        if current is not None and current.ended is None and result.now < current.expires_at:
            self.model_violation(
                "two-live-leases",
                f"{resource} granted to {holder} while {current.name} is live",
                resource,
            )
        if result.epoch <= self.checker.model_epoch.get(resource, 0):
            self.model_violation(
                "epoch-not-advanced", f"{resource} granted epoch {result.epoch}", resource
            )
        token = Token(number, token_hash, resource, holder, result.epoch, result.expires_at)
        self.tokens.setdefault(resource, []).append(token)
        self.checker.set_model_epoch(resource, result.epoch)
        self.step.granted = resource
        self.note(f"{holder} acquire {resource} ttl={ttl} via {replica.name}: {token.name}")

    def pick_token(self, current_bias: float) -> Token:
        """Mostly the holder of a live lease at work; otherwise any token ever issued
        (a stale holder waking up, a worker whose lease ran out)."""
        live = sorted(
            r
            for r in RESOURCES
            if self.tokens.get(r) and self.lease_ok(self.tokens[r][-1], self.now)
        )
        if live and self.rng.random() < current_bias:
            return self.tokens[self.rng.choice(live)][-1]
        resource = self.rng.choice(sorted(r for r in RESOURCES if self.tokens.get(r)))
        return self.rng.choice(self.tokens[resource])

    def lease_ok(self, token: Token, now: float, expired_ok: bool = False) -> bool:
        current = token.epoch == self.checker.model_epoch.get(token.resource, 0)
        return current and token.ended is None and (expired_ok or now < token.expires_at)

    async def do_renew(self) -> None:
        token = self.pick_token(0.8)
        ttl = self.rng.choice(TTLS)
        replica = self.pick_running()
        result = await replica.driver.renew(token.hash, ttl)
        if isinstance(result, driver.Refused):
            self.note(f"renew {token.resource} {token.name}: {result.code}")
            return
        if not self.lease_ok(token, result.now):
            self.model_violation(
                "stale-renew", f"{token.name} on {token.resource} renewed", token.resource
            )
        token.expires_at = result.expires_at
        self.note(f"renew {token.resource} {token.name} ttl={ttl}: ok")

    async def do_release(self) -> None:
        token = self.pick_token(0.8)
        replica = self.pick_running()
        ok_before = self.lease_ok(token, self.now, expired_ok=True)
        result = await replica.driver.release(token.hash)
        if isinstance(result, driver.Refused):
            self.note(f"release {token.resource} {token.name}: {result.code}")
            return
        if not ok_before:
            self.model_violation(
                "stale-release", f"{token.name} on {token.resource} released", token.resource
            )
        token.ended = "released"
        self.note(f"release {token.resource} {token.name}: ok")

    async def do_revoke(self) -> None:
        resource = self.rng.choice(sorted(RESOURCES))
        replica = self.pick_running()
        old, new = await replica.driver.revoke(resource)
        if old != self.checker.model_epoch.get(resource, 0) or new <= old:
            self.model_violation("revoke-epochs", f"{resource}: revoke {old} -> {new}", resource)
        current = self.current_token(resource)
        if current is not None and current.epoch == old and current.ended is None:
            current.ended = "revoked"
        self.checker.set_model_epoch(resource, new)
        self.note(f"revoke {resource}: epoch {old} -> {new}")

    # -- admission and dispatch -----------------------------------------------------------------

    def new_key(self) -> str:
        self.key_count += 1
        return f"k{self.key_count}"

    def pick_operation(self, resource: str, route: Route) -> tuple[str | None, str, str]:
        """(key, fingerprint, description) of what the worker sends."""
        if not route.idempotency.required and self.rng.random() < 0.5:
            self.key_count += 1
            return None, f"fp-keyless-{self.key_count}", "keyless"
        ops = self.ops.get(resource, [])
        ops[:] = [
            op
            for op in ops
            if self.tick - op.born < OP_LIFETIME_TICKS
            and self.checker.retry_horizon(resource, op.key, self.now, TICK_S)
        ]
        roll = self.rng.random()
        if ops and roll < 0.40:
            op = self.rng.choice(ops)
            return op.key, op.fingerprint, "retry"
        if ops and roll < 0.44:
            op = self.rng.choice(ops)
            return op.key, f"{op.fingerprint}-other", "key reused for another payload"
        key = self.new_key()
        self.ops.setdefault(resource, []).append(Op(resource, key, f"fp-{key}", self.tick))
        return key, f"fp-{key}", "new"

    def pick_fate(self) -> tuple[Fate, AnswerMode, int]:
        """What the upstream will do with the request, and how its answer travels.

        Truthful evidence: an answer's class is true (2xx: applied; 4xx: not applied);
        an error after applying is a 5xx, which the route's rules map to unknown.
        Hostile evidence adds 4xx answers after applying (an untrue "not committed")."""
        roll = self.rng.random()
        if self.hostile and roll < 0.06:
            return Fate.COMMIT, self.rng.choice([AnswerMode.PROMPT, AnswerMode.LATE]), 409
        roll = self.rng.random()
        if roll < 0.10:
            return Fate.REFUSED, AnswerMode.PROMPT, 0
        if roll < 0.50:
            return Fate.COMMIT, AnswerMode.PROMPT, 201
        if roll < 0.58:
            return Fate.COMMIT, AnswerMode.LOST, 201
        if roll < 0.66:
            return Fate.COMMIT, AnswerMode.LATE, 201
        if roll < 0.74:
            return Fate.COMMIT, AnswerMode.PROMPT, self.rng.choice([500, 503])
        if roll < 0.86:
            return Fate.REJECT, AnswerMode.PROMPT, self.rng.choice([409, 422, 429])
        if roll < 0.93:
            return Fate.REJECT, AnswerMode.LOST, 409
        return Fate.REJECT, AnswerMode.LATE, 422

    async def do_admit(self) -> None:
        token = self.pick_token(0.75)
        resource = token.resource
        route = self.route_of(resource)
        replica = self.pick_running()
        key, fingerprint, what = self.pick_operation(resource, route)
        view = self.token_view(token)
        result = await replica.driver.admit(token.hash, route, resource, key, fingerprint)
        label = f"{token.holder} {what} {resource} key={key} tok={token.name} via {replica.name}"
        if isinstance(result, driver.Refused):
            self.note(f"{label}: {result.code}")
            return
        if isinstance(result, driver.Replayed):
            info = self.checker.by_id.get(result.effect_id)
            seq = info.seq if info else 0
            self.note(f"{label}: replayed E{seq} {result.state}")
            if result.state == tables.COMMITTED:
                self.step.acks.append(Ack(seq, resource, key, "replay"))
                self.mark_acked(resource, key)
            return
        self.seq += 1
        seq = self.seq
        self.checker.register(
            seq, result.effect_id, route, resource, key, fingerprint, result.created_at
        )
        self.step.touched.add(result.effect_id)
        self.step.admission = Admission(
            result.effect_id,
            resource,
            route,
            key,
            fingerprint,
            result.epoch,
            result.created_at,
            result.resends,
            view,
            tuple(await self.checker.tables.effect_states_of(resource)),
        )
        fate, mode, status = self.pick_fate()
        assert route.reconcile is not None
        d = Dispatch(
            seq,
            result.effect_id,
            replica.name,
            route,
            resource,
            key,
            fingerprint,
            result.created_at,
            result.deadline,
            result.resends,
            fate,
            mode,
            status,
            land_by_tick=self.tick + int(route.reconcile.settle_s // TICK_S),
            admitted_tick=self.tick,
        )
        d.held = self.rng.random() < HELD
        if not d.held and self.rng.random() < 0.15:
            d.record_not_before = self.tick + self.rng.randint(1, 3)
        self.dispatches[seq] = d
        self.pending.append(seq)
        resent = ""
        if result.resends:
            names = ", ".join(self.checker.by_id[i].name for i in sorted(result.resends))
            resent = f" resending {names}"
        slow = f"; its proxy pauses until t={d.record_not_before}" if d.record_not_before else ""
        if d.held:
            slow = "; its proxy pauses before sending"
        self.note(f"{label}: E{seq} admitted{resent}; upstream {fate.value}, {mode.value}{slow}")
        if result.resends and self.rng.random() < RESEND_RACE:
            # The prober asks about the sends this one resends before it lands: a "not
            # found" settles them while the resend is on its way.
            await self.do_probe(immediate=True)
        if d.held:
            return
        if fate is not Fate.REFUSED and self.rng.random() < 0.6:
            self.land(d)
            if self.rng.random() < 0.5 and self.receivable(d):
                await self.receive(d)
        elif fate is Fate.REFUSED and self.rng.random() < 0.5 and self.receivable(d):
            await self.receive(d)

    def mark_acked(self, resource: str, key: str | None) -> None:
        for op in self.ops.get(resource, []):
            if op.key == key:
                op.acked = True

    def land(self, d: Dispatch) -> None:
        """The request reaches the upstream, which applies it or not."""
        d.landed = True
        landing = self.upstream.receive(
            d.seq,
            d.resource,
            d.key,
            d.fingerprint,
            d.route.upstream_idempotent,
            d.fate is Fate.COMMIT,
        )
        if landing is Landing.APPLIED:
            self.step.applied.append(Applied(d.seq, d.resource, d.key, d.route.upstream_idempotent))
        elif landing is Landing.DEDUPLICATED and (d.fate is Fate.REJECT or d.status < 300):
            d.status = 200  # the original result (an error after applying stays an error)
        elif landing is Landing.MISMATCH:
            d.status = 422
        if d.mode is AnswerMode.PROMPT:
            d.answer_at = self.now
        self.note(f"{d.name} lands upstream: {landing.value}")

    def _unlanded(self) -> list[int]:
        self.orphans = [s for s in self.orphans if self.dispatches[s].in_transit]
        return [s for s in self.pending if self.dispatches[s].in_transit] + self.orphans

    def _late_answers(self) -> list[int]:
        return [
            s
            for s in self.pending
            if self.dispatches[s].landed
            and self.dispatches[s].mode is AnswerMode.LATE
            and self.dispatches[s].answer_at is None
            and not self.dispatches[s].cancelled
        ]

    def receivable(self, d: Dispatch) -> bool:
        if d.recorded or d.orphaned or d.record_not_before > self.tick:
            return False
        if d.cancelled:
            return True
        if d.held:
            return False
        if d.fate is Fate.REFUSED:
            return True
        if d.landed and (d.mode is AnswerMode.LOST or d.answer_at is not None):
            return True
        return self.now > d.deadline

    def _receivable(self) -> list[int]:
        return [
            s
            for s in self.pending
            if not self.replicas[self.dispatches[s].replica].stalled
            and self.receivable(self.dispatches[s])
        ]

    async def do_land(self) -> None:
        d = self.dispatches[self.rng.choice(sorted(self._unlanded()))]
        self.land(d)

    async def do_respond(self) -> None:
        d = self.dispatches[self.rng.choice(self._late_answers())]
        d.answer_at = self.now
        late = " (after the proxy's timeout)" if self.now > d.deadline else ""
        self.note(f"{d.name}: the upstream's answer {d.status} arrives{late}")

    async def do_receive(self) -> None:
        await self.receive(self.dispatches[self.rng.choice(self._receivable())])

    def _sendable(self) -> list[int]:
        return [
            s
            for s in self.pending
            if self.dispatches[s].held
            and not self.dispatches[s].cancelled
            and not self.replicas[self.dispatches[s].replica].stalled
        ]

    async def do_send(self) -> None:
        await self.send(self.dispatches[self.rng.choice(self._sendable())])

    async def send(self, d: Dispatch) -> None:
        """A proxy paused between admission and send goes on: it sends only while its
        send deadline (the upstream's send window after the admission, on its own
        clock: the simulated one) has not passed; past it, nothing leaves and the
        receipt is NOT_SENT, whatever the other replica settled meanwhile."""
        d.held = False
        waited = (self.tick - d.admitted_tick) * TICK_S
        if waited > d.route.upstream.send_window_s:
            d.too_late = True
            self.note(f"{d.name}: its proxy goes on {waited:g}s after admission: too late")
            await self.receive(d)
            return
        assert d.route.reconcile is not None
        d.land_by_tick = self.tick + int(d.route.reconcile.settle_s // TICK_S)
        self.note(f"{d.name}: its proxy goes on {waited:g}s after admission and sends")
        if d.fate is not Fate.REFUSED and self.rng.random() < 0.6:
            self.land(d)

    def _cancellable(self) -> list[int]:
        """Dispatches whose handler is still waiting, on a replica that runs: held
        before its send, or sent with no answer arrived yet."""
        return [
            s
            for s in self.pending
            if not self.dispatches[s].cancelled
            and self.dispatches[s].answer_at is None
            and (self.dispatches[s].held or self.dispatches[s].fate is not Fate.REFUSED)
            and not self.replicas[self.dispatches[s].replica].stalled
        ]

    async def do_cancel(self) -> None:
        """`serve` stops, and once its grace is over cancels a handler in the middle of
        its dispatch (proxy/fenced.py): its receipt says the outcome is unknown, written
        at once, or after the replica, stopped at the `cancelled` failpoint first, is
        continued (`unstall`; the other replica, sweeps, probes and an operator go on
        meanwhile). A request that had left may still land; a held one never leaves."""
        d = self.dispatches[self.rng.choice(self._cancellable())]
        d.cancelled = True
        replica = self.replicas[d.replica]
        where = "before its send" if d.held else "waiting for the upstream"
        if len(self.running()) > 1 and self.rng.random() < CANCELLED_RECEIPT_LATER:
            replica.stalled = True
            self.cancelled_receipts["receipt later"] += 1
            self.note(f"{d.name}: its handler is cancelled {where}; {replica.name} stops")
            return
        self.cancelled_receipts["receipt at once"] += 1
        self.note(f"{d.name}: its handler is cancelled {where}")
        await self.receive(d)

    def dispatch_result(self, d: Dispatch) -> DispatchResult:
        if d.cancelled:
            return Lost("the request's handler was cancelled before the answer arrived")
        if d.too_late:
            return TooLateToSend("the send deadline passed before the send")
        if d.fate is Fate.REFUSED:
            return NotSent("connection refused")
        if d.landed and d.answer_at is not None and d.answer_at <= d.deadline:
            return Answered(d.status)
        if d.landed and d.mode is AnswerMode.LOST:
            return Lost("connection reset after the request was sent")
        return Lost(f"no answer within {d.route.upstream.timeout_s}s")

    async def events_if_settled(self, effect_id: str) -> int:
        """The effect's event count, read only where evidence could contradict (the
        effect is settled); the check for dropped contradictions compares it after."""
        if tables.in_doubt(self.checker.by_id[effect_id].state):
            return 0
        return await self.checker.tables.event_count(effect_id)

    async def receive(self, d: Dispatch) -> None:
        """The proxy that dispatched `d` records its receipt (perhaps long after)."""
        replica = self.replicas[d.replica]
        result = self.dispatch_result(d)
        ids = (d.effect_id, *sorted(d.resends))
        counts = {i: await self.events_if_settled(i) for i in ids}
        was = self.checker.by_id[d.effect_id].state
        offered = self.receipt_paths.random() < 0.5
        receipt = await self.read_meanwhile(
            d.effect_id,
            d.replica,
            lambda: replica.driver.finish(d.effect_id, d.route, result, d.resends, offered),
        )
        self.receipts_by_path[receipt.path] += 1
        d.recorded = True
        self.pending.remove(d.seq)
        self.step.touched.update(ids)
        self.step.receipts[d.effect_id] = receipt.state
        late = "" if was == tables.DISPATCHING else f" (late: it is {was})"
        self.note(
            f"{d.name} receipt via {d.replica} ({receipt.path}): {receipt.reason} "
            f"-> {receipt.state}{late}"
        )
        if receipt.told == "committed":
            self.step.acks.append(Ack(d.seq, d.resource, d.key, "receipt"))
            self.mark_acked(d.resource, d.key)
        if receipt.state in (tables.COMMITTED, tables.NOT_COMMITTED, tables.NOT_SENT):
            committed = receipt.state == tables.COMMITTED
            self.step.evidence.append(
                EvidenceSeen(d.effect_id, committed, f"{d.name}'s receipt", counts[d.effect_id])
            )
            if receipt.state != tables.NOT_SENT:
                for earlier in d.resends:
                    self.step.resent_by[earlier] = d.effect_id
                    self.step.evidence.append(
                        EvidenceSeen(
                            earlier, committed, f"resend {d.name}'s answer", counts[earlier]
                        )
                    )

    # -- replicas ---------------------------------------------------------------------------------

    async def do_stall(self) -> None:
        replica = self.pick_running()
        replica.stalled = True
        self.note(f"{replica.name} stalls")

    async def do_unstall(self) -> None:
        replica = self.rng.choice([r for r in self.replicas.values() if r.stalled])
        replica.stalled = False
        self.note(f"{replica.name} resumes")

    async def do_restart(self) -> None:
        replica = self.rng.choice(sorted(self.replicas.values(), key=lambda r: r.name))
        lost = []
        for seq in list(self.pending):
            d = self.dispatches[seq]
            if d.replica == replica.name:
                d.orphaned = True
                self.pending.remove(seq)
                if d.in_transit:
                    self.orphans.append(seq)
                lost.append(d.name)
        self.probes = [p for p in self.probes if p.replica != replica.name]
        replica.stalled = False
        replica.restarts += 1
        marked = await replica.driver.restart(DEADLINE_MARGIN_S)
        self.step.touched.update(marked)
        names = ", ".join(sorted(self.checker.by_id[i].name for i in marked))
        self.note(f"{replica.name} restarts (receipts lost: {lost or 'none'}); UNKNOWN: {names}")

    async def do_sweep(self) -> None:
        replica = self.pick_running()
        overdue = [
            info.id
            for info in self.checker.in_doubt()
            if info.state == tables.DISPATCHING
            and self.now - DEADLINE_MARGIN_S > self.dispatches[info.seq].deadline
        ]
        marked = await self.read_meanwhile(
            self.reads_rng.choice(overdue) if overdue else None,
            replica.name,
            lambda: replica.driver.sweep(DEADLINE_MARGIN_S),
        )
        self.step.touched.update(marked)
        names = ", ".join(sorted(self.checker.by_id[i].name for i in marked))
        self.note(f"sweep via {replica.name}: UNKNOWN: {names or 'none'}")

    # -- reconciliation ----------------------------------------------------------------------------

    async def do_probe(self, immediate: bool | None = None, hostile: bool | None = None) -> None:
        replica = self.pick_running()
        claimed = await replica.driver.claim_probes(PROBE_BATCH, CLAIM_S)
        by_seq = sorted(
            ((self.checker.by_id[c.effect_id].seq, c) for c in claimed), key=lambda p: p[0]
        )
        if not by_seq:
            self.note(f"probe via {replica.name}: nothing due")
        for seq, c in by_seq:
            d = self.dispatches[seq]
            found = self.upstream.holds(seq, d.resource, d.key)
            lie = (self.hostile if hostile is None else hostile) and self.rng.random() < 0.25
            status = 200 if found != lie else 404
            assert d.route.reconcile is not None
            pending = PendingProbe(
                replica.name,
                c,
                seq,
                status,
                self.now,
                self.now
                < sent_by(
                    c.created_at,
                    c.record.deadline,
                    d.route.upstream.timeout_s,
                    c.record.finished_at,
                )
                + d.route.reconcile.settle_s,
                lie,
            )
            now = self.rng.random() < 0.6 if immediate is None else immediate
            if now:
                await self.answer_probe(pending)
            else:
                slow = self.rng.random() < 0.5
                pending.not_before = self.tick + (self.rng.randint(1, 2) if slow else 0)
                self.probes.append(pending)
                self.note(f"probe of E{seq} via {replica.name} asked: {status} on its way")

    def _deliverable_probes(self) -> list[int]:
        return [
            i
            for i, p in enumerate(self.probes)
            if not self.replicas[p.replica].stalled and p.not_before <= self.tick
        ]

    async def do_probe_answer(self) -> None:
        probe = self.probes.pop(self.rng.choice(self._deliverable_probes()))
        await self.answer_probe(probe)

    async def answer_probe(self, probe: PendingProbe) -> None:
        d = self.dispatches[probe.seq]
        effect_id = probe.claimed.effect_id
        events = await self.events_if_settled(effect_id)
        prober = self.replicas[probe.replica].driver
        recorded = await self.read_meanwhile(
            effect_id,
            probe.replica,
            lambda: prober.record_probe(probe.claimed, d.route, probe.status, probe.asked_at),
        )
        self.step.touched.add(effect_id)
        history = self.probe_history.setdefault(d.seq, [])
        if recorded.attempt_recorded:
            history.append(probe.asked_inside_settle)
        self.step.probes[effect_id] = ProbeSeen(
            probe.asked_inside_settle, probe.disagreeing, bool(history) and all(history)
        )
        if recorded.conclusion in ("committed", "not_committed"):
            self.step.evidence.append(
                EvidenceSeen(
                    effect_id, recorded.conclusion == "committed", f"a probe of E{d.seq}", events
                )
            )
        asked = (probe.asked_at - T0) / TICK_S
        lie = " (disagreeing)" if probe.disagreeing else ""
        self.note(
            f"probe of E{d.seq} asked at t={asked:g} answered {probe.status}{lie} via "
            f"{probe.replica}: {recorded.conclusion} -> {recorded.state_after}"
        )

    async def do_resolve(self) -> None:
        info = self.checker.in_doubt()[self.rng.randrange(len(self.checker.in_doubt()))]
        d = self.dispatches[info.seq]
        if d.in_transit:
            self.note(f"operator looks at {info.name}: its request may still land, waits")
            return
        truth = self.upstream.holds(d.seq, d.resource, d.key)
        wrong = self.hostile and self.rng.random() < 0.3
        committed = truth != wrong
        replica = self.pick_running()
        result = await replica.driver.resolve(d.effect_id, committed, "simulated operator")
        self.step.touched.add(d.effect_id)
        if isinstance(result, driver.Resolved):
            self.step.resolved[d.effect_id] = not wrong
        said = "committed" if committed else "not committed"
        outcome = result.code if isinstance(result, driver.Refused) else result.state
        self.note(
            f"operator resolves {info.name} as {said}{' (wrongly)' if wrong else ''}: {outcome}"
        )

    async def do_gc(self) -> None:
        replica = self.pick_running()
        removed = await replica.driver.collect_garbage()
        self.note(f"garbage collection via {replica.name}: {removed} key(s) removed")
