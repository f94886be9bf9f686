"""Failpoints: the names and syntax pause tests rely on, and a point that stops the
process stops it where it says, once when told so."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from core import failpoints


def test_the_syntax_names_points_and_once() -> None:
    assert failpoints.parse("") == (frozenset(), frozenset())
    assert failpoints.parse(" admitted , before_send:once,,sent,cancelled:once ") == (
        frozenset({"admitted", "before_send", "cancelled", "sent"}),
        frozenset({"before_send", "cancelled"}),
    )
    # Named both ways, in either order, it fires every time.
    for spec in ("sent:once,sent", "sent,sent:once"):
        assert failpoints.parse(spec) == (frozenset({"sent"}), frozenset())


@pytest.mark.parametrize("spec", ["admited", "admitted:twice", "sent:"])
def test_an_unknown_point_or_modifier_is_refused(spec: str) -> None:
    with pytest.raises(failpoints.FailpointError, match=failpoints.ENV):
        failpoints.parse(spec)


def test_off_by_default_and_reaching_a_disabled_point_does_nothing() -> None:
    stopped = []
    assert failpoints.configure({}, lambda: stopped.append(True)) == frozenset()
    failpoints.reach(failpoints.ADMITTED)
    assert stopped == []


CHILD = """
import sys
from core import failpoints
from proxy.cli_serve import stop_this_process
failpoints.configure({failpoints.ENV: sys.argv[1]}, stop_this_process)
for _ in range(2):
    print("before", flush=True)
    failpoints.reach(failpoints.SENT)
    print("after", flush=True)
"""


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].startswith("T")


def _wait(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize(("spec", "stops"), [("sent:once", 1), ("sent", 2)])
def test_an_enabled_point_stops_the_process_until_continued(spec: str, stops: int) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, spec], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        try:
            for _ in range(stops):
                assert child.stdout.readline() == "before\n"
                _wait(lambda: _stopped(child.pid))
                child.send_signal(signal.SIGCONT)
                assert child.stdout.readline() == "after\n"
            assert child.wait(timeout=10) == 0
            assert child.stdout.read() == "before\nafter\n" * (2 - stops)
        finally:
            child.kill()  # a stopped child too, else leaving `with` would wait for it
