"""Keep credentials out of the logs that aiohttp writes itself, and keep their number
bounded.

When aiohttp's parser cannot read a request it logs "Error handling request" with the
exception, whose message quotes the raw line it choked on: a `Fence-Token` or an
admin `Authorization` value would be written to the log as it came. The filter keeps
the record (that a malformed request arrived is worth knowing) and drops the quote.

Anyone who can reach the port can send malformed requests, each an ERROR line: at
most MALFORMED_LINES of them are written per MALFORMED_WINDOW_S, and how many were
left out is said on the next one written (or when the app stops).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

SERVER_LOGGER = "aiohttp.server"
MALFORMED_LINES = 10
MALFORMED_WINDOW_S = 60.0


class LineBudget:
    """At most `most` lines per window of `window_s` seconds (fixed windows, each
    starting at the first line asked for after the previous one ended)."""

    def __init__(self, most: int, window_s: float, clock: Callable[[], float]) -> None:
        self.most = most
        self.window_s = window_s
        self._clock = clock
        self._window_start: float | None = None
        self._written = 0
        # Left out and not yet said.
        self.suppressed = 0

    def take(self) -> bool:
        """Whether a line may be written now; when not, it is counted as suppressed."""
        now = self._clock()
        if self._window_start is None or now - self._window_start >= self.window_s:
            self._window_start = now
            self._written = 0
        if self._written >= self.most:
            self.suppressed += 1
            return False
        self._written += 1
        return True

    def said(self) -> int:
        """The suppressed count, now reported: it starts again from 0."""
        count, self.suppressed = self.suppressed, 0
        return count


def suppressed_note(count: int, budget: LineBudget) -> str:
    return (
        f"{count} more malformed request(s) not logged (at most {budget.most} lines "
        f"per {budget.window_s:g} s)"
    )


class WithholdRequestText(logging.Filter):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.budget = LineBudget(MALFORMED_LINES, MALFORMED_WINDOW_S, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            if not self.budget.take():
                return False
            record.msg = (
                f"{record.getMessage()}: {type(error).__name__} {error.code} "
                "(the request's text is withheld: it may carry credentials)"
            )
            suppressed = self.budget.said()
            if suppressed:
                record.msg += f"; before it, {suppressed_note(suppressed, self.budget)}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


async def redaction_ctx(app: web.Application) -> AsyncIterator[None]:
    """For as long as the app runs (a cleanup_ctx, so the filter goes with it)."""
    logger = logging.getLogger(SERVER_LOGGER)
    withhold = WithholdRequestText()
    logger.addFilter(withhold)
    yield
    logger.removeFilter(withhold)
    suppressed = withhold.budget.said()
    if suppressed:
        logger.error("%s", suppressed_note(suppressed, withhold.budget))
