"""The in-memory tally of refusals without a credential (store/tally.py) is bounded."""

from __future__ import annotations

from store.tally import OTHER_PATH, CountKey, RefusalTally


def junk(code: str, i: int) -> CountKey:
    return CountKey(code, "", "", "DELETE", f"/junk/{i}")


def test_past_the_bound_a_code_counts_in_its_other_key() -> None:
    tally = RefusalTally(max_kinds=3)
    for i in range(10):
        tally.add(junk("no_route", i))
    tally.add(junk("no_route", 0))
    tally.add(junk("missing_token", 0), n=5)

    taken = tally.take()

    other = CountKey("no_route", "", "", "*", OTHER_PATH)
    assert taken == {
        junk("no_route", 0): 2,
        junk("no_route", 1): 1,
        junk("no_route", 2): 1,
        other: 7,
        junk("missing_token", 0): 5,
    }
    assert len(tally) == 0


def test_taking_starts_the_bound_again_and_giving_back_keeps_within_it() -> None:
    tally = RefusalTally(max_kinds=2)
    tally.add(junk("no_route", 0))
    tally.add(junk("no_route", 1))
    taken = tally.take()
    tally.add(junk("no_route", 2))

    tally.give_back(taken)

    assert tally.take() == {
        junk("no_route", 2): 1,
        junk("no_route", 0): 1,
        CountKey("no_route", "", "", "*", OTHER_PATH): 1,
    }
