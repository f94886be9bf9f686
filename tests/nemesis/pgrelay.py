"""A TCP relay in front of PostgreSQL that cuts, holds or drops what the test says.

The relay listens on 127.0.0.1 (a free port) and forwards every connection to the
PostgreSQL server it was given. It reads just enough of the wire protocol (PostgreSQL's
"Frontend/Backend Protocol", chapter 55) to act on a transaction's COMMIT:

* the startup phase: messages without a type byte (int32 length, int32 code). An
  SSLRequest or a GSSENCRequest is answered ``N`` by the relay itself (asyncpg's
  default `sslmode=prefer` asks first, then goes on in plain text); a CancelRequest is
  piped as it is; the StartupMessage is forwarded and ends the phase;
* then frontend messages (1 type byte, int32 length): a simple Query ``Q`` (asyncpg
  sends BEGIN, ``COMMIT;`` and ROLLBACK so), and the extended protocol's Parse ``P``
  (a statement's text, remembered under its name: asyncpg's statement cache binds a
  prepared statement by name without parsing it again) and Bind ``B``. The text of
  every statement since BEGIN is the transaction's text, which a fault matches.

It runs an event loop on a thread of its own, so a test (async or not) or a harness
in the test process drives it with plain calls::

    with PgRelay("127.0.0.1", 5432) as relay:
        url = relay.url(pg_url)           # the same URL, through the relay
        fault = relay.arm("cut_after_commit", match="fenceproxy_admission_state")
        ... the proxy's admission runs ...
        assert fault.wait(5.0) and fault.report.committed

`arm` sets a fault for the NEXT transaction whose text holds `match` (a substring,
case-sensitive), at its COMMIT, once; what it did is its `report` (`Fault.wait`
answers when it has acted). The actions:

* ``pass``: forward as usual (a way to see that a transaction committed);
* ``cut_before_commit``: close both sides without forwarding the COMMIT: the server
  sees the connection end inside the transaction and rolls it back;
* ``cut_after_commit``: close the client's side at once, then (after `delay_s`)
  forward the COMMIT, read the server's answer and drop it: the server commits, the
  client never hears it. With `delay_s`, the COMMIT is still on its way while the
  client reconnects (the old backend holds its locks until it arrives);
* ``hold``: forward the COMMIT, hold the server's answer for `delay_s`, then pass it
  on (`then="pass"`) or close both sides (`then="cut"`).

`blackhole_after=True` turns the blackhole (below) on as the fault acts, before the
client can reconnect: the store then stays unreachable until `blackhole(False)`.

For a harness: `cut_all()` closes every connection open now (new ones pass);
`blackhole(True)` stops forwarding anything, both ways, on every connection old and
new (sockets stay open, as a network partition would leave them) until
`blackhole(False)`, which delivers what was held (as TCP would retransmit it).
`connections` counts the connections accepted so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

Action = Literal["pass", "cut_before_commit", "cut_after_commit", "hold"]
ACTIONS: tuple[Action, ...] = ("pass", "cut_before_commit", "cut_after_commit", "hold")

T = TypeVar("T")
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_CHUNK = 65536
# How long a cut_after_commit waits for the server's answer it drops.
_ANSWER_TIMEOUT_S = 10.0


@dataclass
class Report:
    """What a fault did. `committed`: the server answered the COMMIT with CommandComplete
    ``COMMIT`` (False: it answered otherwise, e.g. ``ROLLBACK`` for a failed
    transaction; None: the COMMIT was not forwarded, or no answer was read)."""

    action: Action
    forwarded_commit: bool = False
    committed: bool | None = None
    answer_tag: str | None = None
    delivered_answer: bool = False
    transaction: str = ""


@dataclass
class Fault:
    action: Action
    match: str
    delay_s: float = 0.0
    then: Literal["pass", "cut"] = "pass"
    blackhole_after: bool = False
    report: Report | None = None
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def wait(self, timeout_s: float) -> bool:
        """Whether the fault has acted (its report is complete) within `timeout_s`."""
        return self._done.wait(timeout_s)

    @property
    def done(self) -> bool:
        return self._done.is_set()


class PgRelay:
    """127.0.0.1:`port` → `host`:`target_port`; see the module's docstring."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.connections = 0
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        # Cleared by blackhole(True): everything waits for it before it is forwarded.
        self.flowing = asyncio.Event()
        self.flowing.set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    # -- life ------------------------------------------------------------------------

    def start(self) -> PgRelay:
        self._thread.start()
        self._server = self._call(self._listen())
        return self

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        self._loop.close()

    def __enter__(self) -> PgRelay:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def url(self, postgres_url: str) -> str:
        """`postgres_url` with its host and port replaced by the relay's."""
        parts = urlsplit(postgres_url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    # -- control ---------------------------------------------------------------------

    def arm(
        self,
        action: Action,
        match: str,
        *,
        delay_s: float = 0.0,
        then: Literal["pass", "cut"] = "pass",
        blackhole_after: bool = False,
    ) -> Fault:
        """A fault for the next transaction whose statements since BEGIN hold `match`."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        fault = Fault(action, match, delay_s, then, blackhole_after)
        with self._lock:
            self._faults.append(fault)
        return fault

    def disarm(self) -> None:
        """Forget every fault that has not acted yet."""
        with self._lock:
            self._faults.clear()

    def cut_all(self) -> None:
        """Close every connection open now, both sides; new ones pass."""
        self._call(self._cut_all())

    def blackhole(self, on: bool = True) -> None:
        """Forward nothing (both ways, every connection, new ones too) while on."""
        self._loop.call_soon_threadsafe(self.flowing.clear if on else self.flowing.set)

    # -- inside the relay's loop -----------------------------------------------------

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10.0)

    async def _listen(self) -> asyncio.Server:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut_all()

    async def _cut_all(self) -> None:
        for link in list(self._links):
            link.close()

    def take_fault(self, transaction: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.match in transaction:
                    self._faults.remove(fault)
                    return fault
        return None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        link = _Link(self, reader, writer, up_reader, up_writer)
        self._links.add(link)
        try:
            await link.run()
        finally:
            self._links.discard(link)
            link.close()


class _Link:
    """One client connection and its server connection."""

    def __init__(
        self,
        relay: PgRelay,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        self.relay = relay
        self.reader, self.writer = reader, writer
        self.up_reader, self.up_writer = up_reader, up_writer
        self.statements: dict[bytes, str] = {}
        self.transaction: list[str] | None = None
        # Set while the server's answers are not the client's to read (a fault's).
        self.diverted: asyncio.Queue[tuple[bytes, bytes]] | None = None

    def close(self) -> None:
        for writer in (self.writer, self.up_writer):
            writer.close()

    async def run(self) -> None:
        downstream = asyncio.ensure_future(self._server_to_client())
        try:
            await self._client_to_server()
        except (OSError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.close()
            with contextlib.suppress(Exception):
                await downstream

    async def _hole(self) -> None:
        await self.relay.flowing.wait()

    # -- client → server ---------------------------------------------------------------

    async def _client_to_server(self) -> None:
        while True:  # the startup phase: no type byte
            head = await self.reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            rest = await self.reader.readexactly(length - 8)
            if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                self.writer.write(b"N")
                await self.writer.drain()
                continue
            await self._hole()
            self.up_writer.write(head + rest)
            await self.up_writer.drain()
            if code == _CANCEL_REQUEST:
                await self._pipe_raw()
                return
            break
        while True:
            kind = await self.reader.readexactly(1)
            head = await self.reader.readexactly(4)
            (length,) = struct.unpack("!i", head)
            body = await self.reader.readexactly(length - 4)
            message = kind + head + body
            if kind == b"Q":
                acted = await self._on_query(_text(body), message)
                if acted is not None:
                    if acted:
                        return
                    continue  # the fault forwarded this COMMIT itself: not a second time
            if kind == b"P":
                name, _, rest = body.partition(b"\0")
                self._said(_text(rest))
                self.statements[name] = _text(rest)
            elif kind == b"B":
                _, _, rest = body.partition(b"\0")
                name = rest.partition(b"\0")[0]
                text = self.statements.get(name)
                # A Parse and its Bind in one transaction: the statement said once.
                if text is not None and self.transaction and self.transaction[-1] != text:
                    self.transaction.append(text)
            await self._hole()
            self.up_writer.write(message)
            await self.up_writer.drain()

    def _said(self, text: str) -> None:
        if self.transaction is not None:
            self.transaction.append(text)

    async def _pipe_raw(self) -> None:
        while chunk := await self.reader.read(_CHUNK):
            self.up_writer.write(chunk)
            await self.up_writer.drain()

    async def _on_query(self, text: str, message: bytes) -> bool | None:
        """A simple query; None when no fault took it (it is forwarded as it is), else
        whether the fault ended the connection (a fault that did not forwarded it)."""
        # One message may hold several statements ("BEGIN; SELECT ...", "SELECT ...;
        # COMMIT"): a transaction begins with its first and ends with its last.
        words = [part.split(None, 1)[0].upper() for part in text.split(";") if part.strip()]
        if words and words[0] in ("BEGIN", "START"):
            self.transaction = [text]
            return None
        if "ROLLBACK" in words or "ABORT" in words:
            self.transaction = None
            return None
        if not words or words[-1] not in ("COMMIT", "END") or self.transaction is None:
            self._said(text)
            return None
        statements, self.transaction = "\n".join(self.transaction), None
        fault = self.relay.take_fault(statements)
        if fault is None:
            return None
        fault.report = Report(fault.action, transaction=statements)
        if fault.blackhole_after:
            self.relay.flowing.clear()  # this link's own COMMIT is forwarded regardless
        try:
            return await self._act(fault, fault.report, message)
        finally:
            fault._done.set()

    async def _act(self, fault: Fault, report: Report, commit: bytes) -> bool:
        if fault.action == "pass":
            await self._deliver(report, await self._forward_commit(report, commit))
            return False
        if fault.action == "cut_before_commit":
            self.close()
            return True
        if fault.action == "cut_after_commit":
            self.writer.close()
            await asyncio.sleep(fault.delay_s)
            await self._forward_commit(report, commit)  # its answer is dropped
            self.up_writer.close()
            return True
        # hold
        answer = await self._forward_commit(report, commit)
        await asyncio.sleep(fault.delay_s)
        if fault.then == "cut":
            self.close()
            return True
        await self._deliver(report, answer)
        return False

    async def _forward_commit(self, report: Report, commit: bytes) -> bytes:
        """Send the COMMIT with the server's answers diverted; read them up to
        ReadyForQuery and answer them (not yet passed on)."""
        self.diverted = asyncio.Queue()
        self.up_writer.write(commit)
        await self.up_writer.drain()
        report.forwarded_commit = True
        answer = b""
        try:
            async with asyncio.timeout(_ANSWER_TIMEOUT_S):
                while True:
                    kind, message = await self.diverted.get()
                    answer += message
                    # The last command's tag: a COMMIT may follow other statements in
                    # its message.
                    if kind == b"C":
                        report.answer_tag = _text(message[5:])
                        report.committed = report.answer_tag == "COMMIT"
                    if kind == b"Z" or kind == b"":
                        break
        except TimeoutError:
            pass
        return answer

    async def _deliver(self, report: Report, answer: bytes) -> None:
        self.diverted = None
        self.writer.write(answer)
        await self.writer.drain()
        report.delivered_answer = True

    # -- server → client ---------------------------------------------------------------

    async def _server_to_client(self) -> None:
        try:
            while True:
                kind = await self.up_reader.readexactly(1)
                head = await self.up_reader.readexactly(4)
                (length,) = struct.unpack("!i", head)
                message = kind + head + await self.up_reader.readexactly(length - 4)
                if self.diverted is not None:  # a fault's, whatever else holds
                    self.diverted.put_nowait((kind, message))
                    continue
                await self._hole()
                self.writer.write(message)
                await self.writer.drain()
        except (OSError, asyncio.IncompleteReadError, ConnectionError):
            if self.diverted is not None:
                self.diverted.put_nowait((b"", b""))
        finally:
            self.writer.close()


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")
