"""Three fenceproxy replicas on one PostgreSQL database, one demo upstream.

* A seeded random workload: workers take short leases and write through random
  replicas, outlive their leases, release them, retry with old tokens. Checked
  from the workers' own records and from the upstream's: epochs grow strictly
  per resource, no two leases on a resource are live at once, every write under
  a superseded (or released, or expired) lease is refused whichever replica it
  reaches, and the upstream never applies a write of a holder after its
  successor was granted.
* SIGKILL of a replica with a slow write in flight: another replica's sweep
  turns it UNKNOWN once it is past its deadline plus the margin, and its probe
  settles it COMMITTED; the upstream holds the order once.
* Two survivors sweeping the same overdue effect at once (the interleaving
  forced with a row lock): only the one that turned it UNKNOWN may record that.
* Clock skew: replicas whose process clocks run an hour ahead or behind judge
  leases exactly as the others do, because expiry is the database's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import asyncpg
import pytest

from core.lifecycle import DEADLINE_MARGIN_S
from tests.integration.replicas.conftest import (
    Api,
    Fleet,
    Proxy,
    api_for,
    authority_clock_offset,
    eventually,
    resource_of,
)

pytestmark = pytest.mark.timeout(90)

SEED = 4_2024
WORKLOAD_S = 18.0
TARGETS = ("a", "b", "c", "d", "e")
WORKERS = 6
TTLS_S = (1.0, 1.5, 2.0)
# Lease times come from the store's clock (the database's), converted to the test's
# clock with a measured offset; slack for float rounding (ttl_s is answered to the
# millisecond) on top of the offset's own uncertainty.
TOLERANCE_S = 0.005
SETTLE_TIMEOUT_S = 20.0

WRITE_OUTCOMES = {
    "ok",
    "stale_epoch",
    "lease_expired",
    "lease_too_short",
    "resource_blocked",
    "effect_in_flight",
    "outcome_unknown",
}
ACQUIRE_OUTCOMES = {"ok", "lease_held", "resource_blocked"}
RENEW_OUTCOMES = {"ok", "lease_expired", "stale_epoch", "resource_blocked"}
RELEASE_OUTCOMES = {"ok", "stale_epoch"}


@dataclass(frozen=True)
class Term:
    """A lease's expiry as set by its grant or a renewal (the database's clock), and when
    the request that set it was sent and answered (the test's clock)."""

    sent: float
    received: float
    expires_at: float


@dataclass
class Grant:
    """A lease as its worker saw it granted (times: the database's clock via the answer,
    and the test's own clock around the request). A renewal may lengthen or shorten it."""

    target: str
    epoch: int
    holder: str
    token: str
    replica: str
    sent: float
    received: float
    granted_at: float
    terms: list[Term]
    release_sent: float | None = None
    release_received: float | None = None

    @property
    def resource(self) -> str:
        return resource_of(self.target)

    @property
    def expires_at(self) -> float:
        """The expiry of the latest renewal (only the holder renews, one at a time)."""
        return self.terms[-1].expires_at

    def expiries_in_force(self, start: float, end: float) -> list[float]:
        """The expiries that may have been in force at some moment from `start` to `end`
        (test clock): that of the last request answered by `start`, and those of every
        request sent by `end`."""
        first = max((i for i, t in enumerate(self.terms) if t.received <= start), default=0)
        return [t.expires_at for t in self.terms[first:] if t.sent <= end]


@dataclass(frozen=True)
class Write:
    target: str
    epoch: int
    holder: str
    by_holder: bool  # False: another worker retrying an old token
    replica: str
    kind: str
    key: str
    sent: float
    received: float
    status: int
    outcome: str
    effect_id: str | None


class Workload:
    """Workers and their records. Every time recorded is on the test's clock: lease
    times from the store's answers are shifted by `clock_offset` (store minus test)."""

    def __init__(self, api: Api, replicas: list[Proxy], seed: int, clock_offset: float) -> None:
        self.api = api
        self.replicas = replicas
        self.seed = seed
        self.clock_offset = clock_offset
        self.grants: list[Grant] = []
        self.writes: list[Write] = []
        self.old: list[Grant] = []
        self.outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        self.resolved: dict[str, str] = {}

    async def run(self, duration_s: float) -> None:
        until = time.monotonic() + duration_s
        stop = asyncio.Event()
        operator = asyncio.create_task(self.operator(stop))
        try:
            await asyncio.gather(*(self.worker(n, until) for n in range(WORKERS)))
        finally:
            stop.set()
            await operator

    async def worker(self, number: int, until: float) -> None:
        rng = random.Random(self.seed * 1000 + number)
        holder = f"w{number}"
        while time.monotonic() < until:
            if self.old and rng.random() < 0.3:
                await self.write(rng, rng.choice(self.old), by_holder=False)
            grant = await self.acquire(rng, rng.choice(TARGETS), holder, rng.choice(TTLS_S))
            if grant is None:
                await asyncio.sleep(rng.uniform(0.1, 0.5))  # think time, then try again
                continue
            for _ in range(rng.randint(1, 4)):
                await self.write(rng, grant, by_holder=True)
                if rng.random() < 0.15:
                    await self.renew(rng, grant)
                await asyncio.sleep(rng.uniform(0.0, 0.2))
            ending = rng.random()
            if ending < 0.35:
                await self.release(rng, grant)
            elif ending < 0.7:
                # Outlive the lease (by the shared clock), then write as if nothing happened.
                await asyncio.sleep(
                    max(0.0, grant.expires_at - time.time()) + rng.uniform(0.02, 0.4)
                )
                await self.write(rng, grant, by_holder=True)
            self.old.append(grant)  # otherwise: walk away from a lease that is still live

    async def acquire(
        self, rng: random.Random, target: str, holder: str, ttl_s: float
    ) -> Grant | None:
        replica = rng.choice(self.replicas)
        sent = time.time()
        answer = await self.api.acquire(replica, resource_of(target), holder, ttl_s)
        received = time.time()
        self.outcomes["acquire"][answer.outcome] += 1
        if answer.status != 201:
            return None
        body = answer.body
        assert body["resource"] == resource_of(target) and body["holder"] == holder, body
        grant = Grant(
            target=target,
            epoch=body["epoch"],
            holder=holder,
            token=body["token"],
            replica=replica.name,
            sent=sent,
            received=received,
            granted_at=body["expires_at"] - body["ttl_s"] - self.clock_offset,
            terms=[Term(sent, received, body["expires_at"] - self.clock_offset)],
        )
        self.grants.append(grant)
        return grant

    async def renew(self, rng: random.Random, grant: Grant) -> None:
        sent = time.time()
        answer = await self.api.renew(rng.choice(self.replicas), grant.token, rng.choice(TTLS_S))
        received = time.time()
        self.outcomes["renew"][answer.outcome] += 1
        if answer.status == 200:
            assert answer.body["epoch"] == grant.epoch, (answer, grant)
            expires_at = answer.body["expires_at"] - self.clock_offset
            grant.terms.append(Term(sent, received, expires_at))

    async def release(self, rng: random.Random, grant: Grant) -> None:
        sent = time.time()
        answer = await self.api.release(rng.choice(self.replicas), grant.token)
        received = time.time()
        self.outcomes["release"][answer.outcome] += 1
        if answer.status == 200:
            grant.release_sent, grant.release_received = sent, received

    async def write(self, rng: random.Random, grant: Grant, *, by_holder: bool) -> None:
        replica = rng.choice(self.replicas)
        kind = rng.choice(("rule", "order"))
        key = f"{grant.target}-{grant.epoch}-{uuid.uuid4().hex[:12]}"
        content = {"holder": grant.holder, "epoch": grant.epoch, "key": key}
        sent = time.time()
        if kind == "rule":
            answer = await self.api.put_rule(replica, grant.target, grant.token, key, content)
        else:
            answer = await self.api.place_order(
                replica, grant.target, grant.token, key, {"qty": 1, **content}
            )
        received = time.time()
        self.outcomes["write"][answer.outcome] += 1
        effect_id = answer.headers.get("fence-effect-id")
        if effect_id is None and isinstance(answer.body, dict):
            effect_id = answer.body.get("effect_id")
        self.writes.append(
            Write(
                grant.target,
                grant.epoch,
                grant.holder,
                by_holder,
                replica.name,
                kind,
                key,
                sent,
                received,
                answer.status,
                answer.outcome,
                effect_id,
            )
        )

    async def operator(self, stop: asyncio.Event) -> None:
        """What an operator does for the rule route, which has no probe: once an UNKNOWN
        rule write is well past its deadline, look for its key in the upstream's records."""
        while not stop.is_set():
            await self.resolve_overdue_rules()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    async def resolve_overdue_rules(self) -> None:
        replica = self.replicas[0]
        unknown = await self.api.effects(replica, state="UNKNOWN")
        overdue = [
            e
            for e in unknown
            if e["route"] == "put-rule"
            and time.time() + self.clock_offset > e["deadline"] + 2 * DEADLINE_MARGIN_S
        ]
        if not overdue:
            return
        landed = {e["idempotency_key"] for e in await self.api.upstream_effects()}
        for effect in overdue:
            outcome = "committed" if effect["idempotency_key"] in landed else "not_committed"
            answer = await self.api.resolve(
                replica,
                effect["id"],
                outcome,
                f"key {'found' if outcome == 'committed' else 'absent'} upstream",
            )
            assert answer.status == 200 or answer.code == "effect_settled", answer
            self.resolved[effect["id"]] = outcome

    async def settle(self) -> None:
        """Wait (bounded) until nothing is in doubt: probes settle orders, the operator rules."""

        async def nothing_in_doubt() -> bool:
            await self.resolve_overdue_rules()
            replica = self.replicas[0]
            in_doubt = await self.api.effects(replica, state="UNKNOWN")
            in_doubt += await self.api.effects(replica, state="DISPATCHING")
            return not in_doubt

        await eventually(
            "every effect in doubt to be settled", nothing_in_doubt, SETTLE_TIMEOUT_S, 0.25
        )


def check_grants(grants: list[Grant]) -> list[str]:
    problems = []
    by_resource: dict[str, list[Grant]] = defaultdict(list)
    for grant in grants:
        by_resource[grant.resource].append(grant)
    for resource, granted in by_resource.items():
        granted.sort(key=lambda g: g.epoch)
        epochs = [g.epoch for g in granted]
        # No revocations here: every grant takes the next epoch, none is issued twice.
        if epochs != list(range(1, len(epochs) + 1)):
            problems.append(f"{resource}: epochs granted {epochs}, not 1..{len(epochs)} once each")
        for earlier in granted:
            for later in granted:
                if earlier.received < later.sent and earlier.epoch >= later.epoch:
                    problems.append(
                        f"{resource}: epoch {later.epoch} granted after epoch {earlier.epoch} "
                        "had been answered"
                    )
        for previous, following in itertools.pairwise(granted):
            released = (
                previous.release_sent is not None and previous.release_sent <= following.received
            )
            # The grant decided on whichever of these expiries was in force then.
            live_until = min(previous.expiries_in_force(following.sent, following.received))
            if not released and following.granted_at < live_until - TOLERANCE_S:
                problems.append(
                    f"{resource}: epoch {following.epoch} granted at {following.granted_at:.3f} "
                    f"({following.replica}) while epoch {previous.epoch} ({previous.replica}) "
                    f"was live until {live_until:.3f} and not released"
                )
    return problems


def check_writes(
    grants: list[Grant], writes: list[Write], tolerance_s: float
) -> tuple[list[str], list[Write]]:
    """Problems, and the writes that were certainly under a dead lease when sent.
    `tolerance_s`: how far the store's clock, as converted, may be off the test's."""
    problems = []
    dead: list[Write] = []
    by_key = {(g.target, g.epoch): g for g in grants}
    for write in writes:
        if write.outcome not in WRITE_OUTCOMES:
            problems.append(f"unexpected outcome {write.outcome}: {write}")
        grant = by_key[(write.target, write.epoch)]
        successors = [
            g
            for g in grants
            if g.target == write.target and g.epoch > write.epoch and g.received < write.sent
        ]
        released = grant.release_received is not None and grant.release_received < write.sent
        if successors or released:
            dead.append(write)
            if write.outcome != "stale_epoch":
                why = f"epoch {successors[0].epoch} granted" if successors else "released"
                problems.append(
                    f"write under a superseded lease ({why}) got {write.outcome}: {write}"
                )
            continue
        # Expired when sent, whichever renewal may have been in force at admission.
        expired = max(grant.expiries_in_force(write.sent, math.inf))
        if write.sent > expired + tolerance_s:
            dead.append(write)
            if write.outcome not in ("lease_expired", "stale_epoch"):
                problems.append(
                    f"write sent {write.sent - expired:.3f}s after its lease expired "
                    f"got {write.outcome}: {write}"
                )
    return problems, dead


def check_upstream(
    grants: list[Grant],
    writes: list[Write],
    upstream: list[dict[str, Any]],
    committed_unknown: set[str],
) -> list[str]:
    problems = []
    last_epoch: dict[str, tuple[int, int]] = {}
    for effect in upstream:  # in the upstream's own commit order
        if effect["fence_epoch"] is None:
            problems.append(f"upstream write without Fence-Epoch: {effect}")
            continue
        epoch = int(effect["fence_epoch"])
        target = effect["target"]
        seen = last_epoch.get(target)
        if seen is not None and epoch < seen[0]:
            problems.append(
                f"upstream applied a write of epoch {epoch} on {target} (seq {effect['seq']}) "
                f"after one of epoch {seen[0]} (seq {seen[1]})"
            )
        last_epoch[target] = (epoch, effect["seq"])
        for grant in grants:
            if grant.target == target and grant.epoch > epoch and grant.received < effect["at"]:
                problems.append(
                    f"upstream applied a write of epoch {epoch} on {target} at {effect['at']:.3f}, "
                    f"after epoch {grant.epoch} was granted (answered at {grant.received:.3f})"
                )
    keys = Counter(effect["idempotency_key"] for effect in upstream)
    duplicated = {key: n for key, n in keys.items() if n > 1}
    if duplicated:
        problems.append(f"the upstream applied some writes more than once: {duplicated}")
    epochs = {write.key: write.epoch for write in writes}
    expected = {write.key for write in writes if write.outcome == "ok"} | committed_unknown
    if set(keys) != expected:
        problems.append(
            f"upstream writes differ from those the proxy admitted and committed: "
            f"missing {sorted(expected - set(keys))}, unexpected {sorted(set(keys) - expected)}"
        )
    for effect in upstream:
        key = effect["idempotency_key"]
        if key in epochs and int(effect["fence_epoch"] or 0) != epochs[key]:
            problems.append(
                f"{key} landed under epoch {effect['fence_epoch']}, sent under {epochs[key]}"
            )
    return problems


async def test_random_workload_through_random_replicas(pg_url: str, fleet: Fleet) -> None:
    fleet.start_upstream()
    replicas = fleet.start_replicas(pg_url, [None, None, None], timeout_s=0.3, settle_s=0.5)
    clock_offset, uncertainty = await authority_clock_offset(pg_url)
    async with api_for(fleet) as api:
        workload = Workload(api, replicas, SEED, clock_offset)
        await workload.run(WORKLOAD_S)
        await workload.settle()
        upstream = await api.upstream_effects()
        committed_unknown = set()
        for write in workload.writes:
            if write.outcome == "outcome_unknown":
                assert write.effect_id is not None, write
                receipt = await api.effect(replicas[1], write.effect_id)
                if receipt["state"] == "COMMITTED":
                    committed_unknown.add(write.key)

    summary = {kind: dict(counts) for kind, counts in workload.outcomes.items()}
    print(f"grants={len(workload.grants)} writes={len(workload.writes)} outcomes={summary}")
    for kind, allowed in (
        ("acquire", ACQUIRE_OUTCOMES),
        ("renew", RENEW_OUTCOMES),
        ("release", RELEASE_OUTCOMES),
    ):
        assert set(workload.outcomes[kind]) <= allowed, (kind, summary)

    problems = check_grants(workload.grants)
    write_problems, dead = check_writes(workload.grants, workload.writes, TOLERANCE_S + uncertainty)
    problems += write_problems
    problems += check_upstream(workload.grants, workload.writes, upstream, committed_unknown)
    assert not problems, "\n".join(problems[:40])

    # The run exercised what it claims to: takeovers on every resource, many writes
    # under dead leases refused by every replica, and writes that did land.
    for target in TARGETS:
        assert sum(g.target == target for g in workload.grants) >= 5, summary
    assert len(dead) >= 20, summary
    assert {w.replica for w in dead} == {r.name for r in replicas}, summary
    assert sum(w.outcome == "stale_epoch" and not w.by_holder for w in dead) >= 5, summary
    assert sum(w.outcome == "lease_expired" for w in dead) >= 5, summary
    assert workload.outcomes["write"]["ok"] >= 50, summary
    assert {int(e["fence_epoch"]) for e in upstream if e["target"] == "a"} != {1}, summary


async def kill_mid_flight(
    api: Api, holder_via: Proxy, victim: Proxy, sku: str, delay_ms: int
) -> tuple[str, str, dict[str, Any]]:
    """Take a lease, send a slow order through `victim`, SIGKILL `victim` once the order
    has reached the upstream. Returns the token, the order's key and its DISPATCHING
    effect (which the upstream commits `delay_ms` after it arrived)."""
    lease = await api.acquire(holder_via, resource_of(sku), "killer", ttl_s=30)
    assert lease.status == 201, lease
    token = lease.body["token"]
    key = f"{sku}-{uuid.uuid4().hex}"
    in_flight = asyncio.create_task(
        api.place_order(victim, sku, token, key, extra_headers={"Demo-Delay-Ms": str(delay_ms)})
    )

    async def arrived() -> bool:
        seen = await api.upstream_headers_seen()
        return bool(seen["last_headers"].get("idempotency-key") == key)

    await eventually("the slow order to reach the upstream", arrived, 10.0)
    [effect] = await api.effects(holder_via, resource=resource_of(sku), state="DISPATCHING")
    assert effect["instance_id"] == victim.instance_id, effect
    victim.process.kill()
    with pytest.raises(aiohttp.ClientError):
        await in_flight
    return token, key, effect


async def wait_committed(api: Api, via: Proxy, effect_id: str) -> dict[str, Any]:
    """Poll the receipt until a probe settled it COMMITTED; the receipt with its events."""
    observed: list[dict[str, Any]] = []

    async def committed() -> bool:
        observed.append(await api.effect(via, effect_id))
        return bool(observed[-1]["state"] == "COMMITTED")

    await eventually("another replica to sweep and probe the effect", committed, 20.0, 0.1)
    return observed[-1]


async def test_sigkill_mid_flight_is_swept_by_another_replica_and_probed(
    pg_url: str, fleet: Fleet
) -> None:
    fleet.start_upstream()
    r0, victim, r2 = fleet.start_replicas(pg_url, [None, None, None], timeout_s=3.0)
    survivors = {r0.instance_id, r2.instance_id}
    async with api_for(fleet) as api:
        token, key, effect = await kill_mid_flight(api, r0, victim, "kill", delay_ms=1500)

        # Left alone while it may still be in flight: another write of the holder waits.
        busy = await api.place_order(r2, "kill", token, f"kill-{uuid.uuid4().hex}")
        assert busy.code == "effect_in_flight", busy

        receipt = await wait_committed(api, r2, effect["id"])
        assert receipt["settled_by"] == "probe", receipt
        events = receipt["events"]
        recovers = [e for e in events if e["kind"] == "recover"]
        assert recovers, events
        for recover in recovers:  # exactly one: see test_concurrent_sweeps_record_one_recovery
            assert recover["actor"] in survivors, events
            assert recover["conclusion"] == "unknown", events
            assert recover["at"] >= effect["deadline"] + DEADLINE_MARGIN_S, (effect, events)
        probes = [e for e in events if e["kind"] == "probe"]
        assert probes and probes[-1]["conclusion"] == "committed", events
        assert probes[-1]["actor"] in survivors, events

        orders = [e for e in await api.upstream_effects() if e["target"] == "kill"]
        assert [(o["idempotency_key"], o["fence_epoch"]) for o in orders] == [(key, "1")]

        # The holder's retry of the same operation through yet another replica is a replay.
        retry = await api.place_order(r2, "kill", token, key)
        assert retry.status == 200, retry
        assert retry.headers.get("idempotent-replayed") == "true", retry
        again = await api.place_order(r0, "kill", token, f"kill-{uuid.uuid4().hex}")
        assert again.status == 201, again
        orders = [e for e in await api.upstream_effects() if e["target"] == "kill"]
        assert len(orders) == 2 and orders[0]["idempotency_key"] == key, orders


async def test_concurrent_sweeps_record_one_recovery(pg_url: str, fleet: Fleet) -> None:
    """Replicas that sweep the same overdue effect at once: one turns it UNKNOWN,
    and only that one records having done so.

    The overlap is forced, not hoped for: the test holds the effect's row lock past
    its deadline while the survivors sweep. A sweep skips an effect whose row another
    transaction holds (SKIP LOCKED) rather than queueing behind it;
    that the sweeps really ran meanwhile shows on a second, unlocked overdue effect
    (a "ghost" left by an instance that no longer exists), which they do turn
    UNKNOWN (and the probe then settles). Once the lock is gone exactly one recovery is recorded.
    """
    fleet.start_upstream()
    r0, victim, r2 = fleet.start_replicas(pg_url, [None, None, None], timeout_s=1.0)
    async with api_for(fleet) as api:
        holder = await asyncpg.connect(pg_url)
        watcher = await asyncpg.connect(pg_url)
        try:
            # Held 2 s: the victim must be killed before the upstream answers it, and
            # the test sees the write arrive, reads the effect, then kills, all polled.
            # Past the victim's 1 s timeout: only a victim not killed would see it end.
            _, _, effect = await kill_mid_flight(api, r0, victim, "sweep", delay_ms=2000)
            async with holder.transaction():
                await holder.execute("SELECT 1 FROM effects WHERE id = $1 FOR UPDATE", effect["id"])
                ghost = f"eff_ghost_{uuid.uuid4().hex}"
                await watcher.execute(
                    "INSERT INTO effects (id, route, resource, holder, epoch, fingerprint,"
                    " method, path, state, instance_id, created_at, deadline)"
                    " SELECT $1, route, 'r:ghost', holder, epoch, fingerprint, method, path,"
                    " 'DISPATCHING', 'ghost-instance', created_at, deadline - 60"
                    " FROM effects WHERE id = $2",
                    ghost,
                    effect["id"],
                )

                async def a_sweep_ran_while_locked() -> bool:
                    states = {
                        row["id"]: row["state"]
                        for row in await watcher.fetch(
                            "SELECT id, state FROM effects WHERE id = ANY($1::text[])",
                            [ghost, effect["id"]],
                        )
                    }
                    assert states[effect["id"]] == "DISPATCHING", states
                    # Swept, then (probed and) settled: either way no longer DISPATCHING.
                    return bool(states[ghost] != "DISPATCHING")

                await eventually(
                    "a sweep to run while the effect's row is locked",
                    a_sweep_ran_while_locked,
                    15.0,
                )
        finally:
            await holder.close()
            await watcher.close()
        receipt = await wait_committed(api, r0, effect["id"])
    recovers = [e for e in receipt["events"] if e["kind"] == "recover"]
    assert len(recovers) == 1, f"one sweep turned the effect UNKNOWN, yet: {recovers}"
    assert recovers[0]["actor"] in {r0.instance_id, r2.instance_id}, recovers


SKEW_S = 3600.0
# The leases that must still be live several requests after their grant (refused to
# another holder, a write that needs the upstream timeout left on the lease, a renewal):
# long enough for a loaded machine; the first one is renewed shorter to see it expire.
HELD_S = 10.0


async def test_replicas_with_skewed_clocks_agree(pg_url: str, fleet: Fleet) -> None:
    fleet.start_upstream()
    normal, ahead, behind = fleet.start_replicas(pg_url, [None, SKEW_S, -SKEW_S], timeout_s=0.3)
    clock_offset, _ = await authority_clock_offset(pg_url)
    async with api_for(fleet) as api:
        for skewed, target in ((ahead, "ahead"), (behind, "behind")):
            assert skewed.skew_s is not None
            await check_skewed(api, normal, skewed, skewed.skew_s, target, clock_offset)
        upstream = await api.upstream_effects()
        landed = sorted((e["target"], e["fence_epoch"]) for e in upstream)
        assert landed == [("ahead", "1"), ("behind", "1")], upstream


async def check_skewed(
    api: Api, normal: Proxy, skewed: Proxy, skew_s: float, target: str, clock_offset: float
) -> None:
    """`skewed` (its process clock `skew_s` off) judges `normal`'s lease on r:`target`
    exactly as `normal` does, by the store's clock (`clock_offset` off the test's)."""
    resource = resource_of(target)

    def authority_now() -> float:
        return time.time() + clock_offset

    # The wrapper really moved the process's clock: aiohttp dates responses by time.time().
    for proxy, offset in ((normal, 0.0), (skewed, skew_s)):
        answer = await api.lease(proxy, resource)
        date = parsedate_to_datetime(answer.headers["date"]).timestamp()
        assert abs(date - (time.time() + offset)) < 60, (proxy.name, answer.headers["date"])

    granted = await api.acquire(normal, resource, "first", ttl_s=HELD_S)
    assert granted.status == 201, granted
    token = granted.body["token"]
    expires_at = granted.body["expires_at"]

    held = await api.acquire(skewed, resource, "second", ttl_s=2.0)
    assert held.code == "lease_held", held
    assert held.body["current_epoch"] == 1, held
    view = await api.lease(skewed, resource)
    assert view.body["live"] is True and view.body["expires_at"] == expires_at, view

    written = await api.put_rule(skewed, target, token, f"{target}-1", {"by": "first"})
    assert written.status == 200, written
    assert written.headers["fence-epoch"] == "1", written

    renewed = await api.renew(skewed, token, 1.0)
    assert renewed.status == 200, renewed
    assert abs(renewed.body["expires_at"] - (authority_now() + 1.0)) < 1.0, renewed
    assert renewed.body["ttl_s"] == pytest.approx(1.0, abs=0.1), renewed

    async def expired() -> bool:
        return (await api.lease(normal, resource)).body["live"] is False

    await eventually(f"the lease on {resource} to expire", expired, 10.0)
    late = await api.place_order(skewed, target, token, f"{target}-late")
    assert late.code == "lease_expired", late
    assert (await api.lease(skewed, resource)).body["live"] is False

    taken = await api.acquire(skewed, resource, "second", ttl_s=HELD_S)
    assert taken.status == 201, taken
    assert taken.body["epoch"] == 2, taken
    assert abs(taken.body["expires_at"] - (authority_now() + HELD_S)) < 1.0, taken
    stale = await api.place_order(skewed, target, token, f"{target}-stale")
    assert stale.code == "stale_epoch", stale
    blocked = await api.acquire(normal, resource, "first", ttl_s=2.0)
    assert blocked.code == "lease_held", blocked
