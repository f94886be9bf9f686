"""What fewer round trips per fenced write would buy PostgreSQL: the statements a fenced
write sends today against a candidate with three round trips instead of five. A
measurement for bench/README.md, not a design the proxy uses.

    python -m bench.fewer_round_trips [--postgres-url ADMIN_URL] [--writes N] [--pairs P]

Both run on one asyncpg connection (statement cache on, as the store's), on a store
created by this checkout (a fresh database, bench/postgres.py), a lease acquired
through the store, with a fresh idempotency key per write, alternating in pairs.

*current* is the store's own statements (store/postgres.sql and postgres_history.sql,
by name) in the order a fenced write sends them, five round trips and two durable
commits: `BEGIN; SELECT fenceproxy_history_position()`, `admission_state` (which locks
the resource), `admit_effect`, `SELECT fenceproxy_history_position(); COMMIT`, then
`receipt` as a transaction of its own.

*candidate* is three round trips, two of them durable commits, with the decision still
made in Python on the rows it read:

1. a read in autocommit (no lock, no transaction id, no WAL flush): what
   `admission_state` answers, a digest of it (md5 of the row, the time left out), the
   time, and the history position as columns, which Python judges as it judges a
   BEGIN's notice today;
2. a compare-and-insert in autocommit, `bench_admit_if` (created in the bench database
   only): it takes the resource's lock, refuses if the server is no longer on the
   timeline or at the WAL position the read was judged at, if the digest of the same
   state read again under the lock differs, or if its clock has passed the time the
   decision holds until (the lease's expiry, which Python passes); else it inserts the
   effect and its key's claim, `admit_effect`'s statement, and answers the position to
   keep with the transaction's own id;
3. the receipt, the same statement as today's.

*unchecked* is the candidate without the digest's second read under the lock (NULL
digest): not safe, a bound on what a cheaper re-check (a version the resource's row
carried, say) could reach.

It reports, per write and per variant, the CPU of the store connection's server process
(utime + stime from /proc, what `make bench` counts for PostgreSQL) and of this process
(asyncpg and the loop: what the proxy's store side would spend), the wall time, and the
round trips; the medians over the pairs, and each pair's figures."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.cpu import process_cpu_s
from bench.postgres import create_database, drop_database
from policies.model import StorePool
from store import open_store
from store.postgres import load_positional_queries
from store.types import DEFAULT_RETAIN_S

ADMIN_URL_ENV = "FENCEPROXY_BENCH_POSTGRES_URL"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
RESOURCE = "bench"
LEASE_TTL_S = 24 * 3600

# The candidate's objects: admission_state's row without its lock and without the time
# (what the digest covers), the read, and the compare-and-insert.
CANDIDATE_SQL = """
CREATE FUNCTION bench_admission_view(p_token_hash TEXT, p_resource TEXT, p_key TEXT)
RETURNS TABLE (
    store_id TEXT,
    t_resource TEXT, t_epoch BIGINT, t_holder TEXT, t_granted_at DOUBLE PRECISION,
    t_expires_at DOUBLE PRECISION, t_ended_at DOUBLE PRECISION, t_end_reason TEXT,
    t_client TEXT,
    epoch BIGINT, epoch_floor BIGINT, holder TEXT, granted_at DOUBLE PRECISION,
    expires_at DOUBLE PRECISION, ended_at DOUBLE PRECISION, end_reason TEXT, client TEXT,
    open_effects TEXT,
    i_fingerprint TEXT, i_effect_id TEXT, i_effect_state TEXT, i_epoch BIGINT,
    i_expires_at DOUBLE PRECISION, i_response_status INTEGER, i_response_headers TEXT,
    i_response_body BYTEA, i_settled_by TEXT
)
LANGUAGE sql STABLE AS $$
    SELECT (SELECT s.store_id FROM store_identity s),
           t.resource, t.epoch, t.holder, t.granted_at, t.expires_at, t.ended_at,
           t.end_reason, t.client,
           r.epoch, m.epoch_floor, l.holder, l.granted_at, l.expires_at, l.ended_at,
           l.end_reason, l.client,
           (SELECT COALESCE(json_agg(json_build_array(o.id, o.state, o.epoch,
                                                      o.idempotency_key, o.fingerprint)
                                     ORDER BY o.created_at), '[]')::text
            FROM effects o
            WHERE o.resource = p_resource
              AND o.state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')),
           i.fingerprint, i.effect_id, e.state, i.epoch, i.expires_at, i.response_status,
           i.response_headers, i.response_body, i.settled_by
    FROM store_meta m
    LEFT JOIN leases t ON t.token_hash = p_token_hash
    LEFT JOIN resources r ON r.resource = p_resource
    LEFT JOIN leases l ON l.resource = r.resource AND l.epoch = r.epoch
    LEFT JOIN idempotency i ON i.resource = p_resource AND i.key = p_key
    LEFT JOIN effects e ON e.id = i.effect_id
$$;

CREATE FUNCTION bench_admit_if(
    p_digest TEXT, p_walfile TEXT, p_inserted PG_LSN, p_valid_until DOUBLE PRECISION,
    p_token_hash TEXT, p_claim BOOLEAN, p_id TEXT, p_route TEXT, p_resource TEXT,
    p_holder TEXT, p_epoch BIGINT, p_key TEXT, p_fingerprint TEXT, p_method TEXT,
    p_path TEXT, p_instance_id TEXT, p_created_at DOUBLE PRECISION,
    p_deadline DOUBLE PRECISION, p_retain_s DOUBLE PRECISION
)
RETURNS TABLE (applied BOOLEAN, walfile TEXT, flushed TEXT, own_xid TEXT)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_flushed pg_lsn := pg_current_wal_flush_lsn();
BEGIN
    walfile := pg_walfile_name(v_flushed);
    flushed := v_flushed::text;
    applied := false;
    IF left(walfile, 8) <> left(p_walfile, 8) OR pg_current_wal_insert_lsn() < p_inserted THEN
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO resources AS r (resource, epoch) VALUES (p_resource, 0)
    ON CONFLICT (resource) DO UPDATE SET epoch = r.epoch WHERE FALSE;
    IF (p_digest IS NOT NULL
        AND (SELECT md5(v::text) FROM bench_admission_view(p_token_hash, p_resource, p_key) v)
            IS DISTINCT FROM p_digest)
       OR (SELECT extract(epoch FROM clock_timestamp())::float8 + m.clock_offset_s
           FROM store_meta m) >= p_valid_until THEN
        RETURN NEXT;
        RETURN;
    END IF;
    WITH effect AS (
        INSERT INTO effects (id, route, resource, holder, epoch, idempotency_key, fingerprint,
                             method, path, state, instance_id, created_at, deadline, retain_s)
        VALUES (p_id, p_route, p_resource, p_holder, p_epoch, p_key, p_fingerprint,
                p_method, p_path, 'DISPATCHING', p_instance_id, p_created_at, p_deadline,
                p_retain_s)
        RETURNING id
    )
    INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at)
    SELECT p_resource, p_key, p_fingerprint, effect.id, p_epoch, NULL FROM effect
    WHERE p_claim
    ON CONFLICT (resource, key) DO UPDATE SET
        fingerprint = excluded.fingerprint, effect_id = excluded.effect_id,
        epoch = excluded.epoch, expires_at = NULL,
        response_status = NULL, response_headers = NULL, response_body = NULL,
        settled_by = NULL;
    own_xid := pg_current_xact_id()::text;
    applied := true;
    RETURN NEXT;
