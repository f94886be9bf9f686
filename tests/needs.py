"""What a test needs from the machine (a browser, pgbouncer, promtool, a built image)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(reason: str) -> NoReturn:
    """Stop a test whose tool is not on this machine: skipped locally, failed under CI,
    where `.ci/run` installs every tool the tests need, so a missing one is a broken
    setup rather than a test to leave out."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)
