"""The log lines of malformed requests: their text withheld, their number bounded per
window, and the ones left out said, on a clock the test moves."""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import BadHttpMessage

from proxy.logredact import (
    MALFORMED_LINES,
    MALFORMED_WINDOW_S,
    LineBudget,
    WithholdRequestText,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def malformed() -> logging.LogRecord:
    error = BadHttpMessage("Fence-Token fpt_SECRET")
    return logging.LogRecord(
        "aiohttp.server",
        logging.ERROR,
        __file__,
        1,
        "Error handling request from %s",
        ("127.0.0.1",),
        (BadHttpMessage, error, None),
    )


def other() -> logging.LogRecord:
    return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "other", (), None)


def test_at_most_the_budget_per_window_and_then_the_count_left_out() -> None:
    clock = Clock()
    withhold = WithholdRequestText(clock)
    first = [malformed() for _ in range(MALFORMED_LINES + 25)]
    passed = [record for record in first if withhold.filter(record)]
    assert len(passed) == MALFORMED_LINES
    assert all("SECRET" not in record.getMessage() for record in passed)
    # Other lines are never held back.
    assert withhold.filter(other())

    clock.now += MALFORMED_WINDOW_S - 0.001
    assert not withhold.filter(malformed())  # still the same window: 26 left out
    clock.now += 0.001
    record = malformed()
    assert withhold.filter(record)
    assert record.getMessage().endswith(
        f"; before it, 26 more malformed request(s) not logged "
        f"(at most {MALFORMED_LINES} lines per {MALFORMED_WINDOW_S:g} s)"
    )
    # Said once: the next line carries no count.
    following = malformed()
    assert withhold.filter(following)
    assert "not logged" not in following.getMessage()


def test_a_budget_counts_what_it_refuses_until_said() -> None:
    clock = Clock()
    budget = LineBudget(2, 10.0, clock)
    assert [budget.take() for _ in range(5)] == [True, True, False, False, False]
    assert budget.said() == 3
    assert budget.said() == 0
    clock.now += 10.0
    assert budget.take()