END
$$;
"""

CANDIDATE_READ = """
SELECT v.*, md5(v::text) AS digest,
    extract(epoch FROM clock_timestamp())::float8 + m.clock_offset_s AS now,
    pg_walfile_name(pg_current_wal_flush_lsn()) AS walfile,
    pg_current_wal_insert_lsn()::text AS inserted,
    pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid
FROM bench_admission_view($1, $2, $3) v, store_meta m
"""

CANDIDATE_ADMIT = (
    "SELECT * FROM bench_admit_if($1, $2, $3::text::pg_lsn, $4, $5, $6, $7, $8, $9, $10, $11,"
    " $12, $13, $14, $15, $16, $17, $18, $19)"
)


class Writer:
    """One fenced write after another on `conn`, each as one variant sends it."""

    def __init__(self, conn: asyncpg.Connection, token_hash: str, store_id: str) -> None:
        self.conn = conn
        self.token_hash = token_hash
        self.store_id = store_id
        self.queries = load_positional_queries()
        self.round_trips = 0
        self.n = 0

    def _sql(self, name: str, **params: Any) -> list[Any]:
        """The named query's SQL, then its arguments in their positions."""
        sql, names = self.queries[name]
        return [sql, *(params[n] for n in names)]

    def _effect(self) -> dict[str, Any]:
        self.n += 1
        n = self.n
        return {
            "id": f"e-{os.getpid()}-{n}-{time.monotonic_ns()}",
            "key": f"key-{n}-{time.monotonic_ns()}",
            "fingerprint": f"fp-{n}",
            "path": f"/orders/{n}",
        }

    async def _fetchrow(self, sql: str, *args: Any) -> Any:
        self.round_trips += 1
        return await self.conn.fetchrow(sql, *args)

    async def _execute(self, sql: str, *args: Any) -> None:
        self.round_trips += 1
        await self.conn.execute(sql, *args)

    async def _receipt(self, effect: dict[str, Any], epoch: int) -> None:
        row = await self._fetchrow(
            *self._sql(
                "receipt",
                store_id=self.store_id,
                id=effect["id"],
                resource=RESOURCE,
                expected="DISPATCHING",
                state="COMMITTED",
                upstream_status=200,
                reason="upstream answered 200",
                probe_now=False,
                key_action="commit",
                idempotency_key=effect["key"],
                fingerprint=effect["fingerprint"],
                epoch=epoch,
                default_retain_s=DEFAULT_RETAIN_S,
                status=200,
                headers='{"headers": [], "reason": "OK", "body_kept": true}',
                body=b"ok",
                key_settled_by=None,
                kind="receipt",
                actor="bench",
                conclusion="COMMITTED",
            )
        )
        assert row is not None and row["applied"], row

    async def current(self) -> None:
        effect = self._effect()
        await self._execute(self.queries["begin_checked"][0])
        state = await self._fetchrow(
            *self._sql(
                "admission_state", token_hash=self.token_hash, resource=RESOURCE, key=effect["key"]
            )
        )
        assert state is not None and state["t_epoch"] is not None
        now = float(state["now"])
        await self._execute(
            *self._sql(
                "admit_effect",
                claim=True,
                id=effect["id"],
                route="orders",
                resource=RESOURCE,
                holder=state["t_holder"],
                epoch=state["t_epoch"],
                idempotency_key=effect["key"],
                fingerprint=effect["fingerprint"],
                method="POST",
                path=effect["path"],
                instance_id="bench",
                created_at=now,
                deadline=now + 5.0,
                retain_s=3600.0,
            )
        )
        await self._execute(self.queries["commit_checked"][0])
        await self._receipt(effect, int(state["t_epoch"]))

    async def candidate(self) -> None:
        await self._candidate(checked=True)

    async def unchecked(self) -> None:
        await self._candidate(checked=False)

    async def _candidate(self, checked: bool) -> None:
        effect = self._effect()
        state = await self._fetchrow(CANDIDATE_READ, self.token_hash, RESOURCE, effect["key"])
        assert state is not None and state["t_epoch"] is not None
        now = float(state["now"])
        admitted = await self._fetchrow(
            CANDIDATE_ADMIT,
            state["digest"] if checked else None,
            state["walfile"],
            state["inserted"],
            float(state["t_expires_at"]),
            self.token_hash,
            True,
            effect["id"],
            "orders",
            RESOURCE,
            state["t_holder"],
            state["t_epoch"],
            effect["key"],
            effect["fingerprint"],
            "POST",
            effect["path"],
            "bench",
            now,
            now + 5.0,
            3600.0,
        )
        assert admitted is not None and admitted["applied"], admitted
        await self._receipt(effect, int(state["t_epoch"]))


