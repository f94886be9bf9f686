"""The authority's records: one interface (`Store`), interchangeable backends."""

from __future__ import annotations

from collections.abc import Callable

from policies.store_backends import StoreBackend, store_backend
from store.base import Connector, StoreError, StoreUnavailable
from store.manager import (
    CAME_BACK,
    Admitted,
    LeaseLives,
    LeaseView,
    NewEffect,
    Purged,
    Receipt,
    RecentLeases,
    Replica,
    Store,
    StoreIdentity,
)
from store.postgres import PostgresConnector
from store.sqlite import SQLiteConnector

Clock = Callable[[], float]


def _sqlite(url: str, clock: Clock, pool: tuple[int, int]) -> Connector:
    return SQLiteConnector(url, clock)


def _postgresql(url: str, clock: Clock, pool: tuple[int, int]) -> Connector:
    return PostgresConnector(url, *pool)


# One connector for each backend the policy's store URL can name.
CONNECTORS: dict[StoreBackend, Callable[[str, Clock, tuple[int, int]], Connector]] = {
    StoreBackend.SQLITE: _sqlite,
    StoreBackend.POSTGRESQL: _postgresql,
}


def open_store(url: str, clock: Clock, instance_id: str, pool: tuple[int, int] = (1, 10)) -> Store:
    """A Store for `url`; call `await store.open()` before use.

    `clock` is SQLite's notion of time; PostgreSQL uses the database's clock.
    `pool` is the (min, max) size of PostgreSQL's connection pool.
    """
    backend = store_backend(url)
    if backend is None:
        raise StoreError(f"no store backend for {url.partition(':')[0]!r}")
    return Store(CONNECTORS[backend](url, clock, pool), instance_id)


__all__ = [
    "CAME_BACK",
    "Admitted",
    "LeaseLives",
    "LeaseView",
    "NewEffect",
    "Purged",
    "Receipt",
    "RecentLeases",
    "Replica",
    "Store",
    "StoreError",
    "StoreIdentity",
    "StoreUnavailable",
    "open_store",
]
