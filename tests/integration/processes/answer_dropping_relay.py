"""An HTTP relay that loses answers on their way back: between a worker and fenceproxy.

    python -m tests.integration.processes.answer_dropping_relay PORT TARGET_URL

Every request is forwarded to TARGET_URL (a new connection each) and its whole answer
read. While a drop count is set, the answer to a ``PUT /rules/...`` is not relayed: the
worker's connection is closed instead, after the proxy forwarded the write, recorded
its receipt and answered. Exactly a lost answer: the write happened, its sender cannot
know.

``POST /_relay/drop?puts=N``: drop the answers of the next N rule PUTs (0: none).
``GET /_relay/dropped``: ``{"dropped": N}``, how many answers were dropped so far.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
STATE_LOCK = threading.Lock()
STATE = {"to_drop": 0, "dropped": 0}


class Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    target: tuple[str, int] = ("127.0.0.1", 0)

    def _answer(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _control(self) -> None:
        parts = urlsplit(self.path)
        with STATE_LOCK:
            if self.command == "POST" and parts.path == "/_relay/drop":
                STATE["to_drop"] = int(parse_qs(parts.query)["puts"][0])
            self._answer(200, {"dropped": STATE["dropped"], "to_drop": STATE["to_drop"]})

    def _drops_this(self) -> bool:
        if self.command != "PUT" or not self.path.startswith("/rules/"):
            return False
        with STATE_LOCK:
            if STATE["to_drop"] <= 0:
                return False
            STATE["to_drop"] -= 1
            STATE["dropped"] += 1
            return True

    def _relay(self) -> None:
        if self.path.startswith("/_relay/"):
            self._control()
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = http.client.HTTPConnection(*self.target, timeout=30)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            answer_body = answer.read()
        finally:
            upstream.close()
        if self._drops_this():
            sys.stderr.write(f"dropped the answer ({answer.status}) to {self.path}\n")
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP and name.lower() not in ("date", "server"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer_body)))
        self.end_headers()
        self.wfile.write(answer_body)

    do_GET = do_POST = do_PUT = do_DELETE = _relay

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.command} {self.path}\n")


def main() -> None:
    target = urlsplit(sys.argv[2])
    Relay.target = (target.hostname or "127.0.0.1", target.port or 80)
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Relay).serve_forever()


if __name__ == "__main__":
    main()
