"""Shared by every suite: on failure, show what the test's child processes said."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol, runtime_checkable

import pytest


@runtime_checkable
class HasLogTails(Protocol):
    """A fixture value that runs processes (a stack, a fleet) and can show their logs."""

    def log_tails(self) -> list[tuple[str, str]]: ...


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """On failure, add the tail of every process's log to the test's report."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed:
        return
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, HasLogTails):
            report.sections.extend(value.log_tails())
