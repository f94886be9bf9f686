"""Shared by every suite: on failure, show what the test's child processes said; the
root logger left as each test found it."""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from typing import Any, Protocol, runtime_checkable

import pytest


@runtime_checkable
class HasLogTails(Protocol):
    """A fixture value that runs processes (a stack, a fleet) and can show their logs."""

    def log_tails(self) -> list[tuple[str, str]]: ...


def _pytests_own(handler: logging.Handler) -> bool:
    """pytest's capturing handlers, which it adds and removes itself at each phase."""
    return type(handler).__module__.startswith("_pytest.")


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """The root logger's own handlers and level as they were before the test: `serve`
    run in-process sets a handler on the test's captured stderr, which pytest then
    closes, and every later log line would fail on it."""
    root = logging.getLogger()
    handlers = [handler for handler in root.handlers if not _pytests_own(handler)]
    level = root.level
    yield
    for handler in root.handlers[:]:
        if not _pytests_own(handler) and handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


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
