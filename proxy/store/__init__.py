"""The authority's records: one interface (`Store`), interchangeable backends."""

from __future__ import annotations

from collections.abc import Callable

from proxy.store.base import StoreError, StoreUnavailable
from proxy.store.manager import Admitted, LeaseView, NewEffect, Store
from proxy.store.sqlite import SQLiteConnector


def open_store(url: str, clock: Callable[[], float], instance_id: str) -> Store:
    """A Store for `url`; call `await store.open()` before use."""
    if url.startswith("sqlite:"):
        return Store(SQLiteConnector(url, clock), instance_id)
    raise StoreError(f"no store backend for {url.partition(':')[0]!r} yet")


__all__ = [
    "Admitted",
    "LeaseView",
    "NewEffect",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "open_store",
]
