"""A recording upstream for the wire tests: raw asyncio sockets, so it sees bytes.

`python -m tests.wire.recording_upstream --port P --dir D` serves HTTP/1.1 on
127.0.0.1:P. Every request it reads is logged as one JSON file under D/log (its raw
bytes as received, and its parsed method, target, headers and body), written before
any byte of the answer leaves, so that a test reading the log after its answer sees
everything the upstream saw.

The answer is scripted by the test, out of band: a request carrying the header
`Wire-Script: T` is answered as D/scripts/T.json says (see `Script`), and logged as
D/log/T/<n>.json. A request without it (the proxy's probe) is logged under
D/log/_effect-<its Fence-Effect-Id>/ (or D/log/_unscripted/) and answered as a
truthful, percent-decoding upstream would answer `GET /probe/{key}`: 200 if a
complete request with that Idempotency-Key was logged, else 404.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

SCRIPT_HEADER = "wire-script"
PROBE_PREFIX = "/probe/"
HEAD_LIMIT = 1 << 20
READ_SIZE = 65536
# A large body is never written (or chunked) in more than this many pieces, and only
# the first gaps pause: an example stays well under a second whatever it asks for.
MAX_PIECES = 256
PAUSED_GAPS = 3


def body_bytes(spec: dict[str, Any]) -> bytes:
    """A body from its spec: literal bytes (base64), or `size` bytes made from `seed`
    (a large body is described, not shipped, between the test and this process)."""
    if "literal" in spec:
        return base64.b64decode(spec["literal"])
    size: int = spec["size"]
    seed: int = spec["seed"]
    unit = bytes((seed + i * 7) % 256 for i in range(251))
    return (unit * (size // len(unit) + 1))[:size]


def header_text(spec: str | dict[str, int]) -> str:
    """A header value from its spec: the text itself, or `size` visible ASCII characters
    made from `seed` (a long line, e.g. a Content-Security-Policy, is described, not
    shipped)."""
    if isinstance(spec, str):
        return spec
    size, seed = spec["size"], spec["seed"]
    unit = "".join(chr(0x21 + (seed + i * 7) % 94) for i in range(97))
    return (unit * (size // len(unit) + 1))[:size]


@dataclass(frozen=True)
class Script:
    """How to answer one request (all fields from the script's JSON)."""

    status: int
    reason: str
    headers: list[tuple[str, str]]  # names and values as UTF-8 text (`header_text`)
    body: bytes
    framing: str  # "length", "chunked" or "close" (delimited by closing)
    pieces: list[int]  # sizes of the writes, cycled; empty: one write
    pause_s: float  # between writes
    misbehave: str | None  # None, "cut", "close_before_answer", "junk", "close_mid_request"
    cut_at: int  # "cut": body bytes sent before closing

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Script:
        return cls(
            status=data["status"],
            reason=data["reason"],
            headers=[(name, header_text(value)) for name, value in data["headers"]],
            body=body_bytes(data["body"]),
            framing=data["framing"],
            pieces=list(data.get("pieces", [])),
            pause_s=float(data.get("pause_s", 0.0)),
            misbehave=data.get("misbehave"),
            cut_at=int(data.get("cut_at", 0)),
        )


class BadRequest(Exception):
    """The bytes are not an HTTP/1.1 request this upstream can read."""


class Recorder:
    def __init__(self, directory: Path) -> None:
        self.scripts = directory / "scripts"
        self.log = directory / "log"
        self.scripts.mkdir(parents=True, exist_ok=True)
        self.log.mkdir(parents=True, exist_ok=True)
        self._serial = itertools.count()
        self._keys_received: set[bytes] = set()

    def write_log(self, folder: str, record: dict[str, Any]) -> None:
        """One folder per token (or effect): a long search makes 10^5 of them, and a
        test reading one must not list them all."""
        directory = self.log / folder
        directory.mkdir(exist_ok=True)
        name = f"{next(self._serial)}.json"
        temporary = directory / f".{name}.tmp"
        temporary.write_text(json.dumps(record))
        os.replace(temporary, directory / name)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buffer = bytearray()
        try:
            while await self._one_exchange(reader, writer, buffer):
                pass
        except (ConnectionError, BadRequest, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one_exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, buffer: bytearray
    ) -> bool:
        """Read one request, log it, answer it; False once the connection is done."""
        while b"\r\n\r\n" not in buffer:
            chunk = await reader.read(READ_SIZE)
            if not chunk:
                return False
            buffer += chunk
            if len(buffer) > HEAD_LIMIT:
                raise BadRequest("head too large")
        end = buffer.index(b"\r\n\r\n") + 4
        head = bytes(buffer[:end])
        del buffer[:end]
        lines = head[:-4].split(b"\r\n")
        method, target, _version = lines[0].split(b" ", 2)
        headers = [_header(line) for line in lines[1:]]
        lower = [(name.lower(), value) for name, value in headers]
        token = next((v.decode() for n, v in lower if n == SCRIPT_HEADER.encode()), None)
        effect = next((v.decode() for n, v in lower if n == b"fence-effect-id"), None)
        folder = token or (f"_effect-{effect}" if effect else "_unscripted")
        script = self._script(token)
        raw = bytearray(head)
        if script is not None and script.misbehave == "close_mid_request":
            self.write_log(folder, _record(method, target, headers, raw, b"", complete=False))
            return False
        body, complete = await _read_body(reader, buffer, lower, raw)
        self.write_log(folder, _record(method, target, headers, raw, body, complete))
        if not complete:
            return False
        key = next((v for n, v in lower if n == b"idempotency-key"), None)
        if key is not None:
            self._keys_received.add(key)
        if script is None:
            await self._answer_probe(writer, target)
            return True
        return await _answer(writer, script, head_only=method == b"HEAD")

    def _script(self, token: str | None) -> Script | None:
        if token is None:
            return None
        return Script.from_json(json.loads((self.scripts / f"{token}.json").read_text()))

    async def _answer_probe(self, writer: asyncio.StreamWriter, target: bytes) -> None:
        path = target.partition(b"?")[0]
        found = False
        if path.startswith(PROBE_PREFIX.encode()):
            found = unquote_to_bytes(path[len(PROBE_PREFIX) :]) in self._keys_received
        status = b"200 OK" if found else b"404 Not Found"
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()


def _header(line: bytes) -> tuple[bytes, bytes]:
    name, colon, value = line.partition(b":")
    if not colon:
        raise BadRequest(f"not a header line: {line!r}")
    return name, value.strip(b" \t")


def _record(
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    raw: bytearray,
    body: bytes,
    complete: bool,
) -> dict[str, Any]:
    def text(value: bytes) -> str:
        return base64.b64encode(value).decode()

    return {
        "at": time.time(),
        "method": text(method),
        "target": text(target),
        "headers": [[text(n), text(v)] for n, v in headers],
        "body": text(body),
        "raw": text(bytes(raw)),
        "complete": complete,
    }


async def _read_body(
    reader: asyncio.StreamReader,
    buffer: bytearray,
    headers: list[tuple[bytes, bytes]],
    raw: bytearray,
) -> tuple[bytes, bool]:
    """The body as framed by Content-Length or chunked; (what arrived, complete?)."""

    async def fill(needed: int) -> bool:
        while len(buffer) < needed:
            chunk = await reader.read(READ_SIZE)
            if not chunk:
                return False
            buffer.extend(chunk)
        return True

    def take(count: int) -> bytes:
        piece = bytes(buffer[:count])
        del buffer[:count]
        raw.extend(piece)
        return piece

    encodings = [v.lower() for n, v in headers if n == b"transfer-encoding"]
    if encodings:
        body = bytearray()
        while True:
            while b"\r\n" not in buffer:
                if not await fill(len(buffer) + 1):
                    return bytes(body), False
            size_line = take(buffer.index(b"\r\n") + 2)
            size = int(size_line.split(b";")[0].strip(), 16)
            if not await fill(size + 2):
                body += take(len(buffer))
                return bytes(body), False
            body += take(size)
            take(2)
            if size == 0:
                return bytes(body), True
    lengths = [v for n, v in headers if n == b"content-length"]
    length = int(lengths[0]) if lengths else 0
    complete = await fill(length)
    return take(min(length, len(buffer))), complete


async def _answer(writer: asyncio.StreamWriter, script: Script, head_only: bool) -> bool:
    """Write the scripted answer; True if the connection stays open for the next one."""
    if script.misbehave == "close_before_answer":
        return False
    if script.misbehave == "junk":
        writer.write(b"\x00\x16junk that is no HTTP status line\r\n\r\n")
        await writer.drain()
        return False
    head = f"HTTP/1.1 {script.status} ".encode() + script.reason.encode("utf-8") + b"\r\n"
    for name, value in script.headers:
        head += name.encode() + b": " + value.encode("utf-8") + b"\r\n"
    body = b"" if head_only else script.body
    if script.framing == "length":
        head += f"Content-Length: {len(script.body)}\r\n".encode()
        payload = body
    elif script.framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n"
        payload = _chunked(body, script.pieces) if not head_only else b""
    else:
        payload = body
    if script.framing == "close" or script.misbehave is not None:
        # Said, so that the proxy never sends its next request on a connection this
        # upstream is closing (a cut with nothing to cut is a whole answer, and would
        # otherwise leave the connection in the proxy's pool, closed under it).
        head += b"Connection: close\r\n"
    head += b"\r\n"
    if script.misbehave == "cut" and payload:
        # A cut leaves at least one byte out: the framing says the body is not over.
        payload = payload[: min(script.cut_at, len(payload) - 1)]
    await _write_in_pieces(writer, head + payload, script.pieces, script.pause_s)
    return script.misbehave is None and script.framing != "close"


def _chunked(body: bytes, pieces: list[int]) -> bytes:
    out = bytearray()
    sizes = itertools.cycle(pieces or [len(body) or 1])
    position = 0
    while position < len(body):
        size = max(1, next(sizes), len(body) // MAX_PIECES)
        chunk = body[position : position + size]
        out += f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        position += size
    return bytes(out + b"0\r\n\r\n")


async def _write_in_pieces(
    writer: asyncio.StreamWriter, data: bytes, pieces: list[int], pause_s: float
) -> None:
    if not pieces:
        writer.write(data)
        await writer.drain()
        return
    position = 0
    for gap, size in enumerate(itertools.cycle(pieces)):
        piece = data[position : position + max(1, size, len(data) // MAX_PIECES)]
        if not piece:
            return
        writer.write(piece)
        await writer.drain()
        position += len(piece)
        if pause_s and gap < PAUSED_GAPS and position < len(data):
            await asyncio.sleep(pause_s)


async def main(port: int, directory: Path) -> None:
    recorder = Recorder(directory)
    server = await asyncio.start_server(recorder.serve, "127.0.0.1", port, limit=HEAD_LIMIT)
    (directory / "ready").write_text(str(os.getpid()))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.port, arguments.dir))
