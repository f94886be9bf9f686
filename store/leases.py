"""Leases: acquire, renew, release, revoke, and what is read of them."""

from __future__ import annotations

from dataclasses import replace

from core import fencing
from core.codes import ErrorCode
from core.fencing import Grant, LiveLeases, holder_came_back
from core.leasing_advice import Ending, LeaseLife
from core.records import LeaseRecord, Refusal, ResourceState
from store.base import Row, Tx
from store.part import StorePart
from store.reads import float_or_none, resource_state, tokens_lease
from store.rows import lease_record
from store.types import (
    CAME_BACK,
    MAX_ADVICE_ROWS,
    LeaseEntry,
    LeaseLives,
    LeaseView,
    RecentLeases,
)


class Leases(StorePart):
    async def acquire(
        self,
        resource: str,
        holder: str,
        ttl_s: float,
        token_hash: str,
        max_live_leases: int = 0,
        client: str | None = None,
    ) -> tuple[LeaseRecord, float] | Refusal:
        """Grant a new lease at a higher epoch; returns it with the transaction's clock.
        `max_live_leases` caps the live leases of the holder (0: no cap); `client` is
        the authenticated client taking it (None without `auth:`)."""

        superseded = False

        async def operation(tx: Tx) -> tuple[LeaseRecord, float] | Refusal:
            nonlocal superseded
            state = await resource_state(tx, resource, lock=True)
            live = None
            if max_live_leases > 0:
                live = await _live_leases(tx, holder, client, max_live_leases)
            decision = fencing.decide_acquire(state, ttl_s, tx.now, live)
            if isinstance(decision, Refusal):
                if not state.epoch:
                    # A refusal writes nothing about a name the store did not know: a
                    # flood of made-up resources must not grow the store row by row.
                    await tx.execute("forget_unleased_resource", resource=resource)
                return decision
            # A grant over a lease nobody ended: it expired, and is taken over now.
            superseded = await _end_current_lease(tx, state, Ending.SUPERSEDED)
            await _grant(tx, resource, holder, token_hash, decision, ttl_s, client)
            lease = LeaseRecord(
                resource, decision.epoch, holder, tx.now, decision.expires_at, None, None, client
            )
            return lease, tx.now

        granted = await self.connector.write(operation, resource=resource)
        if superseded and not isinstance(granted, Refusal):
            self._observe(resource, Ending.SUPERSEDED)
        return granted

    async def renew(
        self, token_hash: str, ttl_s: float, clients: fencing.Clients = None
    ) -> tuple[LeaseRecord, float] | Refusal:
        """`clients`: the clients configured now (fencing.check_standing); None, the
        policy has no `auth:` block."""
        came_back: str | None = None

        async def operation(tx: Tx) -> tuple[LeaseRecord, float] | Refusal:
            nonlocal came_back
            came_back = None  # a retried transaction decides afresh
            lease, state = await _lease_and_state(tx, token_hash)
            refusal = fencing.decide_renew(lease, state, tx.now, clients)
            if refusal is not None:
                came_back = await mark_came_back(tx, lease, refusal.code)
                return refusal
            assert lease is not None
            expires_at = tx.now + ttl_s
            await tx.execute(
                "extend_lease",
                resource=lease.resource,
                epoch=lease.epoch,
                expires_at=expires_at,
                ttl_s=ttl_s,
            )
            renewed = replace(lease, expires_at=expires_at, ended_at=None, end_reason=None)
            return renewed, tx.now

        renewed = await self.connector.write(operation)
        if came_back is not None:
            self._observe(came_back, CAME_BACK)
        return renewed

    async def release(self, token_hash: str) -> LeaseRecord | Refusal:
        """End the lease; the record returned has its ended_at (the turn's end)."""
        came_back: str | None = None

        async def operation(tx: Tx) -> LeaseRecord | Refusal:
            nonlocal came_back
            came_back = None  # a retried transaction decides afresh
            lease, state = await _lease_and_state(tx, token_hash)
            refusal = fencing.decide_release(lease, state, tx.now)
            if refusal is not None:
                came_back = await mark_came_back(tx, lease, refusal.code)
                return refusal
            assert lease is not None
            await tx.execute(
                "end_lease",
                resource=lease.resource,
                epoch=lease.epoch,
                ended_at=tx.now,
                end_reason=Ending.RELEASED,
            )
            # Released after it expired (allowed, to tidy up): its holder was alive.
            came_back = await mark_came_back(tx, lease, ErrorCode.LEASE_EXPIRED)
            return replace(lease, ended_at=tx.now, end_reason=Ending.RELEASED)

        released = await self.connector.write(operation)
        if not isinstance(released, Refusal):
            assert released.ended_at is not None
            self._observe(
                released.resource, Ending.RELEASED, released.ended_at - released.granted_at
            )
        if came_back is not None:
            self._observe(came_back, CAME_BACK)
        return released

    async def revoke(self, resource: str, reason: str, actor: str | None = None) -> tuple[int, int]:
        """Advance the epoch now; returns (old epoch, new epoch). `actor`, who asked, is
        kept in the ended lease's reason."""
        why = f"revoked by {actor}: {reason}" if actor else f"revoked: {reason}"

        ended = False

        async def operation(tx: Tx) -> tuple[int, int]:
            nonlocal ended
            state = await resource_state(tx, resource, lock=True)
            ended = await _end_current_lease(tx, state, why)
            advanced = state.next_epoch()
            await tx.execute("set_resource_epoch", resource=resource, epoch=advanced)
            return state.epoch, advanced

        old, new = await self.connector.write(operation, resource=resource)
        if ended:
            self._observe(resource, Ending.REVOKED)
        return old, new

    async def lease_lives(self, since_s: float | None) -> LeaseLives:
        """The leases granted, and the fenced effects created, in the last `since_s`
        seconds of the store's clock (None: all), at most MAX_ADVICE_ROWS of each."""

        async def operation(tx: Tx) -> LeaseLives:
            since = tx.now - since_s if since_s is not None else float("-inf")
            # -inf is not a parameter every driver takes; 0 is before any record.
            since = max(since, 0.0)
            rows = await tx.all("lease_lives", since=since, limit=MAX_ADVICE_ROWS)
            effects = await tx.all("route_latencies", since=since, limit=MAX_ADVICE_ROWS)
            return LeaseLives(
                tuple(
                    LeaseLife(
                        resource=row["resource"],
                        epoch=int(row["epoch"]),
                        granted_at=float(row["granted_at"]),
                        expires_at=float(row["expires_at"]),
                        ended_at=float_or_none(row["ended_at"]),
                        end_reason=row["end_reason"],
                        granted_ttl_s=float_or_none(row["granted_ttl_s"]),
                        renewals=int(row["renewals"]),
                        came_back_at=float_or_none(row["came_back_at"]),
                    )
                    for row in rows
                ),
                tuple((str(row["route"]), float(row["seconds"])) for row in effects),
                tx.now,
            )

        return await self.connector.read(operation)

    async def lease_view(self, resource: str) -> LeaseView:
        async def operation(tx: Tx) -> LeaseView:
            state = await resource_state(tx, resource, lock=False)
            current = state.current_lease()
            return LeaseView(
                resource=resource,
                epoch=state.epoch,
                holder=current.holder if current else None,
                client=current.client if current else None,
                expires_at=current.expires_at if current else None,
                live=bool(current and current.live(tx.now)),
                blocked=bool(state.blocking()),
                in_doubt=state.blocking(),
                next_epoch=state.next_epoch(),
            )

        return await self.connector.read(operation)

    async def lease_of_token(self, token_hash: str) -> LeaseRecord | None:
        """The lease a token was issued for, current or ended long ago; None for a token
        never issued here (or whose lease retention has deleted)."""

        async def operation(tx: Tx) -> LeaseRecord | None:
            return lease_record(await tx.one("lease_by_token", token_hash=token_hash))

        return await self.connector.read(operation)

    async def recent_leases(self, within_s: float, limit: int) -> RecentLeases:
        """Leases nobody ended yet, and those granted in the last `within_s` seconds
        that have expired or ended since, at most `limit` of each."""

        async def operation(tx: Tx) -> RecentLeases:
            current = await tx.all("unended_leases", limit=limit)
            ended = await tx.all(
                "leases_ended_since", since=tx.now - within_s, now=tx.now, limit=limit
            )
            # An expired lease nobody ended yet is selected by both queries: keep it once.
            over = {
                (row["resource"], row["epoch"]): row
                for row in [*ended, *(row for row in current if row["expires_at"] <= tx.now)]
            }
            return RecentLeases(
                live=tuple(_lease_entry(row) for row in current if row["expires_at"] > tx.now),
                ended=tuple(
                    _lease_entry(row)
                    for row in sorted(
                        over.values(), key=lambda row: float(row["expires_at"]), reverse=True
                    )[:limit]
                ),
                now=tx.now,
            )

        return await self.connector.read(operation)


