"""The store's schema: a new store is created from its backend's schema file
(schema/postgresql.sql, schema/sqlite.sql), an existing one brought there by the
migrations it lacks (migrations/<backend>/NNNN_name.sql, the deltas between versions).

Both are one transaction, one replica at a time, over the backend's named queries: a
store created from the schema file is recorded as having every migration, and
tests/integration/app/test_schema_files.py proves that the migrations from the first
reach exactly the schema file.
"""

from __future__ import annotations

from importlib import resources

from core.releases import PEER_WINDOW_S, Peer, contraction_refusal, declared_oldest_release
from store.base import Connector, ReleaseRefused, SchemaTx
from store.queries import load_migrations


def schema_file(backend: str) -> str:
    """The current schema of `backend` ("postgresql" or "sqlite"), whole."""
    return resources.files("store").joinpath("schema", f"{backend}.sql").read_text("utf-8")


async def migrate(connector: Connector) -> list[int]:
    """Create the schema or apply the missing migrations; the versions recorded now."""
    backend = connector.backend

    async def operation(tx: SchemaTx) -> list[int]:
        await tx.execute("lock_migrations")
        await tx.execute("create_schema_migrations")
        applied = {row["version"] for row in await tx.all("applied_migrations")}
        missing = [m for m in load_migrations(backend) if m[0] not in applied]
        if not applied:
            await tx.script(schema_file(backend))
        for version, name, sql in missing:
            oldest_release = declared_oldest_release(sql)
            if applied:
                if oldest_release is not None:
                    await refuse_while_needed(tx, connector, version, name, oldest_release)
                await tx.script(sql)
            await tx.execute("record_migration", version=version, name=name, now=tx.now)
            if oldest_release is not None:
                await tx.execute(
                    "record_contraction", version=version, name=name, oldest_release=oldest_release
                )
        return [version for version, _, _ in missing]

    return await connector.change_schema(operation)


async def refuse_while_needed(
    tx: SchemaTx, connector: Connector, version: int, name: str, oldest_release: str
) -> None:
    """A contraction (core/releases.py) is not applied while a replica older than it
    declares has been seen running: `ReleaseRefused`, naming them."""
    peers = [
        Peer(str(row["instance_id"]), str(row["version"]), row["oldest_peer"])
        for row in await tx.all(
            "replicas_seen_during_migration",
            now=tx.now,
            window_s=PEER_WINDOW_S,
            instance_id=connector.instance_id,
        )
    ]
    refusal = contraction_refusal(version, name, oldest_release, peers)
    if refusal is not None:
        raise ReleaseRefused(refusal)


async def open_current(connector: Connector) -> list[int]:
    """Open `connector` on a store at the current schema: what every Store does first.
    Returns the migrations recorded now (all of them for a store created now)."""
    await connector.open()
    try:
        recorded = await migrate(connector)
        await connector.ready()
    except BaseException:
        await connector.close()
        raise
    return recorded
