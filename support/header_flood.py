"""A header flood without a credential, as a client: many connections each sending
header after header of a request head that never ends, no credential needed.

Used by the process test (tests/integration/processes/test_header_flood.py, scaled
down) and the benchmark (bench/header_flood.py, the issue's full size). One thread,
non-blocking sockets: every connection gets a piece in turn, so the proxy sees them
all growing at once, as it would from many attackers.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HEADER_VALUE_BYTES = 60 * 1024
SEND_BUFFER_BYTES = 16 * 1024


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS of /proc/PID/status), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class _Attacker:
    sock: socket.socket
    pending: bytes
    headers_left: int
    received: bytes = b""
    closed_by_proxy: bool = False

    @property
    def finished(self) -> bool:
        return self.closed_by_proxy or (not self.pending and self.headers_left == 0)


@dataclass
class FloodResult:
    connections: int
    bytes_sent: int
    closed_by_proxy: int
    answers: list[bytes] = field(default_factory=list)  # what each connection received


class HeaderFlood:
    """`connections` connections, each sending a request line and then `headers`
    headers of HEADER_VALUE_BYTES, with no blank line after them. Runs in a thread
    from `start()`; the connections stay open after their last header (until the
    proxy closes them or `stop()`). With `reconnect_s`, for that many seconds from
    `start()` a connection the proxy closes is replaced by a new one that starts over,
    as an attacker who does not give up would."""

    def __init__(
        self, host: str, port: int, connections: int, headers: int, reconnect_s: float = 0.0
    ) -> None:
        self._address = (host, port)
        self._connections = connections
        self._headers = headers
        self._reconnect_s = reconnect_s
        self._reconnect_until = 0.0
        self._stopping = threading.Event()
        self.all_sent = threading.Event()
        self._thread = threading.Thread(target=self._run, name="header-flood", daemon=True)
        self._attackers: list[_Attacker] = []
        self._unfinished = 0
        self.bytes_sent = 0

    def start(self) -> None:
        self._reconnect_until = time.monotonic() + self._reconnect_s
        for _ in range(self._connections):
            self._open()
        self._thread.start()

    def _open(self) -> _Attacker:
        sock = socket.create_connection(self._address, timeout=5)
        # Little in the kernel's send buffer: what it holds flows on while this thread
        # waits for a core, and once the proxy has dropped LINGER_BYTES after its 431 it
        # closes, and the bytes still arriving reset the connection, discarding the 431
        # before this thread reads it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        sock.setblocking(False)
        line = f"GET /orders/flood-{len(self._attackers)} HTTP/1.1\r\nHost: proxy\r\n".encode()
        attacker = _Attacker(sock, line, self._headers)
        self._attackers.append(attacker)
        self._unfinished += 1
        return attacker

    def done(self) -> bool:
        """Every connection sent all its headers or was closed by the proxy (and the
        time to reconnect is over)."""
        return self.all_sent.is_set()

    def stop(self) -> FloodResult:
        self._stopping.set()
        self._thread.join(timeout=10)
        for attacker in self._attackers:
            attacker.sock.close()
        return FloodResult(
            len(self._attackers),
            self.bytes_sent,
            sum(attacker.closed_by_proxy for attacker in self._attackers),
            [attacker.received for attacker in self._attackers],
        )

    def _next_piece(self, attacker: _Attacker) -> bytes:
        if not attacker.pending and attacker.headers_left > 0:
            number = self._headers - attacker.headers_left
            attacker.headers_left -= 1
            attacker.pending = b"X-Flood-%d: " % number + b"a" * HEADER_VALUE_BYTES + b"\r\n"
        return attacker.pending

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for attacker in self._attackers:
            selector.register(attacker.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, attacker)
        while not self._stopping.is_set():
            for key, events in selector.select(timeout=0.05):
                attacker = key.data
                if events & selectors.EVENT_READ:
                    self._receive(selector, attacker)
                elif events & selectors.EVENT_WRITE:
                    self._send(selector, attacker)
            if self._unfinished == 0:
                self.all_sent.set()
        selector.close()

    def _send(self, selector: selectors.BaseSelector, attacker: _Attacker) -> None:
        piece = self._next_piece(attacker)
        if not piece:
            selector.modify(attacker.sock, selectors.EVENT_READ, attacker)
            self._unfinished -= 1
            return
        try:
            sent = attacker.sock.send(piece)
        except OSError:
            self._closed(selector, attacker)
            return
        self.bytes_sent += sent
        attacker.pending = piece[sent:]

    def _receive(self, selector: selectors.BaseSelector, attacker: _Attacker) -> None:
        try:
            data = attacker.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            attacker.received += data
        else:
            self._closed(selector, attacker)

    def _closed(self, selector: selectors.BaseSelector, attacker: _Attacker) -> None:
        if not attacker.finished:
            self._unfinished -= 1
        attacker.closed_by_proxy = True
        selector.unregister(attacker.sock)
        attacker.sock.close()
        if time.monotonic() < self._reconnect_until and not self._stopping.is_set():
            replacement = self._open()
            selector.register(
                replacement.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, replacement
            )