def _lease_entry(row: Row) -> LeaseEntry:
    return LeaseEntry(
        resource=str(row["resource"]),
        epoch=int(row["epoch"]),
        holder=str(row["holder"]),
        client=row["client"],
        granted_at=float(row["granted_at"]),
        expires_at=float(row["expires_at"]),
        ended_at=float_or_none(row["ended_at"]),
        end_reason=row["end_reason"],
        came_back_at=float_or_none(row["came_back_at"]),
    )


async def _end_current_lease(tx: Tx, state: ResourceState, reason: str) -> bool:
    """End the resource's lease that nobody ended yet, if it has one, as `reason`."""
    if state.current_lease() is None:
        return False
    await tx.execute(
        "end_lease", resource=state.resource, epoch=state.epoch, ended_at=tx.now, end_reason=reason
    )
    return True


async def _live_leases(tx: Tx, holder: str, client: str | None, cap: int) -> LiveLeases:
    """The quota subject's live leases: the authenticated client's (all the leases it
    took, whatever holders they name), else the holder's (proxy/quotas.py
    quota_subject). Counted under the subject's lock (taken after the resource's, see
    lock_quota_subject) so that concurrent acquires of one subject on different
    resources cannot both find room under the cap."""
    subject = client if client is not None else holder
    locked = await tx.one("lock_quota_subject", subject=subject)
    if locked is not None:
        tx.now = float(locked["now"])
    if client is not None:
        row = await tx.one("live_leases_of_client", client=client, now=tx.now)
    else:
        row = await tx.one("live_leases_of_holder", holder=holder, now=tx.now)
    assert row is not None  # an aggregate always answers one row
    earliest = row["earliest"]
    return LiveLeases(subject, cap, int(row["n"]), None if earliest is None else float(earliest))


