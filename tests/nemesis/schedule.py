"""What a seed decides: each worker's operations and the faults, in order and in time.

Pure: `make_schedule(seed, ...)` gives the same schedule for the same arguments, so a
run is replayed from its seed (the processes' own timing is not replayed: the same
operations and faults land in another interleaving). The schedule is planned for the
run's duration; workers and the nemesis stop at the deadline wherever they are.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class OpKind(StrEnum):
    WRITE = "write"  # a new Idempotency-Key (acquiring first when no lease is held)
    RETRY = "retry"  # the oldest key not yet answered "applied", sent again with the same key
    RENEW = "renew"
    RELEASE = "release"
    EXPIRE = "expire"  # hold the lease past its expiry, then carry on with the stale token
    THINK = "think"  # a pause between operations


class FaultKind(StrEnum):
    PAUSE = "pause"  # SIGSTOP a replica, SIGCONT after `duration_s`
    KILL = "kill"  # SIGKILL a replica, start it again after `duration_s`
    FAILOVER = "failover"  # the store's primary dies, its synchronous standby is promoted
    # The replica restarts with FENCEPROXY_FAILPOINTS=<point>:once, stops itself there at
    # its next fenced write (core/failpoints.py), and is continued after `duration_s`.
    FAILPOINT = "failpoint"
    # The replica restarts with FENCEPROXY_FAILPOINTS=cancelled:once and a short stop
    # grace, one of its fenced writes is made slow, and it is told to stop (SIGTERM) once
    # the upstream has that write: the grace ends mid-dispatch, the handler is cancelled
    # and the replica stops itself before its UNKNOWN receipt; continued after
    # `duration_s`, it finishes stopping and is started again.
    CANCELLED = "cancelled"
    # The relay between the replicas and PostgreSQL (pgrelay.py) acts: `detail` is
    # `<action>:<match>` for the next transaction whose text holds `match`, `cut_all`,
    # or `blackhole` (every connection, for `duration_s`).
    RELAY = "relay"
    # Patroni's cluster (patroni.py) loses or hands over its leader: `detail` is
    # kill_postgres, kill_patroni or switchover; `duration_s`, for kill_patroni, how long
    # the old leader's PostgreSQL runs unmanaged once another node leads.
    LEADER = "leader"


FAILPOINTS = ("admitted", "before_send", "sent")
LEADER_FAULTS = ("kill_postgres", "kill_patroni", "switchover")
# A leader fault lasts until Patroni has a leader again: up to its TTL and then some.
LEADER_FAULT_S = 12.0
RELAY_ACTIONS = ("cut_before_commit", "cut_after_commit", "hold", "cut_all", "blackhole")
# What the relay's one-shot actions wait for: an admission, a receipt, a grant, a renew.
RELAY_MATCHES = (
    "fenceproxy_admission_state",
    "fenceproxy_receipt",
    "INSERT INTO leases",
    "UPDATE leases SET expires_at",
)


@dataclass(frozen=True)
class Op:
    kind: OpKind
    resource: int  # index into the run's resources
    replica: int  # index of the replica the worker talks to for this operation
    seconds: float  # THINK: how long; EXPIRE: how long past the lease's expiry


@dataclass(frozen=True)
class Fault:
    at_s: float  # from the start of the run
    kind: FaultKind
    replica: int
    duration_s: float
    detail: str = ""  # FAILPOINT: the point; RELAY: what the relay does


@dataclass(frozen=True)
class Schedule:
    seed: int
    duration_s: float
    replicas: int
    resources: int
    ttl_s: float
    workers: tuple[tuple[Op, ...], ...]
    faults: tuple[Fault, ...]

    def describe(self) -> str:
        """The schedule as text, for a report that must let a reader replay the run."""
        lines = [
            f"seed {self.seed}: {len(self.workers)} workers, {self.replicas} replicas, "
            f"{self.resources} resources, lease {self.ttl_s:g} s, {self.duration_s:g} s"
        ]
        for fault in self.faults:
            lines.append(
                f"  fault at {fault.at_s:6.2f} s: {fault.kind} replica r{fault.replica} "
                f"for {fault.duration_s:.2f} s {fault.detail}".rstrip()
            )
        for number, ops in enumerate(self.workers):
            shown = " ".join(_op_text(op) for op in ops[:40])
            more = f" ... ({len(ops)} in all)" if len(ops) > 40 else ""
            lines.append(f"  w{number}: {shown}{more}")
        return "\n".join(lines)


def _op_text(op: Op) -> str:
    if op.kind is OpKind.THINK:
        return f"think{op.seconds:.2f}"
    if op.kind is OpKind.EXPIRE:
        return f"expire@r{op.replica}"
    return f"{op.kind}:{op.resource}@r{op.replica}"


# How often each operation is drawn: writes dominate, as for a real worker.
OP_WEIGHTS = {
    OpKind.WRITE: 10,
    OpKind.RETRY: 2,
    OpKind.RENEW: 3,
    OpKind.RELEASE: 2,
    OpKind.EXPIRE: 1,
    OpKind.THINK: 3,
}
# No fault starts in the last seconds of a run; one still on at the deadline is ended
# there (a failpoint's hold can outlast the run), before the workers settle.
QUIET_END_S = 2.0
# Roughly how long one operation takes on a loaded machine: enough operations are
# planned for the duration, and the workers stop at the deadline.
OP_BUDGET_S = 0.02
MAX_OPS_PER_WORKER = 20_000


def make_schedule(
    seed: int,
    duration_s: float,
    *,
    workers: int = 4,
    replicas: int = 2,
    resources: int = 2,
    ttl_s: float = 1.5,
    faults: frozenset[FaultKind] = frozenset({FaultKind.PAUSE, FaultKind.KILL}),
    fault_every_s: float = 2.5,
) -> Schedule:
    rng = random.Random(seed)
    kinds = list(OP_WEIGHTS)
    weights = [OP_WEIGHTS[kind] for kind in kinds]
    count = min(MAX_OPS_PER_WORKER, int(duration_s / OP_BUDGET_S) + 10)
    plans = []
    for _ in range(workers):
        ops = []
        for kind in rng.choices(kinds, weights, k=count):
            ops.append(
                Op(
                    kind,
                    rng.randrange(resources),
                    rng.randrange(replicas),
                    round(rng.uniform(0.01, 0.3), 3) if kind is OpKind.THINK else 0.3,
                )
            )
        plans.append(tuple(ops))
    planned: list[Fault] = []
    repeatable = sorted(faults - {FaultKind.FAILOVER})
    at = rng.uniform(0.5, fault_every_s)
    while repeatable and at < duration_s - QUIET_END_S:
        fault = _fault(rng, FaultKind(rng.choice(repeatable)), round(at, 3), replicas)
        planned.append(fault)
        planned_s = fault.duration_s + (LEADER_FAULT_S if fault.kind is FaultKind.LEADER else 0.0)
        at += planned_s + rng.uniform(0.3, fault_every_s)
    if FaultKind.FAILOVER in faults:
        # Once: a standby promoted is not made a standby again here.
        planned.append(
            Fault(round(rng.uniform(0.3, 0.7) * duration_s, 3), FaultKind.FAILOVER, 0, 0.0)
        )
        planned.sort(key=lambda fault: fault.at_s)
    return Schedule(seed, duration_s, replicas, resources, ttl_s, tuple(plans), tuple(planned))


def _fault(rng: random.Random, kind: FaultKind, at_s: float, replicas: int) -> Fault:
    replica = rng.randrange(replicas)
    if kind is FaultKind.PAUSE:
        return Fault(at_s, kind, replica, round(rng.uniform(0.3, 2.0), 3))
    if kind is FaultKind.KILL:
        return Fault(at_s, kind, replica, round(rng.uniform(0.2, 1.5), 3))
    if kind is FaultKind.FAILPOINT:
        # Long enough, at times, for the lease to run out and the effect to be taken for
        # lost (its deadline, 2 s more, a probe) while the replica still holds it.
        return Fault(at_s, kind, replica, round(rng.uniform(1.0, 6.0), 3), rng.choice(FAILPOINTS))
    if kind is FaultKind.CANCELLED:
        # As a failpoint's hold, and longer: past the lease, the effect's deadline and
        # a sweep of another replica, which settles the effect while this one is stopped.
        return Fault(at_s, kind, replica, round(rng.uniform(1.0, 10.0), 3))
    if kind is FaultKind.LEADER:
        return Fault(at_s, kind, 0, round(rng.uniform(0.0, 6.0), 3), rng.choice(LEADER_FAULTS))
    action = rng.choice(RELAY_ACTIONS)
    if action == "blackhole":
        return Fault(at_s, kind, 0, round(rng.uniform(0.3, 3.0), 3), action)
    if action == "cut_all":
        return Fault(at_s, kind, 0, 0.0, action)
    delay = round(rng.uniform(0.0, 2.0), 3) if action != "cut_before_commit" else 0.0
    then = f":{rng.choice(('pass', 'cut'))}" if action == "hold" else ""
    return Fault(at_s, kind, 0, delay, f"{action}{then}:{rng.choice(RELAY_MATCHES)}")
