"""`serve`'s logs and traces: the log format (`--log-format text|json`), tracing
(`--tracing off|otlp`) and the middleware that opens each request's scope
(core/telemetry.py) when either needs one.

A JSON line carries the time, level, logger and message, then what the work under way
is about: the request id, the route, the resource, the effect id and the epoch (once
known), and the trace and span ids when tracing is on. Never a header, a token, an
idempotency key or a body: the scope holds identifiers only, and the messages are the
proxy's own (the filter in proxy/logredact.py withholds the one aiohttp writes with a
request's text in it).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from core import telemetry

LOG_FORMATS = ("text", "json")
LOG_FORMAT_ENV = "FENCEPROXY_LOG_FORMAT"
TRACING = ("off", "otlp")
TRACING_ENV = "FENCEPROXY_TRACING"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The scope's fields a JSON line carries, in this order, when known.
LINE_FIELDS = ("request_id", "route", "resource", "effect_id", "epoch")
# A worker's own X-Request-Id names its request in the logs when it looks like an id;
# anything else is replaced by one of the proxy's (a header is the worker's to write).
REQUEST_ID_HEADER = "X-Request-Id"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def check_options(log_format: str, tracing: str) -> None:
    """argparse checks what is typed, not a default read from the environment."""
    for value, choices, option, env in (
        (log_format, LOG_FORMATS, "--log-format", LOG_FORMAT_ENV),
        (tracing, TRACING, "--tracing", TRACING_ENV),
    ):
        if value not in choices:
            raise ValueError(f"{env}={value!r}: {option} is one of {', '.join(choices)}")


class JsonLines(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        scope = telemetry.fields()
        for name in LINE_FIELDS:
            if name in scope:
                line[name] = scope[name]
        ids = telemetry.ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        moment = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{moment}.{int(record.msecs):03d}Z"


def configure_logging(log_format: str, level: str) -> None:
    """The root logger's one handler, on stderr, in `log_format`."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def request_id(request: web.Request) -> str:
    sent = request.headers.get(REQUEST_ID_HEADER)
    if sent is not None and _REQUEST_ID.fullmatch(sent):
        return sent
    return secrets.token_hex(8)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def scope_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Each request's scope, outside every other middleware so that refusals are in it:
    with tracing on, the request's span, named by its route once one matched."""
    with telemetry.scope(
        request.method,
        request.headers,
        request_id=request_id(request),
        **{"http.request.method": request.method, "url.path": request.rel_url.raw_path},
    ) as span:
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # a redirect of the status page, for one
            if span is not None:
                span.rename(_span_name(request))
                span.answered(exc.status)
            raise
        if span is not None:
            span.rename(_span_name(request))
            span.answered(response.status)
        return response


def _span_name(request: web.Request) -> str:
    """`METHOD route` for a policy route (its name: few, and the operator's words), else
    `METHOD /_fence/...` as the control API's router names the path (no identifiers)."""
    route = telemetry.fields().get("route")
    if route is not None:
        return f"{request.method} {route}"
    info = request.match_info.route.resource
    canonical = info.canonical if info is not None else None
    if canonical is not None and canonical.startswith("/_fence/"):
        return f"{request.method} {canonical}"
    return request.method
