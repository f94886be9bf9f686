"""The fencing rules as pure functions: records in, decision out.

The stores call these inside one transaction, after loading the records and
before writing anything, so a decision and the state it was made on can never
drift apart. Nothing here performs I/O or reads a clock; `now` is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from core.codes import ErrorCode
from core.frozen import quick_init
from core.lifecycle import BLOCKING
from core.quotas import retry_after_s
from core.records import (
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    Refusal,
    ResourceState,
)
from policies import AuthClient, Right

# The clients configured now, by name (the policy's `auth:` clients and, when an admin
# token is set, the admin's); None without `auth:`, where the lease API is open to all.
Clients = Mapping[str, AuthClient] | None
NO_AUTH: Clients = None
# Refusals of a token whose lease has passed; `holder_came_back` says which of them
# prove the holder was alive after its lease expired.
_PAST_LEASE_CODES = frozenset({"lease_expired", "stale_epoch"})


@dataclass(frozen=True)
class Grant:
    epoch: int
    expires_at: float


@quick_init
@dataclass(frozen=True)
class Admit:
    """Record the effect as DISPATCHING (and claim the key, if any), then forward.

    `resends` names UNKNOWN effects of the same operation that this send will
    settle (only on routes whose upstream deduplicates by Idempotency-Key).
    """

    resends: tuple[str, ...] = ()


@quick_init
@dataclass(frozen=True)
class Replay:
    record: IdempotencyRecord


@quick_init
@dataclass(frozen=True)
class AdmissionRequest:
    resource: str
    idempotency_key: str | None
    fingerprint: str
    max_in_flight: int
    upstream_timeout_s: float
    upstream_idempotent: bool = False


@dataclass(frozen=True)
class LiveLeases:
    """A quota subject's live leases as it asks for one more, and its cap
    (`quotas.live_leases`, above 0)."""

    subject: str
    cap: int
    count: int
    earliest_expires_at: float | None


def decide_acquire(
    state: ResourceState, ttl_s: float, now: float, live: LiveLeases | None = None
) -> Grant | Refusal:
    """`live` is None when the subject's live leases are not capped."""
    current = state.current_lease()
    if current is not None and current.live(now):
        return Refusal(
            ErrorCode.LEASE_HELD,
            f"{state.resource} is leased until its lease expires or is released",
            {
                "resource": state.resource,
                "current_epoch": state.epoch,
                "retry_after_s": retry_after_s(current.expires_at - now),
            },
        )
    blocking = state.blocking()
    if blocking:
        # A write may still land (or may have landed) under the old epoch: a successor
        # must not start from a state nobody knows yet.
        return _blocked(state, blocking)
    if live is not None and live.count >= live.cap:
        assert live.earliest_expires_at is not None  # at least one lease is live
        return Refusal(
            ErrorCode.RATE_LIMITED,
            f"{live.subject} holds {live.count} live leases, the most quotas.live_leases "
            "allows; release one first",
            {
                "resource": state.resource,
                "live_leases": live.count,
                # Its leases end by release or expiry; expiry is the one to count on.
                "retry_after_s": retry_after_s(live.earliest_expires_at - now),
            },
        )
    return Grant(state.next_epoch(), now + ttl_s)


def check_lease(
    lease: LeaseRecord | None, state: ResourceState | None, now: float
) -> Refusal | None:
    """Is `lease` (found by its token) the current, live lease of its resource?"""
    if lease is None or state is None:
        return Refusal(ErrorCode.INVALID_TOKEN, "the Fence-Token is not one this proxy issued")
    context = {"resource": lease.resource, "epoch": lease.epoch, "current_epoch": state.epoch}
    if lease.epoch != state.epoch or lease.ended_at is not None:
        reason = lease.end_reason or "superseded"
        return Refusal(
            ErrorCode.STALE_EPOCH,
            f"the lease at epoch {lease.epoch} is no longer current ({reason}); "
            f"the resource is at epoch {state.epoch}",
            context,
        )
    if not lease.live(now):
        return Refusal(
            ErrorCode.LEASE_EXPIRED, f"the lease at epoch {lease.epoch} has expired", context
        )
    return None


