"""The authority's records: one interface (`Store`), interchangeable backends."""

from __future__ import annotations

from collections.abc import Callable

from store.base import StoreError, StoreUnavailable
from store.manager import Admitted, LeaseView, NewEffect, Receipt, Store
from store.postgres import PostgresConnector
from store.sqlite import SQLiteConnector


def open_store(
    url: str, clock: Callable[[], float], instance_id: str, pool: tuple[int, int] = (1, 10)
) -> Store:
    """A Store for `url`; call `await store.open()` before use.

    `clock` is SQLite's notion of time; PostgreSQL uses the database's clock.
    `pool` is the (min, max) size of PostgreSQL's connection pool.
    """
    if url.startswith("sqlite:"):
        return Store(SQLiteConnector(url, clock), instance_id)
    if url.startswith(("postgresql:", "postgres:")):
        return Store(PostgresConnector(url, *pool), instance_id)
    raise StoreError(f"no store backend for {url.partition(':')[0]!r}")


__all__ = [
    "Admitted",
    "LeaseView",
    "NewEffect",
    "Receipt",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "open_store",
]
