"""The nemesis's processes and its run: workers, replicas, faults, then the judge.

One demo upstream (its own process, its own SQLite file: the only evidence), N proxy
replicas (processes, `tests/integration/replicas/conftest.py`'s `Fleet`) on one store,
workers as asyncio tasks of this process speaking HTTP to the replicas, and the
nemesis, a task that applies the schedule's faults to the replicas' processes and the
store. After the deadline every fault is undone, the workers settle what they still
hold in doubt (bounded), the processes stop, and the judge reads the upstream's file.

A worker behaves as a real one: a new Idempotency-Key per operation, the same key
again after any answer that did not say "applied" (an unknown outcome, a refusal), a
new lease after losing one, its requests to whichever replica the schedule names.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlsplit

import aiohttp

from core import failpoints
from demo.upstream import DELAY_HEADER
from tests import pg
from tests.integration.replicas.conftest import Answer, Fleet, Proxy, call
from tests.nemesis.judge import (
    Applied,
    Arrival,
    Attempt,
    Grant,
    Told,
    Violation,
    judge,
    resource_of,
)
from tests.nemesis.patroni import PatroniCluster
from tests.nemesis.pgrelay import Action, PgRelay
from tests.nemesis.schedule import Fault, FaultKind, Op, OpKind, Schedule, make_schedule
from tests.pgstandby import StandbyPair

UPSTREAM_TIMEOUT_S = 0.5
SETTLE_S = 0.5
# A worker's own patience with one request: longer than a fault's pause, so a paused
# replica's answer still arrives, and shorter than a run.
REQUEST_TIMEOUT_S = 6.0
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, connect=2)
ACQUIRE_ATTEMPTS = 6
SETTLE_PHASE_S = 25.0
READY_TIMEOUT_S = 30.0
# How often the operator of the settling looks for effects in conflict.
OPERATOR_EVERY_S = 1.0
# How long the nemesis waits for the transaction a relay fault is armed for.
RELAY_WAIT_S = 3.0
# The `cancelled` fault: the replica's stop grace, shorter than the slow write's delay,
# which is shorter than the upstream timeout (an upstream that applies a write after the
# timeout and the settle window would make the probe's "not committed" untrue), so the
# grace ends while the write waits on the upstream. What is left of the delay once the
# nemesis has seen the write arrive (polling every POLL_S) and sent its SIGTERM is the
# margin the replica has to end its grace and cancel the handler: about 0.4 s. A loaded
# machine can still miss it (the upstream answers first and the replica stops
# normally): the fault is then armed again, while the run lasts.
CANCEL_GRACE_S = 0.02
SLOW_WRITE_MS = 450
POLL_S = 0.01
# How long it waits for a worker's write made slow to reach the upstream (a write refused
# before it is sent never does: another is made slow), for the replica to stop itself
# once told to stop, and for it to exit once continued.
SLOW_WRITE_WAIT_S = 5.0
SLOW_WRITE_ARRIVAL_S = 1.0
STOPPING_WAIT_S = 5.0
# Refusals after which the worker's token is no good: it takes a new lease.
LOST_LEASE = frozenset({"stale_epoch", "lease_expired", "invalid_token", "lease_too_short"})
# Refusals that forwarded nothing; `store_unavailable` only without an effect (before
# dispatch), `upstream_unreachable` says so of its effect. Not `conflicting_evidence`:
# it also answers a request that was sent, whose answer contradicts a settled state.
NOTHING_SENT = LOST_LEASE | {
    "resource_blocked",
    "effect_in_flight",
    "request_in_progress",
    "recovery_window",
    "idempotency_key_reused",
    "rate_limited",
    "overloaded",
    "internal_error",
    "upstream_unreachable",
    "wrong_resource",
}


def classify(answer: Answer | None) -> Told:
    """What an answer to a fenced write claims (None: no answer at all)."""
    if answer is None:
        return Told.UNKNOWN
    if 200 <= answer.status < 300:
        return Told.APPLIED
    code = answer.code
    if code == "effect_settled":
        return Told.NOT_APPLIED
    if code == "store_unavailable":
        return Told.UNKNOWN if effect_id_of(answer) else Told.NOT_SENT
    if code in NOTHING_SENT:
        return Told.NOT_SENT
    return Told.UNKNOWN


def effect_id_of(answer: Answer) -> str | None:
    if isinstance(answer.body, dict) and isinstance(answer.body.get("effect_id"), str):
        found: str = answer.body["effect_id"]
        return found
    return answer.headers.get("fence-effect-id")


@dataclass
class History:
    """What the workers were told, and what happened to the processes, in order."""

    started: float = field(default_factory=time.monotonic)
    grants: list[Grant] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    # The failpoints replicas stopped themselves at: a fault armed for one that was never
    # reached tested nothing, and the run says so.
    stops: Counter[str] = field(default_factory=Counter)
    events: list[tuple[float, str]] = field(default_factory=list)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def note(self, text: str) -> None:
        self.events.append((self.now(), text))

    def describe(self) -> str:
        lines = [f"{at:8.3f} {text}" for at, text in self.events]
        return "\n".join(lines)


@dataclass
class Lease:
    resource: str
    token: str
    epoch: int
    expires_at: float  # monotonic, this process's estimate


class Cluster:
    """The replicas a worker may call, as they are now (a killed one is replaced), and
    the relay in front of their database, if any."""

    def __init__(self, fleet: Fleet, replicas: list[Proxy], relay: PgRelay | None) -> None:
        self.fleet = fleet
        self.replicas = replicas
        self.relay = relay
        self.down: set[int] = set()
        # Replicas stopped at a failpoint, or armed for one, and the task that continues them.
        self.watchers: list[asyncio.Task[None]] = []
        self.armed: set[int] = set()  # started with a failpoint that has not fired yet
        # Replicas whose next fenced write is made slow, and the key each one slowed.
        self.slow_next: set[int] = set()
        self.slowed: dict[int, str] = {}

    def url(self, index: int) -> str:
        return self.replicas[index].url

    async def kill(self, index: int) -> None:
        self.down.add(index)
        self.replicas[index].process.kill()

    async def restart(
        self, index: int, env: dict[str, str] | None = None, serve_args: tuple[str, ...] = ()
    ) -> None:
        old = self.replicas[index]
        proxy = self.fleet.spawn_proxy(
            old.name, old.config_path, old.port, env=env, serve_args=serve_args
        )
        self.replicas[index] = proxy
        if env:
            self.armed.add(index)
        else:
            self.armed.discard(index)
        await self._wait_ready(proxy)
        self.down.discard(index)

    async def _wait_ready(self, proxy: Proxy) -> None:
        """Until it answers /readyz, or has stopped itself at its failpoint (a worker's
        write can reach it before the readiness check does)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        async with _session() as session:
            while time.monotonic() < deadline:
                if not proxy.process.is_running():
                    raise proxy.process.failure("exited while starting")
                if proxy.process.is_stopped():
                    return
                try:
                    answer = await call(session, "GET", f"{proxy.url}/_fence/readyz")
                    if answer.status == 200:
                        return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)
        raise proxy.process.failure(f"not ready after {READY_TIMEOUT_S:g} s")

    async def arm_failpoint(self, index: int, point: str, hold_s: float, history: History) -> None:
        """Restart replica `index` (SIGTERM: its requests end as at any rollout) with
        `point` enabled once, and leave a task that continues it `hold_s` after it stops
        itself there."""
        self.replicas[index].process.terminate()
        await self.restart(index, {failpoints.ENV: f"{point}:once"})
        self.watchers.append(
            asyncio.create_task(self._continue(index, self.replicas[index], point, hold_s, history))
        )

    async def _continue(
        self, index: int, proxy: Proxy, point: str, hold_s: float, history: History
    ) -> None:
        # Until the replica stops at the point, is replaced, or the run ends (cancelled).
        while proxy.process.is_running() and not proxy.process.is_stopped():  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # polled: /proc is the only one to tell
        if not proxy.process.is_running():
            return
        self.armed.discard(index)
        history.stops[point] += 1
        history.note(f"NEMESIS r{index} stopped itself at {point}; held {hold_s:.2f} s")
        try:
            await asyncio.sleep(hold_s)
        finally:
            proxy.process.resume()
        history.note(f"NEMESIS r{index} continued from {point}")

    def slow_write_headers(self, index: int, key: str) -> dict[str, str]:
        """The headers that make this write slow upstream, if it is the one the nemesis
        waits for on replica `index` (taken by one write only)."""
        if index not in self.slow_next:
            return {}
        self.slow_next.discard(index)
        self.slowed[index] = key
        return {DELAY_HEADER: str(SLOW_WRITE_MS)}

    async def cancel_in_flight(
        self, index: int, hold_s: float, deadline: float, history: History
    ) -> None:
        """Restart replica `index` with `cancelled` enabled once and a short stop grace,
        make one of its fenced writes slow upstream, and tell it to stop (SIGTERM) once
        the upstream has that write: the grace ends mid-dispatch, the handler is
        cancelled and the replica stops itself before its receipt. Continued after
        `hold_s` (or at the run's deadline), it finishes stopping and is started again
        as it was. A replica that stopped without reaching `cancelled` is cut off again,
        until the run's deadline."""
        try:
            while time.monotonic() < deadline:
                reached = await self._cut_off(index, deadline, history)
                if reached is None:
                    return
                if reached:
                    break
            else:
                return
            proxy = self.replicas[index]
            held = max(0.0, min(hold_s, deadline - time.monotonic()))
            history.stops[failpoints.CANCELLED] += 1
            history.note(f"NEMESIS r{index} stopped itself at cancelled; held {held:.2f} s")
            try:
                await asyncio.sleep(held)
            finally:
                proxy.process.resume()
            history.note(f"NEMESIS r{index} continued from cancelled")
            await _poll_until(lambda: not proxy.process.is_running(), STOPPING_WAIT_S)
        finally:
            self.slow_next.discard(index)
            self.slowed.pop(index, None)
            self.replicas[index].process.terminate()  # exited, unless it never stopped
            await self.restart(index)
            history.note(f"NEMESIS r{index} ready again")

    async def _cut_off(self, index: int, deadline: float, history: History) -> bool | None:
        """One attempt of `cancel_in_flight`'s cut-off: whether the replica stopped itself
        at `cancelled` (None: no write made slow reached the upstream in time)."""
        self.replicas[index].process.terminate()
        await self.restart(
            index,
            {failpoints.ENV: f"{failpoints.CANCELLED}:once"},
            ("--grace", str(CANCEL_GRACE_S)),
        )
        proxy = self.replicas[index]
        key = await self._slow_write_upstream(index, deadline)
        if key is None:
            history.note(f"NEMESIS r{index}: no write made slow reached the upstream")
            return None
        os.kill(proxy.process.pid, signal.SIGTERM)  # not waited for: it stops on the way
        history.note(f"NEMESIS r{index} told to stop, {key} upstream")
        await _poll_until(
            lambda: proxy.process.is_stopped() or not proxy.process.is_running(),
            STOPPING_WAIT_S,
        )
        if proxy.process.is_stopped():
            return True
        history.note(f"NEMESIS r{index} stopped without reaching cancelled")
        return False

    async def _slow_write_upstream(self, index: int, deadline: float) -> str | None:
        """The key of a worker's write to replica `index`, made slow, once the upstream
        has it; None if none got there in time."""
        upstream_db = self.fleet.tmp_path / "upstream.db"
        give_up = min(deadline, time.monotonic() + SLOW_WRITE_WAIT_S)
        while time.monotonic() < give_up:
            after = last_arrival(upstream_db)
            self.slowed.pop(index, None)
            self.slow_next.add(index)
            await _poll_until(lambda: index in self.slowed, give_up - time.monotonic())
            key = self.slowed.get(index)
            if key is None:
                return None
            arrived = functools.partial(slow_write_arrived, upstream_db, key, after)
            if await _poll_until(arrived, SLOW_WRITE_ARRIVAL_S):
                return key
        return None

    async def release_all(self) -> None:
        """The end of the faults: every failpoint watcher ends, and every replica runs."""
        for watcher in self.watchers:
            watcher.cancel()
        await asyncio.gather(*self.watchers, return_exceptions=True)
        for proxy in self.replicas:
            proxy.process.resume()
        # A point that never fired would stop its replica in the middle of the settling.
        for index in sorted(self.armed):
            self.replicas[index].process.terminate()
            await self.restart(index)
        if self.relay is not None:
            self.relay.disarm()
            self.relay.blackhole(False)