async def run_variant(
    write: Callable[[], Awaitable[None]], writer: Writer, server: int, writes: int
) -> dict[str, float]:
    trips_before = writer.round_trips
    cpu_before = process_cpu_s(server)
    own_before = time.process_time()
    started = time.monotonic()
    for _ in range(writes):
        await write()
    elapsed = time.monotonic() - started
    own = time.process_time() - own_before
    cpu_after = process_cpu_s(server)
    assert cpu_before is not None and cpu_after is not None
    return {
        "postgres_cpu_ms": round(1000 * (cpu_after - cpu_before) / writes, 3),
        "client_cpu_ms": round(1000 * own / writes, 3),
        "wall_ms": round(1000 * elapsed / writes, 3),
        "round_trips": round((writer.round_trips - trips_before) / writes, 2),
    }


async def measure(admin_url: str, writes: int, pairs: int, warmup: int) -> dict[str, Any]:
    url = await create_database(admin_url)
    try:
        store = open_store(url, time.time, "bench", StorePool(1, 1))
        await store.open()
        try:
            token_hash = hashlib.sha256(os.urandom(16)).hexdigest()
            await store.acquire(RESOURCE, "worker", LEASE_TTL_S, token_hash)
        finally:
            await store.close()
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(CANDIDATE_SQL)
            store_id = str(await conn.fetchval("SELECT store_id FROM store_identity"))
            server = int(await conn.fetchval("SELECT pg_backend_pid()"))
            writer = Writer(conn, token_hash, store_id)
            variants = {
                "current": writer.current,
                "candidate": writer.candidate,
                "unchecked": writer.unchecked,
            }
            for write in variants.values():
                for _ in range(warmup):
                    await write()
            rounds: list[dict[str, dict[str, float]]] = []
            for pair in range(pairs):
                order = list(variants) if pair % 2 == 0 else list(reversed(variants))
                rounds.append(
                    {
                        name: await run_variant(variants[name], writer, server, writes)
                        for name in order
                    }
                )
        finally:
            await conn.close()
    finally:
        await drop_database(admin_url, url)
    medians = {
        name: {
            figure: round(statistics.median(r[name][figure] for r in rounds), 3)
            for figure in rounds[0][name]
        }
        for name in variants
    }
    return {"median": medians, "pairs": rounds, "load_average": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fewer_round_trips", description=__doc__)
    parser.add_argument(
        "--postgres-url", default=os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL
    )
    parser.add_argument("--writes", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.postgres_url, args.writes, args.pairs, args.warmup))
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