async def _lease_and_state(
    tx: Tx, token_hash: str
) -> tuple[LeaseRecord | None, ResourceState | None]:
    lease = lease_record(await tx.one("lease_by_token", token_hash=token_hash))
    if lease is None:
        return None, None
    state = await resource_state(tx, lease.resource, lock=True)
    current = tokens_lease(lease, state)
    return (current, state) if current is not None else (None, None)


async def mark_came_back(tx: Tx, lease: LeaseRecord | None, code: str) -> str | None:
    """Mark `lease` if `code`, refusing its token now, proves its holder alive after the
    lease expired (core.fencing.holder_came_back); its resource if newly marked. In the
    transaction that looked the token up: no round trip of its own."""
    if lease is None or not holder_came_back(lease, code, tx.now):
        return None
    # Once per lease: a holder that retries its refused call is not counted again.
    marked = await tx.execute(
        "mark_came_back", resource=lease.resource, epoch=lease.epoch, now=tx.now
    )
    return lease.resource if marked else None


async def _grant(
    tx: Tx,
    resource: str,
    holder: str,
    token_hash: str,
    grant: Grant,
    ttl_s: float,
    client: str | None,
) -> None:
    await tx.execute("set_resource_epoch", resource=resource, epoch=grant.epoch)
    await tx.execute(
        "insert_lease",
        resource=resource,
        epoch=grant.epoch,
        holder=holder,
        token_hash=token_hash,
        granted_at=tx.now,
        expires_at=grant.expires_at,
        ttl_s=ttl_s,
        client=client,
    )