def check_standing(lease: LeaseRecord, clients: Clients) -> Refusal | None:
    """May the client that took `lease` still hold it, by the configuration in force now?

    A lease outlives the configuration it was granted under (a restart, a client
    removed from `auth:`, its `resources` narrowed): its token alone must not keep
    renewing and writing for a client the operator has cut off. Only renew and
    admission ask; release does not, letting go is always safe.
    """
    if clients is None:
        return None
    context = {"resource": lease.resource, "epoch": lease.epoch, "client": lease.client}
    if lease.client is None:
        return Refusal(
            ErrorCode.FORBIDDEN,
            f"the lease at epoch {lease.epoch} was taken without a client key, and the "
            "proxy now has an auth: block; release it and acquire with a client's key",
            context,
        )
    client = clients.get(lease.client)
    if client is None:
        return Refusal(
            ErrorCode.FORBIDDEN,
            f"client {lease.client!r}, which took the lease at epoch {lease.epoch}, is no "
            "longer configured (auth.clients)",
            context,
        )
    if not client.holds(Right.LEASE):
        return Refusal(
            ErrorCode.FORBIDDEN,
            f"client {lease.client!r} may no longer lease (auth.clients[].may)",
            context,
        )
    if not client.covers(lease.resource):
        return Refusal(
            ErrorCode.FORBIDDEN_RESOURCE,
            f"client {lease.client!r} may no longer act on {lease.resource}: it matches "
            "none of its resources globs now",
            context,
        )
    return None


def decide_renew(
    lease: LeaseRecord | None, state: ResourceState | None, now: float, clients: Clients
) -> Refusal | None:
    refusal = check_lease(lease, state, now)
    if refusal is not None:
        return refusal
    assert lease is not None
    return check_standing(lease, clients)


def decide_release(
    lease: LeaseRecord | None, state: ResourceState | None, now: float
) -> Refusal | None:
    refusal = check_lease(lease, state, now)
    # Ending an expired lease is harmless and lets a worker tidy up after itself.
    if refusal is not None and refusal.code == "lease_expired":
        return None
    return refusal


def holder_came_back(lease: LeaseRecord | None, code: str | None, now: float) -> bool:
    """Whether a refusal of this lease's token proves its holder was alive after the
    lease expired (a measured false expiry): refused as lease_expired or stale_epoch,
    and the lease expired before anyone ended it. A lease released or revoked before
    it expired is stale without saying anything about its holder's liveness."""
    if lease is None or code not in _PAST_LEASE_CODES:
        return False
    ended = lease.ended_at if lease.ended_at is not None else now
    return lease.expires_at <= ended and lease.expires_at <= now


