"""Every background loop of the proxy, run one way: rounds under supervision, with one
back-off, one way of logging a failed round, and one failure metric.

A loop runs a round every `interval_s`, or sooner when its `wake` event is set. A round
that fails never ends the loop: a store that does not answer is logged as a warning (it
is expected, and /readyz says so already); anything else is logged with its traceback
and counted in `fenceproxy_background_failures_total{loop=NAME}`. Either way the next
round waits twice as long as the last, up to 2**MAX_DOUBLINGS times the interval, and
the first round that succeeds brings the pause back to the interval. Only cancellation
(the app stopping) ends a loop, or, for a loop run `until_done`, a round that succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from store import StoreUnavailable

log = logging.getLogger("fenceproxy.periodic")

# The loops by name: the `loop` label of the failure metric (docs/reference/metrics.md).
RECONCILER = "reconciler"
COLLECTOR = "collector"
REFUSAL_COUNTS = "refusal-counts"
RETENTION = "retention"
SETTLE_UNSENT = "settle-unsent"
LOOPS = (RECONCILER, COLLECTOR, REFUSAL_COUNTS, RETENTION, SETTLE_UNSENT)

# After failed rounds in a row: the interval x 2, x 4 ... up to x 16.
MAX_DOUBLINGS = 4


def pause_after(interval_s: float, failures: int) -> float:
    """The pause before the next round, after `failures` failed rounds in a row."""
    return interval_s * 2.0 ** min(failures, MAX_DOUBLINGS)


async def wait_or_wake(wake: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or until `wake` is set; then clear it. Not `asyncio.wait_for`:
    on Python 3.11 it swallows a cancellation that comes as the event is set, and the
    app's stop would then wait out the next pause."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()
    wake.clear()


@dataclass
class Periodic:
    """One background loop: `round` every `interval_s`, supervised (see the module)."""

    name: str
    round: Callable[[], Awaitable[object]]
    interval_s: float
    # Told the loop's name for each round that failed unexpectedly (the metric).
    on_failure: Callable[[str], None]
    # Set to run a round now (a test, or work that should not wait for the interval).
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # The first round after one pause rather than at once.
    wait_first: bool = False
    # Stop after the first round that succeeds (work that is done once it is done).
    until_done: bool = False
    # How a pause is waited for (a test's clock in its place).
    wait: Callable[[asyncio.Event, float], Awaitable[None]] = wait_or_wake
    # What the loop works on, in its log lines after its name (" of eff_1").
    about: str = ""
    # Failed rounds in a row, so far.
    failures: int = 0

    async def run(self) -> None:
        if self.wait_first:
            await self.wait(self.wake, self.interval_s)
        while True:
            if await self.run_round() and self.until_done:
                return
            await self.wait(self.wake, pause_after(self.interval_s, self.failures))

    async def run_round(self) -> bool:
        """One round; whether it succeeded. Nothing but cancellation (or a
        BaseException that is no Exception) gets out of it."""
        try:
            await self.round()
        except StoreUnavailable as exc:
            self.failures += 1
            log.warning(
                "%s%s: the store is unavailable (%s); next round in %g s",
                self.name,
                self.about,
                exc,
                pause_after(self.interval_s, self.failures),
            )
            return False
        except Exception:
            self.failures += 1
            self.on_failure(self.name)
            log.exception(
                "%s%s: round failed; next round in %g s",
                self.name,
                self.about,
                pause_after(self.interval_s, self.failures),
            )
            return False
        self.failures = 0
        return True
