"""A raw HTTP/1.1 worker: the bytes on the socket are exactly the ones the test built.

One request per connection. The answer is parsed by hand, so that a cut body is seen
as a cut (`complete` False), never as a short complete body.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from dataclasses import dataclass

READ_SIZE = 65536
MAX_PIECES = 256


@dataclass(frozen=True)
class WorkerRequest:
    method: str
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]  # in order, duplicates kept, as sent
    body: bytes
    framing: str  # "length", "chunked" or "none" (no body framing header at all)
    pieces: tuple[int, ...] = ()  # write sizes (and chunk sizes when chunked)
    pause_s: float = 0.0

    def wire_bytes(self) -> bytes:
        head = self.method.encode() + b" " + self.target + b" HTTP/1.1\r\n"
        for name, value in self.headers:
            head += name + b": " + value + b"\r\n"
        if self.framing == "length":
            head += f"Content-Length: {len(self.body)}\r\n".encode()
            payload = self.body
        elif self.framing == "chunked":
            head += b"Transfer-Encoding: chunked\r\n"
            payload = chunked(self.body, self.pieces)
        else:
            payload = b""
        return head + b"\r\n" + payload


def chunked(body: bytes, pieces: tuple[int, ...]) -> bytes:
    out = bytearray()
    sizes = itertools.cycle(pieces or (len(body) or 1,))
    position = 0
    while position < len(body):
        size = max(1, next(sizes), len(body) // MAX_PIECES)
        chunk = body[position : position + size]
        out += f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        position += size
    return bytes(out + b"0\r\n\r\n")


@dataclass(frozen=True)
class WorkerAnswer:
    """What came back. `status` None: the connection ended before a status line."""

    status: int | None
    reason: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    complete: bool  # the body ended where its framing said it would
    malformed: bool = False  # bytes that break HTTP/1.1 framing (e.g. not a chunk size)

    def header(self, name: str) -> list[bytes]:
        wanted = name.lower().encode()
        return [value for key, value in self.headers if key.lower() == wanted]


class Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.closed = False

    def fill(self, needed: int) -> bool:
        while len(self.buffer) < needed and not self.closed:
            self._recv()
        return len(self.buffer) >= needed

    def fill_until(self, marker: bytes) -> bool:
        while marker not in self.buffer and not self.closed:
            self._recv()
        return marker in self.buffer

    def _recv(self) -> None:
        try:
            chunk = self.sock.recv(READ_SIZE)
        except ConnectionResetError:
            chunk = b""
        if chunk:
            self.buffer += chunk
        else:
            self.closed = True

    def take(self, count: int) -> bytes:
        piece = bytes(self.buffer[:count])
        del self.buffer[:count]
        return piece


def exchange(port: int, request: WorkerRequest, timeout_s: float = 30.0) -> WorkerAnswer:
    data = request.wire_bytes()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        # The proxy may answer (and close) before reading everything.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            _send(sock, data, request.pieces, request.pause_s)
        return read_answer(Connection(sock), request.method == "HEAD")


def exchange_then_follow(
    port: int, request: WorkerRequest, follow: WorkerRequest, timeout_s: float = 30.0
) -> tuple[WorkerAnswer, WorkerAnswer | None]:
    """Send `request` and read its answer; then, if the proxy did not say it closes,
    `follow` on the same connection. The second answer is None when the proxy closed
    the connection after the first: its end is read (bounded by `timeout_s`), so a
    connection left open fails as a timeout, never passes by luck."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            _send(sock, request.wire_bytes(), request.pieces, request.pause_s)
        connection = Connection(sock)
        first = read_answer(connection, request.method == "HEAD")
        if b"close" in [value.lower() for value in first.header("Connection")]:
            while not connection.closed:
                connection.fill(len(connection.buffer) + 1)
            return first, None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(follow.wire_bytes())
        return first, read_answer(connection, follow.method == "HEAD")


def _send(sock: socket.socket, data: bytes, pieces: tuple[int, ...], pause_s: float) -> None:
    if not pieces:
        sock.sendall(data)
        return
    position = 0
    for gap, size in enumerate(itertools.cycle(pieces)):
        piece = data[position : position + max(1, size, len(data) // MAX_PIECES)]
        if not piece:
            return
        sock.sendall(piece)
        position += len(piece)
        if pause_s and gap < 3 and position < len(data):
            time.sleep(pause_s)


def read_answer(connection: Connection, head_only: bool) -> WorkerAnswer:
    while True:
        if not connection.fill_until(b"\r\n\r\n"):
            return WorkerAnswer(None, b"", (), bytes(connection.buffer), False)
        end = connection.buffer.index(b"\r\n\r\n") + 4
        head = connection.take(end)
        lines = head[:-4].split(b"\r\n")
        _version, status_text, reason = ([*lines[0].split(b" ", 2), b""])[:3]
        status = int(status_text)
        headers = tuple(_header(line) for line in lines[1:])
        if not 100 <= status < 200:
            break
    lower = [(name.lower(), value) for name, value in headers]
    if head_only or status in (204, 304):
        return WorkerAnswer(status, reason, headers, b"", True)
    if any(n == b"transfer-encoding" for n, _ in lower):
        try:
            body, complete = _read_chunked(connection)
        except ValueError:
            return WorkerAnswer(status, reason, headers, b"", False, malformed=True)
    else:
        lengths = [v for n, v in lower if n == b"content-length"]
        if lengths:
            length = int(lengths[0])
            complete = connection.fill(length)
            body = connection.take(length)
        else:
            while not connection.closed:
                connection.fill(len(connection.buffer) + 1)
            body, complete = connection.take(len(connection.buffer)), True
    return WorkerAnswer(status, reason, headers, body, complete)


def _read_chunked(connection: Connection) -> tuple[bytes, bool]:
    body = bytearray()
    while True:
        if not connection.fill_until(b"\r\n"):
            return bytes(body), False
        size_line = connection.take(connection.buffer.index(b"\r\n") + 2)
        size = int(size_line.split(b";")[0].strip(), 16)
        if not connection.fill(size + 2):
            return bytes(body + connection.take(len(connection.buffer))), False
        body += connection.take(size)
        connection.take(2)
        if size == 0:
            return bytes(body), True


def _header(line: bytes) -> tuple[bytes, bytes]:
    name, _, value = line.partition(b":")
    return name, value.strip(b" \t")
