"""The in-memory tally of refusals (store/refusals.py) is bounded between two flushes,
and keeps no name of a holder that names no lease."""

from __future__ import annotations

from core.records import Rejection
from store.refusals import RefusalKey, RefusalTally


def forbidden(resource: str) -> Rejection:
    return Rejection(
        "forbidden_resource", "POST", "/_fence/v1/leases", resource=resource, client="c"
    )


def test_past_the_bound_a_code_counts_its_new_kinds_unnamed() -> None:
    tally = RefusalTally(max_kinds=3)
    for i in range(10):
        tally.add(forbidden(f"r:{i}"))
    tally.add(forbidden("r:0"))
    tally.add(Rejection("no_route", "DELETE", "/junk"))

    batch = tally.take(seq=7)

    assert batch is not None and batch.seq == 7
    unnamed = RefusalKey("", "forbidden_resource", "", 0, "", "c")
    assert batch.counts == {
        RefusalKey("r:0", "forbidden_resource", "", 0, "", "c"): 2,
        RefusalKey("r:1", "forbidden_resource", "", 0, "", "c"): 1,
        RefusalKey("r:2", "forbidden_resource", "", 0, "", "c"): 1,
        unnamed: 7,
        RefusalKey("", "no_route", "", 0, "", ""): 1,
    }
    assert batch.samples[unnamed].path == "/_fence/v1/leases"
    assert len(tally) == 0 and tally.take(seq=8) is None


def test_a_holder_is_kept_only_with_the_epoch_of_the_lease_it_names() -> None:
    tally = RefusalTally()
    for i in range(5):
        tally.add(
            Rejection("lease_held", "POST", "/_fence/v1/leases", resource="r", holder=f"h{i}")
        )
    tally.add(Rejection("stale_epoch", "POST", "/orders/1", resource="r", holder="w", epoch=3))

    batch = tally.take(seq=1)

    assert batch is not None
    assert batch.counts == {
        RefusalKey("r", "lease_held", "", 0, "", ""): 5,
        RefusalKey("r", "stale_epoch", "", 3, "w", ""): 1,
    }
