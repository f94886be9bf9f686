"""The `cancelled` fault's own bookkeeping, on a hand-made upstream file: one write made
slow per arming, and only that write's arrival, after the arming, lets the nemesis
send its SIGTERM (an earlier attempt of the same key, or one not made slow, would
have it stop a replica with nothing in flight)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from demo.upstream import DELAY_HEADER, DemoStore
from tests.integration.replicas.conftest import Fleet
from tests.nemesis.harness import SLOW_WRITE_MS, Cluster, last_arrival, slow_write_arrived


def arrive(store: DemoStore, key: str, *, slow: bool) -> None:
    headers = {"idempotency-key": key, "fence-token": "t"}
    if slow:
        headers[DELAY_HEADER.lower()] = str(SLOW_WRITE_MS)
    store.record_mutation_headers(headers)


def test_only_the_write_made_slow_after_the_arming_counts(tmp_path: Path) -> None:
    db_path = tmp_path / "upstream.db"
    store = DemoStore(str(db_path))
    try:
        arrive(store, "w0-1", slow=True)  # an earlier fault's slow write of the key
        after = last_arrival(db_path)
        assert after == 1
        arrive(store, "w0-1", slow=False)  # the key again, not made slow this time
        arrive(store, "w0-2", slow=True)  # another key
        assert not slow_write_arrived(db_path, "w0-1", after)
        arrive(store, "w0-1", slow=True)
        assert slow_write_arrived(db_path, "w0-1", after)
    finally:
        store.close()


def test_one_write_is_made_slow_per_arming() -> None:
    cluster = Cluster(cast(Fleet, None), [], None)
    assert cluster.slow_write_headers(0, "w0-1") == {}
    cluster.slow_next.add(0)
    assert cluster.slow_write_headers(1, "w1-1") == {}  # another replica's write
    assert cluster.slow_write_headers(0, "w0-2") == {DELAY_HEADER: str(SLOW_WRITE_MS)}
    assert cluster.slowed == {0: "w0-2"}
    assert cluster.slow_write_headers(0, "w0-3") == {}
