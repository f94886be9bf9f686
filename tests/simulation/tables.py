"""Direct reads of the store's tables, for the invariant checks.

The checks judge what the store *holds*, on a connection of their own (as another
process would see it), not what its API answers. Queries are written once with
``?`` placeholders and run on both backends.

The effect states the checks know. A state not listed here is treated as in doubt:
it blocks its resource and keeps its idempotency key.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

import asyncpg

from store.sqlite import parse_sqlite_url

COMMITTED = "COMMITTED"
NOT_COMMITTED = "NOT_COMMITTED"
NOT_SENT = "NOT_SENT"
DISPATCHING = "DISPATCHING"
UNKNOWN = "UNKNOWN"
CONFLICTING = "CONFLICTING"
FREED_STATES = frozenset({NOT_COMMITTED, NOT_SENT})  # final, "nothing took effect"
SETTLED_STATES = frozenset({COMMITTED, NOT_COMMITTED, NOT_SENT})
# States that block a resource's admissions (DISPATCHING blocks takeover only).
BLOCKING_STATES: tuple[str, ...] = (UNKNOWN, CONFLICTING)
# States read every step (everything not settled).
IN_DOUBT_STATES: tuple[str, ...] = (DISPATCHING, UNKNOWN, CONFLICTING)

_PLACEHOLDER = re.compile(r"\?")


def in_doubt(state: str) -> bool:
    """Not settled: DISPATCHING, UNKNOWN, or a state the checks do not know."""
    return state not in SETTLED_STATES


def blocks_admission(state: str) -> bool:
    return state != DISPATCHING and in_doubt(state)


@dataclass(frozen=True)
class EffectRow:
    id: str
    resource: str
    state: str
    settled_by: str | None
    probe_attempts: int
    next_probe_at: float | None
    created_at: float


@dataclass(frozen=True)
class KeyRow:
    resource: str
    key: str
    effect_id: str
    effect_state: str
    fingerprint: str
    expires_at: float | None  # None while its effect is not settled


@dataclass(frozen=True)
class LeaseRow:
    epoch: int
    holder: str
    granted_at: float
    expires_at: float
    ended_at: float | None


@dataclass(frozen=True)
class EventRow:
    at: float
    kind: str
    actor: str
    upstream_status: int | None
    conclusion: str
    detail: str


@dataclass(frozen=True)
class EffectColumns:
    """The columns of an effect its lifecycle moves."""

    state: str
    finished_at: float | None
    upstream_status: int | None
    reason: str | None
    probe_attempts: int
    next_probe_at: float | None
    settled_by: str | None


@dataclass(frozen=True)
class Moment:
    """An effect and its history, as of one moment."""

    row: EffectColumns
    events: tuple[EventRow, ...]

    def describe(self) -> str:
        last = self.events[-1] if self.events else None
        said = f"{last.kind} {last.conclusion} at {last.at:.3f}" if last else "none"
        return (
            f"{self.row.state}, {self.row.probe_attempts} probe(s), next probe at "
            f"{self.row.next_probe_at}; {len(self.events)} event(s), the last: {said}"
        )


_EFFECT_COLUMNS = "id, resource, state, settled_by, probe_attempts, next_probe_at, created_at"
_MOMENT_COLUMNS = (
    "state, finished_at, upstream_status, reason, probe_attempts, next_probe_at, settled_by"
)


class Tables:
    def __init__(self, backend: str, store_url: str) -> None:
        self.backend = backend
        self.store_url = store_url
        self._sqlite: sqlite3.Connection | None = None
        self._pg: asyncpg.Connection | None = None

    async def open(self) -> None:
        if self.backend == "sqlite":
            path, _ = parse_sqlite_url(self.store_url)
            self._sqlite = sqlite3.connect(path, isolation_level=None)
        else:
            self._pg = await asyncpg.connect(self.store_url, timeout=10)

    async def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None
        if self._pg is not None:
            await self._pg.close()
            self._pg = None

    async def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        if self._sqlite is not None:
            return [tuple(r) for r in self._sqlite.execute(sql, params).fetchall()]
        assert self._pg is not None
        counter = iter(range(1, 10_000))
        pg_sql = _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)
        return [tuple(r) for r in await self._pg.fetch(pg_sql, *params)]

    async def snapshot(
        self,
    ) -> tuple[dict[str, int], list[EffectRow], dict[tuple[str, str], KeyRow]]:
        """What every step's checks read: epochs, effects in doubt, idempotency records
        (on PostgreSQL in one round trip, as one consistent snapshot)."""
        if self._pg is None:
            return await self.epochs(), await self.in_doubt_effects(), await self.keys()
        marks = ", ".join(f"'{state}'" for state in IN_DOUBT_STATES)
        row = await self._pg.fetchrow(
            "SELECT"
            " (SELECT coalesce(json_agg(json_build_array(resource, epoch)), '[]')"
            "  FROM resources),"
            f" (SELECT coalesce(json_agg(json_build_array({_EFFECT_COLUMNS})), '[]')"
            f"  FROM effects WHERE state IN ({marks})),"
            " (SELECT coalesce(json_agg(json_build_array(i.resource, i.key, i.effect_id,"
            "   e.state, i.fingerprint, i.expires_at)), '[]')"
            "  FROM idempotency i JOIN effects e ON e.id = i.effect_id)"
        )
        assert row is not None
        epochs = {str(r): int(e) for r, e in json.loads(row[0])}
        effects = [_effect(tuple(r)) for r in json.loads(row[1])]
        keys = [_key(tuple(r)) for r in json.loads(row[2])]
        return epochs, effects, {(k.resource, k.key): k for k in keys}

    async def epochs(self) -> dict[str, int]:
        rows = await self._rows("SELECT resource, epoch FROM resources")
        return {str(r): int(e) for r, e in rows}

    async def in_doubt_effects(self) -> list[EffectRow]:
        marks = ", ".join("?" for _ in IN_DOUBT_STATES)
        rows = await self._rows(
            f"SELECT {_EFFECT_COLUMNS} FROM effects WHERE state IN ({marks})", *IN_DOUBT_STATES
        )
        return [_effect(row) for row in rows]

    async def effects_by_id(self, ids: list[str]) -> list[EffectRow]:
        if not ids:
            return []
        marks = ", ".join("?" for _ in ids)
        rows = await self._rows(
            f"SELECT {_EFFECT_COLUMNS} FROM effects WHERE id IN ({marks})", *ids
        )
        return [_effect(row) for row in rows]

    async def keys(self) -> dict[tuple[str, str], KeyRow]:
        rows = await self._rows(
            "SELECT i.resource, i.key, i.effect_id, e.state, i.fingerprint, i.expires_at"
            " FROM idempotency i JOIN effects e ON e.id = i.effect_id"
        )
        keys = [_key(r) for r in rows]
        return {(k.resource, k.key): k for k in keys}

    async def lease(self, resource: str, epoch: int) -> LeaseRow | None:
        rows = await self._rows(
            "SELECT epoch, holder, granted_at, expires_at, ended_at FROM leases"
            " WHERE resource = ? AND epoch = ?",
            resource,
            epoch,
        )
        if not rows:
            return None
        e, holder, granted, expires, ended = rows[0]
        return LeaseRow(
            int(e),
            str(holder),
            float(granted),
            float(expires),
            None if ended is None else float(ended),
        )

    async def effect_states_of(self, resource: str) -> list[tuple[str, str]]:
        """(id, state) of every effect of `resource` that is not settled."""
        rows = await self._rows(
            "SELECT id, state FROM effects WHERE resource = ?"
            " AND state NOT IN ('COMMITTED', 'NOT_COMMITTED', 'NOT_SENT')",
            resource,
        )
        return [(str(i), str(s)) for i, s in rows]

    async def moment(self, effect_id: str) -> Moment | None:
        """The effect and its history, as of one moment: on PostgreSQL, where this
        connection is in autocommit, in a transaction that gives both statements one
        snapshot (the property the reads under test must have)."""
        effect_sql = f"SELECT {_MOMENT_COLUMNS} FROM effects WHERE id = ?"
        events_sql = (
            "SELECT at, kind, actor, upstream_status, conclusion, detail FROM effect_events"
            " WHERE effect_id = ? ORDER BY id"
        )
        if self._pg is None:
            rows = await self._rows(effect_sql, effect_id)
            events = await self._rows(events_sql, effect_id)
        else:
            async with self._pg.transaction(isolation="repeatable_read", readonly=True):
                rows = await self._rows(effect_sql, effect_id)
                events = await self._rows(events_sql, effect_id)
        if not rows:
            return None
        return moment_of(rows[0], [EventRow(*e) for e in events])

    async def event_count(self, effect_id: str) -> int:
        rows = await self._rows("SELECT count(*) FROM effect_events WHERE effect_id = ?", effect_id)
        return int(rows[0][0])


def _key(r: tuple[Any, ...]) -> KeyRow:
    expires_at = None if r[5] is None else float(r[5])
    return KeyRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), expires_at)


def moment_of(columns: tuple[Any, ...], events: list[EventRow]) -> Moment:
    """A Moment, its numbers as the same types from either backend or the store's API."""
    state, finished_at, upstream_status, reason, probe_attempts, next_probe_at, settled_by = columns
    row = EffectColumns(
        str(state),
        None if finished_at is None else float(finished_at),
        None if upstream_status is None else int(upstream_status),
        reason,
        int(probe_attempts),
        None if next_probe_at is None else float(next_probe_at),
        settled_by,
    )
    return Moment(
        row,
        tuple(
            EventRow(
                float(e.at),
                e.kind,
                e.actor,
                None if e.upstream_status is None else int(e.upstream_status),
                e.conclusion,
                e.detail,
            )
            for e in events
        ),
    )


def _effect(row: tuple[Any, ...]) -> EffectRow:
    id_, resource, state, settled_by, attempts, next_at, created = row
    return EffectRow(
        str(id_),
        str(resource),
        str(state),
        None if settled_by is None else str(settled_by),
        int(attempts),
        None if next_at is None else float(next_at),
        float(created),
    )