class Worker:
    def __init__(
        self,
        name: str,
        ops: tuple[Op, ...],
        targets: list[str],
        ttl_s: float,
        cluster: Cluster,
        session: aiohttp.ClientSession,
        history: History,
    ) -> None:
        self.name = name
        self.ops = ops
        self.targets = targets
        self.ttl_s = ttl_s
        self.cluster = cluster
        self.session = session
        self.history = history
        self.lease: Lease | None = None
        self.pending: dict[str, str] = {}  # key -> target, oldest first
        self.written = 0

    async def _call(
        self, replica: int, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> Answer | None:
        try:
            return await call(
                self.session,
                method,
                self.cluster.url(replica) + path,
                json_body=body,
                headers=headers,
            )
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def run(self, deadline: float) -> None:
        for op in self.ops:
            if time.monotonic() >= deadline:
                return
            self.history.ops[op.kind] += 1
            await self.step(op)

    async def step(self, op: Op) -> None:
        if op.kind is OpKind.WRITE:
            key = f"{self.name}-{self.written}"
            self.written += 1
            self.pending[key] = self.targets[op.resource]
            await self.send(key, op.replica)
        elif op.kind is OpKind.RETRY:
            if self.pending:
                await self.send(next(iter(self.pending)), op.replica)
        elif op.kind is OpKind.RENEW:
            await self.renew(op.replica)
        elif op.kind is OpKind.RELEASE:
            await self.release(op.replica)
        elif op.kind is OpKind.EXPIRE:
            if self.lease is not None:
                # Stall past the lease's end, then carry on with the token as it is.
                await asyncio.sleep(max(0.0, self.lease.expires_at - time.monotonic()) + op.seconds)
        else:
            await asyncio.sleep(op.seconds)

    async def renew(self, replica: int) -> None:
        if self.lease is None:
            return
        answer = await self._call(
            replica,
            "POST",
            "/_fence/v1/leases/renew",
            {"ttl_s": self.ttl_s},
            {"Fence-Token": self.lease.token},
        )
        outcome = "no answer" if answer is None else answer.outcome
        self.history.note(f"{self.name} renew e{self.lease.epoch} via r{replica}: {outcome}")
        if answer is not None and answer.status == 200:
            self.lease.expires_at = time.monotonic() + self.ttl_s
        elif answer is not None and answer.code in LOST_LEASE:
            self.lease = None

    async def release(self, replica: int) -> None:
        if self.lease is None:
            return
        answer = await self._call(
            replica, "POST", "/_fence/v1/leases/release", {}, {"Fence-Token": self.lease.token}
        )
        outcome = "no answer" if answer is None else answer.outcome
        self.history.note(f"{self.name} release e{self.lease.epoch} via r{replica}: {outcome}")
        # Released or not, this worker is done with it: an unanswered release runs out.
        self.lease = None

    async def acquire(self, resource: str, replica: int) -> bool:
        if self.lease is not None and self.lease.resource == resource:
            return True
        if self.lease is not None:
            await self.release(replica)
        for attempt in range(ACQUIRE_ATTEMPTS):
            at = (replica + attempt) % len(self.cluster.replicas)
            answer = await self._call(
                at,
                "POST",
                "/_fence/v1/leases",
                {"resource": resource, "holder": self.name, "ttl_s": self.ttl_s},
                {},
            )
            if answer is not None and answer.status == 201:
                epoch = int(answer.body["epoch"])
                self.lease = Lease(
                    resource, answer.body["token"], epoch, time.monotonic() + self.ttl_s
                )
                grant = Grant(self.name, resource, epoch, f"r{at}", self.history.now())
                self.history.grants.append(grant)
                self.history.note(f"{self.name} granted {resource} e{epoch} via r{at}")
                return True
            outcome = "no answer" if answer is None else answer.outcome
            self.history.note(f"{self.name} acquire {resource} via r{at}: {outcome}")
            await asyncio.sleep(0.05 + 0.1 * attempt)
        return False

    async def send(self, key: str, replica: int) -> Told | None:
        """One attempt of `key` (acquiring first if need be); None if no lease was had."""
        target = self.pending[key]
        if not await self.acquire(resource_of(target), replica):
            return None
        assert self.lease is not None
        lease = self.lease
        headers = {"Fence-Token": lease.token, "Idempotency-Key": key}
        answer: Answer | None = None
        told = Told.UNKNOWN
        try:
            headers |= self.cluster.slow_write_headers(replica, key)
            answer = await self._call(
                replica, "POST", f"/orders/{target}", {"qty": 1, "key": key}, headers
            )
            told = classify(answer)
        finally:
            # Recorded even when the run's end cancels the request: it may have been sent.
            answer_epoch = None
            if answer is not None and told is Told.APPLIED and isinstance(answer.body, dict):
                fenced = answer.body.get("fence_epoch")
                answer_epoch = fenced if isinstance(fenced, str) else None
            self.history.attempts.append(
                Attempt(
                    self.name,
                    key,
                    target,
                    lease.epoch,
                    f"r{replica}",
                    told,
                    None if answer is None else answer.status,
                    None if answer is None else answer.code,
                    None if answer is None else effect_id_of(answer),
                    answer_epoch,
                    self.history.now(),
                )
            )
            outcome = "no answer" if answer is None else answer.outcome
            self.history.note(
                f"{self.name} write {key} on {target} e{lease.epoch} via r{replica}: "
                f"{outcome} -> {told}"
            )
        if told is Told.APPLIED:
            del self.pending[key]
        elif answer is not None and answer.code in LOST_LEASE:
            self.lease = None
        elif answer is not None and answer.code in ("resource_blocked", "recovery_window"):
            await asyncio.sleep(0.2)
        return told

    async def settle(self, deadline: float) -> None:
        """After the faults: every key not yet applied, again, until applied or time is up."""
        turn = 0
        while self.pending and time.monotonic() < deadline:
            key = next(iter(self.pending))
            told = await self.send(key, turn % len(self.cluster.replicas))
            turn += 1
            if told is not Told.APPLIED:
                await asyncio.sleep(0.1)
        if self.lease is not None:
            await self.release(0)


async def _operator(
    cluster: Cluster, session: aiohttp.ClientSession, history: History, upstream_db: Path
) -> None:
    """An operator paged for effects in conflict (only an operator settles those): once the
    faults are over and what was in flight has landed, each is resolved by what the
    upstream's own records say (whether that effect reached it), as a careful operator
    would. Runs until cancelled."""
    admin = {"Authorization": f"Bearer {cluster.fleet.admin_token}"}
    resolved: set[str] = set()
    while True:
        await asyncio.sleep(OPERATOR_EVERY_S)
        url = cluster.url(0) + "/_fence/v1/effects?state=CONFLICTING&limit=100"
        try:
            listed = await call(session, "GET", url, headers=admin)
        except (aiohttp.ClientError, TimeoutError):
            continue
        if listed.status != 200:
            continue
        _, arrivals = read_records(upstream_db)
        arrived = {arrival.effect_id for arrival in arrivals}
        for effect in listed.body["effects"]:
            effect_id = effect["id"]
            if effect_id in resolved:
                continue
            outcome = "committed" if effect_id in arrived else "not_committed"
            body = {"outcome": outcome, "reason": "the upstream's records", "operator": "nemesis"}
            try:
                answer = await call(
                    session,
                    "POST",
                    cluster.url(0) + f"/_fence/v1/effects/{effect_id}/resolve",
                    json_body=body,
                    headers=admin,
                )
            except (aiohttp.ClientError, TimeoutError):
                continue
            history.note(f"OPERATOR resolve {effect_id} {outcome}: {answer.outcome}")
            if answer.status == 200:
                resolved.add(effect_id)


@dataclass
class Report:
    schedule: Schedule
    history: History
    violations: list[Violation]
    unresolved: dict[str, str]
    records: list[Applied]
    arrivals: list[Arrival]
    backend: str

    @property
    def applied(self) -> int:
        return len(self.records)

    def summary(self) -> str:
        told = Counter(attempt.told.value for attempt in self.history.attempts)
        faults = ", ".join(f"{kind} {n}" for kind, n in sorted(self.history.faults.items()))
        stops = ", ".join(f"{point} {n}" for point, n in sorted(self.history.stops.items()))
        ops = ", ".join(f"{kind} {n}" for kind, n in sorted(self.history.ops.items()))
        answers = ", ".join(f"{kind} {n}" for kind, n in sorted(told.items()))
        return (
            f"seed {self.schedule.seed} ({self.backend}): faults [{faults or 'none'}]; "
            f"failpoints reached [{stops or 'none'}]; "
            f"operations [{ops}]; write answers [{answers}]; grants "
            f"{len(self.history.grants)}; upstream effects {self.applied}; keys never "
            f"answered applied {len(self.unresolved)}; violations {len(self.violations)}"
        )

    def text(self) -> str:
        """Everything a reader needs to replay the run and see what went wrong."""
        parts = [self.summary()]
        if self.violations:
            parts.append("VIOLATIONS:")
            parts += [f"  {violation}" for violation in self.violations]
            parts.append("schedule:")
            parts.append(self.schedule.describe())
            parts.append("history:")
            parts.append(self.history.describe())
            parts.append("the upstream's records (seq target key epoch):")
            parts += [f"  {e.seq} {e.target} {e.key} {e.epoch}" for e in self.records]
            parts.append("what reached the upstream (effect id, key, epoch):")
            parts += [f"  {a.effect_id} {a.key} {a.epoch}" for a in self.arrivals]
        if self.unresolved:
            parts.append(f"keys never answered applied: {sorted(self.unresolved)}")
        return "\n".join(parts)


async def _poll_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `condition` came true within `timeout_s` (polled: processes and the
    upstream's file tell nobody)."""
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= give_up:
            return False
        await asyncio.sleep(POLL_S)
    return True


def last_arrival(db_path: Path) -> int:
    """The upstream's sequence number of the last mutation that reached it (0: none)."""
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        (seq,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM mutation_headers").fetchone()
    return int(seq)


def slow_write_arrived(db_path: Path, key: str, after: int) -> bool:
    """Whether a mutation of `key` made slow reached the upstream after its `after`th."""
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT headers FROM mutation_headers WHERE seq > ?", (after,))
        for (headers_json,) in rows:
            headers = json.loads(headers_json)
            if headers.get("idempotency-key") == key and DELAY_HEADER.lower() in headers:
                return True
    return False


def read_records(db_path: Path) -> tuple[list[Applied], list[Arrival]]:
    """The upstream's own records: what it applied, and every mutation that reached it."""
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        applied = [
            Applied(seq, target, key, epoch)
            for seq, target, key, epoch in db.execute(
                "SELECT seq, target, idempotency_key, fence_epoch FROM effects ORDER BY seq"
            )
        ]
        arrivals = []
        for (headers_json,) in db.execute("SELECT headers FROM mutation_headers ORDER BY seq"):
            headers = json.loads(headers_json)
            arrivals.append(
                Arrival(
                    headers.get("fence-effect-id"),
                    headers.get("idempotency-key"),
                    headers.get("fence-epoch"),
                )
            )
    return applied, arrivals


async def _nemesis(
    schedule: Schedule,
    cluster: Cluster,
    history: History,
    deadline: float,
    failover: Callable[[], None] | None,
    patroni: PatroniCluster | None,
) -> None:
    start = time.monotonic()
    for fault in schedule.faults:
        wait = start + fault.at_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if time.monotonic() >= deadline:
            return
        await _inject(fault, cluster, history, deadline, failover, patroni)


async def _inject(
    fault: Fault,
    cluster: Cluster,
    history: History,
    deadline: float,
    failover: Callable[[], None] | None,
    patroni: PatroniCluster | None,
) -> None:
    index = fault.replica % len(cluster.replicas)
    proxy = cluster.replicas[index]
    if fault.kind is FaultKind.PAUSE:
        history.note(f"NEMESIS pause r{index} for {fault.duration_s:.2f} s")
        proxy.process.pause()
        try:
            await asyncio.sleep(fault.duration_s)
        finally:
            proxy.process.resume()
        history.note(f"NEMESIS continue r{index}")
    elif fault.kind is FaultKind.KILL:
        history.note(f"NEMESIS kill r{index}, restart after {fault.duration_s:.2f} s")
        await cluster.kill(index)
        await asyncio.sleep(fault.duration_s)
        await cluster.restart(index)
        history.note(f"NEMESIS r{index} ready again")
    elif fault.kind is FaultKind.FAILPOINT:
        history.note(f"NEMESIS r{index} restarted with failpoint {fault.detail}:once")
        await cluster.arm_failpoint(index, fault.detail, fault.duration_s, history)
    elif fault.kind is FaultKind.CANCELLED:
        history.note(f"NEMESIS r{index} restarted to be cut off past its stop grace")
        await cluster.cancel_in_flight(index, fault.duration_s, deadline, history)
    elif fault.kind is FaultKind.RELAY:
        relay = cluster.relay
        if relay is None:
            return
        await _relay_fault(relay, fault, history)
    elif fault.kind is FaultKind.LEADER:
        if patroni is None:
            return
        history.note(f"NEMESIS leader: {fault.detail}")
        if fault.detail == "kill_patroni":
            did = await asyncio.to_thread(patroni.kill_leader_patroni, fault.duration_s)
        elif fault.detail == "kill_postgres":
            did = await asyncio.to_thread(patroni.kill_leader_postgres)
        else:
            did = await asyncio.to_thread(patroni.switchover)
        history.note(f"NEMESIS leader: {did}")
        leader = await asyncio.to_thread(patroni.wait_healthy)
        history.note(f"NEMESIS leader: {leader.name} leads, the cluster is healthy")
    elif fault.kind is FaultKind.FAILOVER:
        if failover is None:
            return
        history.note("NEMESIS failover: primary crashed, standby promoted")
        await asyncio.to_thread(failover)
        history.note("NEMESIS failover done")
    history.faults[fault.kind] += 1


async def _relay_fault(relay: PgRelay, fault: Fault, history: History) -> None:
    if fault.detail == "cut_all":
        history.note("NEMESIS relay: cut every connection")
        relay.cut_all()
        return
    if fault.detail == "blackhole":
        history.note(f"NEMESIS relay: blackhole for {fault.duration_s:.2f} s")
        relay.blackhole(True)
        try:
            await asyncio.sleep(fault.duration_s)
        finally:
            relay.blackhole(False)
        history.note("NEMESIS relay: flowing again")
        return
    action, _, match = fault.detail.partition(":")
    then: Literal["pass", "cut"] = "pass"
    if action == "hold":
        held, _, match = match.partition(":")
        then = "cut" if held == "cut" else "pass"
    armed = relay.arm(cast(Action, action), match, delay_s=fault.duration_s, then=then)
    history.note(f"NEMESIS relay: armed {fault.detail} (delay {fault.duration_s:.2f} s)")
    acted = await asyncio.to_thread(armed.wait, RELAY_WAIT_S)
    history.note(
        f"NEMESIS relay: {fault.detail} {'did ' + str(armed.report) if acted else 'not met'}"
    )
    if not acted:
        relay.disarm()


@contextlib.asynccontextmanager
async def _session() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=64, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=REQUEST_TIMEOUT) as session:
        yield session


async def run_schedule(
    schedule: Schedule,
    fleet: Fleet,
    store_url: str,
    *,
    backend: str,
    failover: Callable[[], None] | None = None,
    relay: PgRelay | None = None,
    patroni: PatroniCluster | None = None,
) -> Report:
    """Run `schedule` on a fleet whose upstream is started; the replicas are started here
    (on `store_url`, which goes through `relay` when there is one)."""
    assert fleet.upstream is not None
    replicas = await asyncio.to_thread(
        fleet.start_replicas,
        store_url,
        [None] * schedule.replicas,
        timeout_s=UPSTREAM_TIMEOUT_S,
        settle_s=SETTLE_S,
    )
    cluster = Cluster(fleet, replicas, relay)
    history = History()
    targets = [f"n{number}" for number in range(schedule.resources)]
    deadline = time.monotonic() + schedule.duration_s
    async with _session() as session:
        workers = [
            Worker(f"w{number}", ops, targets, schedule.ttl_s, cluster, session, history)
            for number, ops in enumerate(schedule.workers)
        ]
        nemesis = asyncio.create_task(
            _nemesis(schedule, cluster, history, deadline, failover, patroni)
        )
        tasks = [asyncio.create_task(worker.run(deadline)) for worker in workers]
        # A request in flight at the deadline finishes (or times out) on its own.
        await asyncio.wait(tasks, timeout=schedule.duration_s + 2 * REQUEST_TIMEOUT_S)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await nemesis
        await cluster.release_all()
        history.note("deadline: workers settle what they hold")
        settle_deadline = time.monotonic() + SETTLE_PHASE_S
        operator = asyncio.create_task(
            _operator(cluster, session, history, fleet.tmp_path / "upstream.db")
        )
        try:
            await asyncio.gather(*(worker.settle(settle_deadline) for worker in workers))
        finally:
            operator.cancel()
            await asyncio.gather(operator, return_exceptions=True)
    unresolved = {key: target for worker in workers for key, target in worker.pending.items()}
    await asyncio.to_thread(fleet.stop_proxies)
    applied, arrivals = read_records(fleet.tmp_path / "upstream.db")
    violations = judge(applied, arrivals, history.grants, history.attempts)
    return Report(schedule, history, violations, unresolved, applied, arrivals, backend)


@contextlib.contextmanager
def temporary_fleet() -> Any:
    """A fleet with its upstream started, in a temporary directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="fenceproxy-nemesis-") as directory:
        fleet = Fleet(Path(directory))
        try:
            fleet.start_upstream()
            yield fleet
        finally:
            fleet.close()


BACKENDS = ("postgres", "sqlite", "standby", "standby-old-primary", "patroni", "patroni-sync")
# How long the promoted standby serves alone before the old primary comes back.
OLD_PRIMARY_BACK_S = 2.0


async def run_seed(
    seed: int,
    duration_s: float,
    backend: str,
    *,
    admin_url: str | None = None,
    workers: int = 4,
    replicas: int = 2,
) -> Report:
    """One seed on a fresh store of `backend`: "postgres" (a fresh database on the server of
    `admin_url`, through the relay), "sqlite" (one replica: a SQLite store has one
    process), "standby" (a primary and its synchronous standby of this run's own, both
    named in the store URL, and a failover among the faults), "standby-old-primary" (the
    same with an asynchronous standby, and the old primary started again as it was, a
    primary on its old timeline, 2 s after the promotion: two primaries behind one URL,
    the old one first), "patroni" or
    "patroni-sync" (two nodes managed by Patroni with etcd, `synchronous_mode` off or
    on; the leader killed or switched over among the faults)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: expected one of {BACKENDS}")
    faults = frozenset({FaultKind.PAUSE, FaultKind.KILL, FaultKind.FAILPOINT, FaultKind.CANCELLED})
    if backend == "postgres":
        faults |= {FaultKind.RELAY}
    if backend.startswith("standby"):
        faults |= {FaultKind.FAILOVER}
    if backend.startswith("patroni"):
        faults |= {FaultKind.LEADER}
    schedule = make_schedule(
        seed,
        duration_s,
        workers=workers,
        replicas=1 if backend == "sqlite" else replicas,
        faults=faults,
    )
    with temporary_fleet() as fleet:
        if backend == "sqlite":
            return await run_schedule(
                schedule, fleet, f"sqlite:///{fleet.tmp_path / 'store.db'}", backend=backend
            )
        if backend == "postgres":
            if admin_url is None:
                raise ValueError("the postgres backend needs an admin URL")
            url = await pg.create_database_async(admin_url)
            server = urlsplit(url)
            try:
                with PgRelay(server.hostname or "127.0.0.1", server.port or 5432) as relay:
                    try:
                        return await run_schedule(
                            schedule, fleet, relay.url(url), backend=backend, relay=relay
                        )
                    finally:
                        fleet.stop_proxies()
            finally:
                await pg.drop_database_async(url, admin_url)
        if backend.startswith("patroni"):
            with PatroniCluster(synchronous=backend == "patroni-sync") as patroni:
                try:
                    return await run_schedule(
                        schedule, fleet, patroni.url, backend=backend, patroni=patroni
                    )
                finally:
                    fleet.stop_proxies()
        old_back = backend == "standby-old-primary"
        with StandbyPair() as pair:
            if not old_back:
                pair.make_synchronous()
            hosts = f"127.0.0.1:{pair.primary_port},127.0.0.1:{pair.standby_port}"
            url = f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

            def failover() -> None:
                pair.crash_primary()
                pair.promote()
                if old_back:
                    time.sleep(OLD_PRIMARY_BACK_S)
                    pair.start_old_primary()

            try:
                return await run_schedule(schedule, fleet, url, backend=backend, failover=failover)
            finally:
                fleet.stop_proxies()
