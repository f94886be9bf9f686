"""The judge: what the upstream's own records say against what the workers were told.

No I/O and no word of the proxy's: the inputs are the upstream's records (`Applied`:
every effect it committed, in its order; `Arrival`: every mutation that reached it, with
the `Fence-Effect-Id` the proxy sent) and the workers' history (`Grant`: a lease a worker
was granted; `Attempt`: a fenced write and the class of its answer). The checks:

1. no idempotency key applied twice;
2. no epoch written after a higher one on the same resource (a stale write);
3. no epoch granted to two holders, and every write the upstream saw made under an
   epoch its own worker was granted (a key names its worker);
4. no answer the records contradict: told applied, and the upstream has no effect of
   that key (or none at the epoch the answer names); told nothing was sent
   (`upstream_unreachable`), and that effect's request reached the upstream; told
   nothing was forwarded (a refusal) or that it did not take effect (`effect_settled`)
   for every attempt of a key under an epoch, and the upstream applied the key under
   that epoch. (A request that reached the upstream is not one it applied: the demo
   records a mutation's headers as they arrive, and a request cut before its body
   applies nothing.)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from enum import StrEnum


class Told(StrEnum):
    """What an answer claimed about the request it answers."""

    APPLIED = "applied"  # 2xx, first answer or replay
    NOT_SENT = "not_sent"  # a refusal: nothing of this request was forwarded
    NOT_APPLIED = "not_applied"  # settled not committed: it did not take effect
    UNKNOWN = "unknown"  # outcome unknown, a lost answer, a timeout: no claim


@dataclass(frozen=True)
class Grant:
    worker: str
    resource: str
    epoch: int
    replica: str
    at: float


@dataclass(frozen=True)
class Attempt:
    worker: str
    key: str
    target: str
    epoch: int  # the epoch of the token the worker sent
    replica: str
    told: Told
    status: int | None  # None: no answer (connection lost, timed out)
    code: str | None
    effect_id: str | None
    answer_epoch: str | None  # the upstream body's fence_epoch, in a 2xx that carries one
    at: float


@dataclass(frozen=True)
class Applied:
    seq: int
    target: str
    key: str | None
    epoch: str | None


@dataclass(frozen=True)
class Arrival:
    effect_id: str | None
    key: str | None
    epoch: str | None


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


# The refusals whose effect id is the request's own effect, said not to have been sent.
# Others name another effect (`request_in_progress`: the one being forwarded under the
# key; `resource_blocked`: those in doubt), of which they claim nothing.
OWN_EFFECT_NOT_SENT = frozenset({"upstream_unreachable"})


def worker_of(key: str) -> str:
    """Keys are `<worker>-<n>`: the worker that owns them."""
    return key.rsplit("-", 1)[0]


def resource_of(target: str) -> str:
    return f"r:{target}"


def judge(
    applied: list[Applied],
    arrivals: list[Arrival],
    grants: list[Grant],
    attempts: list[Attempt],
) -> list[Violation]:
    violations: list[Violation] = []
    violations += _keys_applied_once(applied)
    violations += _epochs_in_order(applied)
    violations += _epochs_granted_once(applied, grants)
    violations += _answers_true(applied, arrivals, attempts)
    return violations


def _keys_applied_once(applied: list[Applied]) -> list[Violation]:
    counts = Counter(effect.key for effect in applied)
    return [
        Violation("key applied twice", f"{key!r} applied {count} times")
        for key, count in sorted(counts.items(), key=lambda item: str(item[0]))
        if count > 1
    ]


def _epoch(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _epochs_in_order(applied: list[Applied]) -> list[Violation]:
    violations = []
    highest: dict[str, tuple[int, Applied]] = {}
    for effect in sorted(applied, key=lambda effect: effect.seq):
        epoch = _epoch(effect.epoch)
        if epoch is None:
            violations.append(Violation("unfenced write", f"{effect} carried no epoch"))
            continue
        before = highest.get(effect.target)
        if before is not None and epoch < before[0]:
            violations.append(
                Violation(
                    "stale write",
                    f"{effect.key!r} on {effect.target} at epoch {epoch} (upstream seq "
                    f"{effect.seq}) after epoch {before[0]} (seq {before[1].seq})",
                )
            )
        if before is None or epoch > before[0]:
            highest[effect.target] = (epoch, effect)
    return violations


def _epochs_granted_once(applied: list[Applied], grants: list[Grant]) -> list[Violation]:
    violations = []
    holders: dict[tuple[str, int], set[str]] = defaultdict(set)
    for grant in grants:
        holders[(grant.resource, grant.epoch)].add(grant.worker)
    for (resource, epoch), workers in sorted(holders.items()):
        if len(workers) > 1:
            violations.append(
                Violation("epoch granted twice", f"{resource} epoch {epoch} to {sorted(workers)}")
            )
    writers: dict[tuple[str, int], set[str]] = defaultdict(set)
    for effect in applied:
        written = _epoch(effect.epoch)
        if effect.key is None or written is None:
            continue
        resource = resource_of(effect.target)
        worker = worker_of(effect.key)
        writers[(resource, written)].add(worker)
        if worker not in holders.get((resource, written), set()):
            violations.append(
                Violation(
                    "write under an epoch its worker was never granted",
                    f"{effect.key!r} applied on {resource} at epoch {written}; granted to "
                    f"{sorted(holders.get((resource, written), set())) or 'nobody'}",
                )
            )
    for (resource, epoch), workers in sorted(writers.items()):
        if len(workers) > 1:
            violations.append(
                Violation(
                    "epoch written by two holders", f"{resource} epoch {epoch} by {sorted(workers)}"
                )
            )
    return violations


def _answers_true(
    applied: list[Applied], arrivals: list[Arrival], attempts: list[Attempt]
) -> list[Violation]:
    violations = []
    applied_epochs: dict[str, set[str | None]] = defaultdict(set)
    for effect in applied:
        if effect.key is not None:
            applied_epochs[effect.key].add(effect.epoch)
    arrived = {arrival.effect_id for arrival in arrivals if arrival.effect_id is not None}
    # Per key and token epoch: was any attempt answered applied, or left unknown?
    maybe_applied: set[tuple[str, int]] = set()
    for attempt in attempts:
        if attempt.told in (Told.APPLIED, Told.UNKNOWN):
            maybe_applied.add((attempt.key, attempt.epoch))
    for attempt in attempts:
        said = f"{attempt.worker} was told {attempt.told} ({attempt.status} {attempt.code})"
        where = f"for {attempt.key!r} at epoch {attempt.epoch} via {attempt.replica}"
        if attempt.told is Told.APPLIED:
            if attempt.key not in applied_epochs:
                violations.append(
                    Violation(
                        "applied, says the answer",
                        f"{said} {where}; the upstream has no such effect",
                    )
                )
            elif (
                attempt.answer_epoch is not None
                and attempt.answer_epoch not in applied_epochs[attempt.key]
            ):
                violations.append(
                    Violation(
                        "applied, says the answer",
                        f"{said} {where} at epoch {attempt.answer_epoch}; the upstream applied "
                        f"it at {sorted(map(str, applied_epochs[attempt.key]))}",
                    )
                )
        elif attempt.code in OWN_EFFECT_NOT_SENT and attempt.effect_id in arrived:
            violations.append(
                Violation(
                    f"{attempt.code}, says the answer",
                    f"{said} {where}; effect {attempt.effect_id} reached the upstream",
                )
            )
    for key, epochs in applied_epochs.items():
        for epoch_text in epochs:
            epoch = _epoch(epoch_text)
            if epoch is None:
                continue
            tried = [a for a in attempts if a.key == key and a.epoch == epoch]
            if tried and (key, epoch) not in maybe_applied:
                violations.append(
                    Violation(
                        "not applied, say all the answers",
                        f"every attempt of {key!r} at epoch {epoch} was told it was not sent "
                        f"or did not take effect ({', '.join(str(a.code) for a in tried)}), "
                        "and the upstream applied it at that epoch",
                    )
                )
    return violations