def decide_admission(
    request: AdmissionRequest,
    lease: LeaseRecord | None,
    state: ResourceState | None,
    existing: IdempotencyRecord | None,
    now: float,
    clients: Clients,
) -> Admit | Replay | Refusal:
    """The order of checks is the contract's; each step refuses before the next is read."""
    if lease is not None and lease.resource != request.resource:
        return Refusal(
            ErrorCode.WRONG_RESOURCE,
            f"the token's lease guards {lease.resource}, not {request.resource}",
            {"resource": request.resource, "token_resource": lease.resource},
        )
    refusal = check_lease(lease, state, now)
    if refusal is not None:
        return refusal
    assert lease is not None and state is not None
    # Before the key's record: a client cut off is not replayed its old answers either.
    refusal = check_standing(lease, clients)
    if refusal is not None:
        return refusal
    resends: tuple[str, ...] = ()
    blocking = state.blocking(lease.epoch)
    if blocking:
        if not _may_resend(request, state, blocking):
            return _blocked(state, blocking)
        resends = blocking
    dispatching = state.in_state(EffectState.DISPATCHING)
    key = request.idempotency_key
    # A key whose effect is being forwarded, whatever its record says (it may have
    # been freed by contradicting evidence, or outlived its retention).
    in_flight = next((e for e in dispatching if key is not None and e.idempotency_key == key), None)
    if in_flight is not None:
        if in_flight.fingerprint != request.fingerprint:
            return _key_reused(request, in_flight.id)
        return _in_progress(request, in_flight.id)
    if existing is not None and _retained(existing, now):
        if existing.fingerprint != request.fingerprint:
            return _key_reused(request, existing.effect_id)
        if existing.effect_state is EffectState.DISPATCHING:
            return _in_progress(request, existing.effect_id)
        if existing.effect_state is EffectState.COMMITTED:
            return Replay(existing)
        if existing.effect_state in BLOCKING and existing.effect_id not in resends:
            return _blocked(state, (existing.effect_id,))
    if len(dispatching) >= request.max_in_flight:
        return Refusal(
            ErrorCode.EFFECT_IN_FLIGHT,
            f"{request.resource} already has {len(dispatching)} request(s) being forwarded",
            {"resource": request.resource, "in_flight": [e.id for e in dispatching]},
        )
    remaining = lease.expires_at - now
    if remaining < request.upstream_timeout_s:
        return Refusal(
            ErrorCode.LEASE_TOO_SHORT,
            f"the lease expires in {remaining:.3f}s, before the upstream timeout of "
            f"{request.upstream_timeout_s}s ends; renew it first",
            {
                "resource": request.resource,
                "epoch": lease.epoch,
                "expires_at": lease.expires_at,
                # What a client needs to size its lease: renew to at least needed_s.
                "needed_s": request.upstream_timeout_s,
                "remaining_s": round(remaining, 3),
            },
        )
    return Admit(resends)


def _retained(record: IdempotencyRecord, now: float) -> bool:
    """A key is kept while its effect is unsettled, and for `retain_s` after settling."""
    if record.effect_state in BLOCKING or record.expires_at is None:
        return True
    return now < record.expires_at


def _key_reused(request: AdmissionRequest, effect_id: str) -> Refusal:
    return Refusal(
        ErrorCode.IDEMPOTENCY_KEY_REUSED,
        "this Idempotency-Key was used for a different request",
        {"resource": request.resource, "effect_id": effect_id},
    )


def _in_progress(request: AdmissionRequest, effect_id: str) -> Refusal:
    return Refusal(
        ErrorCode.REQUEST_IN_PROGRESS,
        "a request with this Idempotency-Key is in flight: being forwarded, or, after the "
        "store's answer to its admission was lost, being settled as not sent (ask again: it "
        "replays, or goes through once settled)",
        {"resource": request.resource, "effect_id": effect_id},
    )


def _may_resend(request: AdmissionRequest, state: ResourceState, blocking: tuple[str, ...]) -> bool:
    """An upstream that deduplicates by key applies a resent operation at most once, so
    resending the very operation in doubt (same key, same request) settles it safely.
    Never over a conflict: that is an operator's to decide."""
    if not request.upstream_idempotent or request.idempotency_key is None:
        return False
    operation = (request.idempotency_key, request.fingerprint)
    blockers = [e for e in state.open_effects if e.id in blocking]
    return all(
        e.state is EffectState.UNKNOWN and (e.idempotency_key, e.fingerprint) == operation
        for e in blockers
    )


def _blocked(state: ResourceState, blocking: tuple[str, ...]) -> Refusal:
    return Refusal(
        ErrorCode.RESOURCE_BLOCKED,
        f"{state.resource} has effects whose outcome is not known yet or is disputed; "
        "it stays blocked until they are reconciled",
        {"resource": state.resource, "effect_ids": list(blocking)},
    )
