"""A rules API that is not the demo upstream: its GET answers another JSON shape
(``{"data": {...}}`` where the demo answers ``{"rule": {...}}``), as a team's real
upstream might. For the MCP example's test of a worker that cannot read an answer.

    python -m tests.integration.processes.other_shape_upstream PORT

``GET /healthz``: 200. ``GET /rules/{id}``: 200 ``{"data": {"route_to": "us-east"}}``.
``PUT /rules/{id}``: 200, counted. ``GET /puts``: ``{"puts": N}``.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PUTS_LOCK = threading.Lock()
PUTS = [0]


class Handler(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._answer(200, {"ok": True})
        elif self.path == "/puts":
            with PUTS_LOCK:
                self._answer(200, {"puts": PUTS[0]})
        elif self.path.startswith("/rules/"):
            self._answer(200, {"data": {"route_to": "us-east"}})
        else:
            self._answer(404, {"error": "not found"})

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with PUTS_LOCK:
            PUTS[0] += 1
        self._answer(200, {"ok": True})

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.command} {self.path}\n")


def main() -> None:
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()


if __name__ == "__main__":
    main()
