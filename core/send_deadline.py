"""The send deadline: until when an admitted effect may still be sent, and from when
another replica may take it for no longer in flight.

A replica can be paused anywhere (a GC, a VM, SIGSTOP), the gap between its admission
and its send included. Meanwhile the other replicas see a DISPATCHING effect and, past
its deadline, settle it (sweep, probe, operator), which may free its key and its
resource. A paused replica that then sent its request would land a stale write (a
newer epoch wrote meanwhile) or a doubled one (the key was retried elsewhere).

So the two sides keep to one budget, `send_window_s` (per upstream):

* The admitting replica sends only while its own monotonic clock, started before the
  admission's transaction began, has not run past the window. It checks as late as it
  can: once it has the upstream connection, right before the request's first byte is
  written. Past it, nothing is sent: the effect is settled NOT_SENT.
* The store records `deadline = admitted_at + send_window_s + upstream_timeout_s`, by
  the store's clock: a request sent at the last moment of the window is given up on
  (its total timeout, counted from before the send) by then. Nobody takes the effect
  for no longer in flight before `deadline + DEADLINE_MARGIN_S` (core/lifecycle.py:
  the sweep and `check_resolvable`), the margin absorbing the two clocks' drift over
  the window and scheduling delay.

What no check can cover is a pause after the last check, before the bytes leave the
socket (docs/explanation/fenced-request.md measures that gap).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core.frozen import quick_init


@quick_init
@dataclass(frozen=True)
class SendDeadline:
    """One admission's send budget, on the admitting process's own monotonic clock."""

    started: float  # `clock()` taken before the admission's transaction began
    window_s: float
    clock: Callable[[], float]

    @classmethod
    def start(cls, window_s: float, clock: Callable[[], float]) -> SendDeadline:
        return cls(clock(), window_s, clock)

    def overdue_s(self) -> float:
        """How far past the deadline the clock is now; negative: time left to send."""
        return self.clock() - (self.started + self.window_s)

    def passed(self) -> bool:
        return self.overdue_s() > 0


def in_flight_until(admitted_at: float, send_window_s: float, upstream_timeout_s: float) -> float:
    """The effect's stored deadline: until then (on the store's clock) its request may
    still be sent and on its way."""
    return admitted_at + send_window_s + upstream_timeout_s


def sent_by(
    created_at: float, deadline: float, upstream_timeout_s: float, finished_at: float | None
) -> float:
    """The latest time an effect's request can have been sent: its deadline less the
    upstream timeout, or, if its own replica recorded a receipt (`finished_at`), that
    receipt's time, whichever is earlier; never before its admission. A probe's settle
    window counts from here, not from the admission: a request sent late in its
    window may land late too."""
    latest = deadline - upstream_timeout_s
    if finished_at is not None:
        latest = min(latest, finished_at)
    return max(created_at, latest)
