"""How long a pause can still get a fenced write through: the time from the send
deadline's check to the whole request handed to the kernel.

    python -m bench.send_gap [--requests 2000] [--concurrency 1] [--body-bytes 64]

Sends fenced POSTs through the proxy's own fenced session (FencedRequest, which
checks the send deadline) to a minimal upstream in this process, and times, from the
start of FencedRequest.send (the check comes first):

* `written`: to its return. aiohttp has then written the head and as much of the
  body as the socket took (its writer task starts eagerly); for a body that fits the
  socket's buffer, the whole request.
* `received`: to the upstream (same process, same clock) having read the whole
  request: an upper bound of the time to the last byte written, whatever the body.

A pause inside that gap is the only one the send deadline cannot see. Prints p50,
p99 and the maximum of each, in microseconds, on the send deadline's clock.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from core.outcomes import Answered
from core.send_deadline import SendDeadline
from policies import Upstream
from proxy import forwarding

SEQ = "X-Seq"
checked: dict[str, float] = {}
written: list[float] = []
received: list[float] = []


class TimedRequest(forwarding.FencedRequest):
    async def send(self, conn: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
        started = checked[self.headers[SEQ]] = forwarding.SEND_CLOCK()
        response = await super().send(conn)
        written.append(forwarding.SEND_CLOCK() - started)
        return response


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )
            await reader.readexactly(length)
            seq = next(
                line.split(b":", 1)[1].strip().decode()
                for line in head.lower().split(b"\r\n")
                if line.startswith(SEQ.lower().encode())
            )
            received.append(forwarding.SEND_CLOCK() - checked[seq])
            writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(requests: int, concurrency: int, body_bytes: int) -> None:
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = Upstream("bench", f"http://127.0.0.1:{port}", 5, 1, send_window_s=5)
    session = forwarding.new_client_session(concurrency, request_class=TimedRequest)
    url = URL(f"{upstream.url}/orders/x")
    body = b"x" * body_bytes
    left = iter(range(requests))

    async def worker() -> None:
        for seq in left:
            deadline = SendDeadline.start(upstream.send_window_s, forwarding.SEND_CLOCK)
            result, _ = await forwarding.dispatch(
                session, upstream, "POST", url, CIMultiDict({SEQ: str(seq)}), body, deadline
            )
            assert result == Answered(201), result

    try:
        async with server:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await session.close()
    print(f"{requests} requests, concurrency {concurrency}, {body_bytes}-byte bodies:")
    for name, gaps in (("written", written), ("received", received)):
        micros = sorted(gap * 1e6 for gap in gaps)
        p99 = micros[min(len(micros) - 1, int(len(micros) * 0.99))]
        print(
            f"  check to {name}: p50 {statistics.median(micros):.0f} us, "
            f"p99 {p99:.0f} us, max {micros[-1]:.0f} us"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--body-bytes", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.concurrency, args.body_bytes))
