"""The authority's records: one interface (`Store`), interchangeable backends."""

from __future__ import annotations

from collections.abc import Callable

from policies.model import StorePool
from policies.store_backends import StoreBackend, store_backend
from store.base import (
    AdmissionInDoubt,
    CommitUnknown,
    Connector,
    ReleaseRefused,
    StoreError,
    StoreUnavailable,
)
from store.manager import Store
from store.postgres import PostgresConnector
from store.sqlite import SQLiteConnector
from store.types import (
    CAME_BACK,
    Admitted,
    LeaseEntry,
    LeaseLives,
    LeaseView,
    NewEffect,
    Purged,
    Receipt,
    RecentLeases,
    Replica,
    StoreIdentity,
    UnknownKey,
)

Clock = Callable[[], float]
DEFAULT_POOL = StorePool(1, 10)


def _sqlite(url: str, clock: Clock, pool: StorePool) -> Connector:
    return SQLiteConnector(url, clock)


def _postgresql(url: str, clock: Clock, pool: StorePool) -> Connector:
    return PostgresConnector(url, pool)


# One connector for each backend the policy's store URL can name.
CONNECTORS: dict[StoreBackend, Callable[[str, Clock, StorePool], Connector]] = {
    StoreBackend.SQLITE: _sqlite,
    StoreBackend.POSTGRESQL: _postgresql,
}


def open_store(url: str, clock: Clock, instance_id: str, pool: StorePool = DEFAULT_POOL) -> Store:
    """A Store for `url`; call `await store.open()` before use.

    `clock` is SQLite's notion of time; PostgreSQL uses the database's clock.
    `pool` is PostgreSQL's connection pool (`store_pool`).
    """
    backend = store_backend(url)
    if backend is None:
        raise StoreError(f"no store backend for {url.partition(':')[0]!r}")
    return Store(CONNECTORS[backend](url, clock, pool), instance_id)


__all__ = [
    "CAME_BACK",
    "AdmissionInDoubt",
    "Admitted",
    "CommitUnknown",
    "LeaseEntry",
    "LeaseLives",
    "LeaseView",
    "NewEffect",
    "Purged",
    "Receipt",
    "RecentLeases",
    "ReleaseRefused",
    "Replica",
    "Store",
    "StoreError",
    "StoreIdentity",
    "StoreUnavailable",
    "UnknownKey",
    "open_store",
]
