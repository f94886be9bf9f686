"""The store URL schemes a policy may name, and the backend each one selects.

Both the policy validator (here, floor 1) and `store.open_store` (floor 3)
read this registry, so a scheme the validator accepts is always one the store
can open. It lives at the lowest floor because the policy must not import the
store; the store maps each backend to its connector class.
"""

from __future__ import annotations

from enum import StrEnum


class StoreBackend(StrEnum):
    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"


BACKEND_BY_SCHEME = {
    "sqlite": StoreBackend.SQLITE,
    "postgresql": StoreBackend.POSTGRESQL,
    "postgres": StoreBackend.POSTGRESQL,
}


def store_backend(url: str) -> StoreBackend | None:
    """The backend a `scheme://...` store URL selects; None for any other URL."""
    scheme, separator, _ = url.partition("://")
    return BACKEND_BY_SCHEME.get(scheme) if separator else None
