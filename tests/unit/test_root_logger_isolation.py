"""A test that runs the CLI's `serve` in-process configures the root logger on the
stream pytest gave it, which pytest closes afterwards. Left in place, every later log
line fails ("--- Logging error ---") and prints a traceback; these two tests, in this
order, pin that the shared fixture puts the root logger back."""

from __future__ import annotations

import logging

import pytest

from proxy import telemetry


def test_configuring_logging_under_capture(capsys: pytest.CaptureFixture[str]) -> None:
    telemetry.configure_logging("text", "DEBUG")
    logging.getLogger("fenceproxy").info("configured")
    assert "configured" in capsys.readouterr().err


def test_the_next_test_finds_the_root_logger_as_it_was() -> None:
    root = logging.getLogger()
    assert root.level == logging.WARNING
    own = [handler for handler in root.handlers if type(handler) is logging.StreamHandler]
    assert own == [], [getattr(handler, "stream", None) for handler in own]
