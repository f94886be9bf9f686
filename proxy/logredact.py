"""Keep credentials out of the logs that aiohttp writes itself.

When aiohttp's parser cannot read a request it logs "Error handling request" with the
exception, whose message quotes the raw line it choked on: a `Fence-Token` or an
admin `Authorization` value would be written to the log as it came. The filter keeps
the record (that a malformed request arrived is worth knowing) and drops the quote.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

SERVER_LOGGER = "aiohttp.server"


class WithholdRequestText(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg = (
                f"{record.getMessage()}: {type(error).__name__} {error.code} "
                "(the request's text is withheld: it may carry credentials)"
            )
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
