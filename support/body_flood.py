"""A flood of requests whose body never arrives, as a client: many connections each
sending a whole request head that promises a body (Content-Length), then nothing.

Used by the process test (tests/integration/processes/test_control_flood.py). Like
support/header_flood.py: one thread, non-blocking sockets, on 127.0.0.1 only; the
connections stay open until the proxy closes them or `stop()`. What each connection
received is kept, to tell a refusal from an eviction from a connection still held.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Promised and never sent: far below any body limit, so the size is never the refusal.
PROMISED_BODY_BYTES = 64


@dataclass
class _Flooder:
    sock: socket.socket
    port: int  # its own, on 127.0.0.1
    received: bytes = b""
    closed_by_proxy: bool = False


@dataclass
class BodyFloodResult:
    connections: int
    answers: list[bytes] = field(default_factory=list)  # what each connection received
    closed_by_proxy: int = 0
    ports: set[int] = field(default_factory=set)  # the connections' own

    def statuses(self) -> list[int | None]:
        """Each connection's answer status; None: nothing came back."""
        found: list[int | None] = []
        for answer in self.answers:
            line = answer.partition(b"\r\n")[0]
            found.append(int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None)
        return found


def request_head(method: str, path: str, headers: dict[str, str]) -> bytes:
    """A head that promises PROMISED_BODY_BYTES of JSON."""
    lines = [f"{method} {path} HTTP/1.1", "Host: proxy", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {PROMISED_BODY_BYTES}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def accepted_from(pid: int, server_port: int, client_ports: set[int]) -> set[int]:
    """Of these client ports on 127.0.0.1, those whose connection to `server_port`
    process `pid` has accepted (holds a socket of, by /proc/net/tcp's inode)."""
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found: set[int] = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(local.rpartition(":")[2], 16) != server_port or inode not in inodes:
            continue
        port = int(remote.rpartition(":")[2], 16)
        if port in client_ports:
            found.add(port)
    return found


class BodyFlood:
    """`connections` connections to host:port, connection `n` sending `head(n)` and
    never the body it promises. `start()` returns once every head is sent; a thread
    then reads what the proxy answers until `stop()`."""

    def __init__(
        self,
        host: str,
        port: int,
        connections: int,
        head: Callable[[int], bytes],
    ) -> None:
        self._address = (host, port)
        self._connections = connections
        self._head = head
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="body-flood", daemon=True)
        self._flooders: list[_Flooder] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        for _ in range(self._connections):
            self._open()
        self._thread.start()

    def _open(self) -> _Flooder:
        sock = socket.create_connection(self._address, timeout=5)
        # Closed by the proxy already (refused): the reader sees it.
        with contextlib.suppress(OSError):
            sock.sendall(self._head(len(self._flooders)))
        sock.setblocking(False)
        flooder = _Flooder(sock, sock.getsockname()[1])
        with self._lock:
            self._flooders.append(flooder)
        return flooder

    def taken_in(self, pid: int) -> bool:
        """Whether process `pid` (the proxy) has either closed or accepted every
        connection: then each head reached it, and the flood is held or refused."""
        with self._lock:
            open_ports = {flooder.port for flooder in self._flooders if not flooder.closed_by_proxy}
        return accepted_from(pid, self._address[1], open_ports) == open_ports

    def stop(self) -> BodyFloodResult:
        self._stopping.set()
        self._thread.join(timeout=10)
        for flooder in self._flooders:
            flooder.sock.close()
        return BodyFloodResult(
            len(self._flooders),
            [flooder.received for flooder in self._flooders],
            sum(flooder.closed_by_proxy for flooder in self._flooders),
            {flooder.port for flooder in self._flooders},
        )

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for flooder in self._flooders:
            selector.register(flooder.sock, selectors.EVENT_READ, flooder)
        while not self._stopping.is_set():
            for key, _ in selector.select(timeout=0.05):
                flooder = key.data
                try:
                    data = flooder.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    flooder.received += data
                    continue
                selector.unregister(flooder.sock)
                with self._lock:
                    flooder.closed_by_proxy = True
        selector.close()
