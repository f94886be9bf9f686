"""How many write lanes the PostgreSQL connector runs for a pool (store/postgres.py)."""

from __future__ import annotations

import pytest

from policies.model import StorePool
from store.postgres import write_lanes


@pytest.mark.parametrize(("max_size", "lanes"), [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3)])
def test_a_small_pool_has_half_its_connections_as_lanes(max_size: int, lanes: int) -> None:
    # Rounded up: a pool of three keeps a lane free beside a write that holds one.
    assert write_lanes(StorePool(1, max_size)) == lanes


@pytest.mark.parametrize("max_size", [6, 10, 40])
def test_a_larger_pool_has_three_lanes(max_size: int) -> None:
    # More lanes split the same writes into more, smaller transactions, each with its
    # own BEGIN, COMMIT, history checks and WAL flush (bench/README.md).
    assert write_lanes(StorePool(1, max_size)) == 3
