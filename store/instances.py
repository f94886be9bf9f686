"""The store and the proxy instances that use it: identity, the recovery window,
heartbeats, the clock, and the replicas' rows."""

from __future__ import annotations

from core.releases import OLDEST_PEER, PEER_WINDOW_S, Contraction, Peer, start_refusal
from store.base import ReleaseRefused, Tx
from store.history import RecoveryWindow, Replication, replication_of
from store.part import StorePart
from store.reads import float_or_none
from store.types import MAX_REPLICAS, Replica, StoreIdentity


class Instances(StorePart):
    async def refresh_recovery(self) -> RecoveryWindow | None:
        """Read the recovery window again (another replica's operator may have closed
        it), and the replication state with it."""

        async def operation(tx: Tx) -> tuple[RecoveryWindow | None, Replication | None]:
            row = await tx.one("recovery_window")
            assert row is not None
            opened = row["recovery_opened_at"]
            window = None
            if opened is not None:
                window = RecoveryWindow(float(opened), str(row["recovery_reason"]))
            return window, replication_of(row)

        self.connector.recovery, self.connector.replication = await self.connector.read(operation)
        return self.connector.recovery

    async def close_recovery(self) -> bool:
        """Close the recovery window (an operator's decision: every key the store does
        not know is new again); False if none was open."""

        async def operation(tx: Tx) -> bool:
            return await tx.execute("close_recovery_window") > 0

        closed = await self.connector.write(operation)
        self.connector.recovery = None
        return closed

    async def now(self) -> float:
        """The authority's clock: lease expiry and settle windows are judged by it."""

        async def operation(tx: Tx) -> float:
            return tx.now

        return await self.connector.read(operation)

    async def identity(self) -> StoreIdentity:
        async def operation(tx: Tx) -> StoreIdentity:
            row = await tx.one("store_identity")
            assert row is not None  # created by the schema's migration
            fenced_at = row["fenced_at"]
            return StoreIdentity(
                str(row["store_id"]),
                float(row["created_at"]),
                None if fenced_at is None else float(fenced_at),
            )

        return await self.connector.read(operation)

    async def heartbeat(self) -> float:
        """Write one small row: proves that the store takes durable writes now (a read
        succeeds on a full disk or a read-only file). Returns the store's clock."""

        async def operation(tx: Tx) -> float:
            await tx.execute("heartbeat", instance_id=self.instance_id, now=tx.now)
            return tx.now

        return await self.connector.write(operation)

    async def ping(self) -> None:
        async def operation(tx: Tx) -> None:
            await tx.one("ping")

        await self.connector.read(operation)

    # -- the status page: this instance and the others --------------

    async def record_replica(
        self,
        version: str,
        up_s: float,
        sweep_age_s: float | None,
        probe_age_s: float | None,
        policy_digest: str | None = None,
    ) -> None:
        """This instance's row in `replicas`, seen now by the store's clock; the other
        instants are given as ages, so they land on the same clock. `policy_digest`:
        the sha256 of the policy file it serves."""

        async def operation(tx: Tx) -> None:
            def ago(age_s: float | None) -> float | None:
                return None if age_s is None else tx.now - age_s

            await tx.execute(
                "record_replica",
                instance_id=self.instance_id,
                version=version,
                started_at=tx.now - up_s,
                now=tx.now,
                last_sweep_at=ago(sweep_age_s),
                last_probe_at=ago(probe_age_s),
                policy_digest=policy_digest,
                oldest_peer=OLDEST_PEER,
            )

        await self.connector.write(operation)

    async def check_release(self, release: str) -> None:
        """Raise `ReleaseRefused` if a replica of `release` must not start on this store:
        the schema's floor is above it, or a running replica is one it cannot serve
        beside (core/releases.py).

        Its row is written first, in a transaction of its own: of two replicas starting
        at once, the one that reads last sees the other. A refused replica takes its row
        away, since it does not run."""
        await self.record_replica(release, 0.0, None, None)

        async def operation(tx: Tx) -> str | None:
            contractions = [
                Contraction(int(row["version"]), str(row["name"]), str(row["oldest_release"]))
                for row in await tx.all("schema_contractions")
            ]
            peers = [
                Peer(str(row["instance_id"]), str(row["version"]), row["oldest_peer"])
                for row in await tx.all(
                    "replicas_running", since=tx.now - PEER_WINDOW_S, instance_id=self.instance_id
                )
            ]
            return start_refusal(release, OLDEST_PEER, contractions, peers)

        refusal = await self.connector.read(operation)
        if refusal is not None:

            async def forget(tx: Tx) -> None:
                await tx.execute("forget_replica", instance_id=self.instance_id)

            await self.connector.write(forget)
            raise ReleaseRefused(refusal)

    async def replicas(self, within_s: float, limit: int = MAX_REPLICAS) -> tuple[Replica, ...]:
        """The instances that wrote their row in the last `within_s` seconds."""

        async def operation(tx: Tx) -> tuple[Replica, ...]:
            rows = await tx.all("replicas_seen", since=tx.now - within_s, limit=limit)
            return tuple(
                Replica(
                    instance_id=str(row["instance_id"]),
                    version=str(row["version"]),
                    started_at=float(row["started_at"]),
                    seen_at=float(row["seen_at"]),
                    last_sweep_at=float_or_none(row["last_sweep_at"]),
                    last_probe_at=float_or_none(row["last_probe_at"]),
                    policy_digest=row["policy_digest"],
                )
                for row in rows
            )

        return await self.connector.read(operation)
