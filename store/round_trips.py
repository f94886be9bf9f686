"""Round trips to PostgreSQL, counted for the bench (bench/round_trips.py), the metric
`fenceproxy_store_round_trips_total` and the tests: the PostgreSQL connector's
connections are `CountingConnection`s, each counting into the connector's one
`RoundTrips`."""

from __future__ import annotations

from typing import Any

import asyncpg


class RoundTrips:
    """Every exchange with the server a connector's connections made: each statement,
    BEGIN, COMMIT and ROLLBACK (asyncpg sends each as one message and waits for its
    answer). Not counted: preparing a statement, once per connection per statement
    (asyncpg caches it), or before every execution with `store_pool.statement_cache`
    off (one more exchange per statement), and opening connections."""

    def __init__(self) -> None:
        self.count = 0


class CountingConnection(asyncpg.Connection):
    """A connection that counts its round trips (in `round_trips`, set by its pool's
    init). Every statement of asyncpg's public API, a transaction's BEGIN and COMMIT
    included, goes through one of these methods."""

    round_trips: RoundTrips | None = None

    def _count(self) -> None:
        if self.round_trips is not None:
            self.round_trips.count += 1

    # The overridden methods' options (timeout, record_class, column) pass through.
    async def execute(self, query: str, *args: Any, **options: Any) -> str:
        self._count()
        result: str = await super().execute(query, *args, **options)
        return result

    async def fetch(self, query: str, *args: Any, **options: Any) -> list[Any]:
        self._count()
        result: list[Any] = await super().fetch(query, *args, **options)
        return result

    async def fetchrow(self, query: str, *args: Any, **options: Any) -> Any:
        self._count()
        return await super().fetchrow(query, *args, **options)

    async def fetchval(self, query: str, *args: Any, **options: Any) -> Any:
        self._count()
        return await super().fetchval(query, *args, **options)
