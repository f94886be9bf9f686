"""A fenced request whose handler is cancelled while its admission runs in a batch
(group commit, store/operation_queue.py): the admission commits with the batch, the
request is never sent, and the effect is settled NOT_SENT at once (its key freed), not
left DISPATCHING for a sweep to make UNKNOWN and block the resource. Both backends.

The store's one writer is held by a write, so that the admission queues; a second
write queues behind it, which runs after the admission in their batch and holds the
batch open (its transaction, its lane) until the test lets it go. The worker goes away
meanwhile: aiohttp's test server cancels a handler whose client went away (`serve`
cancels one past a stop's grace)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from store.base import Tx
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import Fence, FenceFactory, poll_until

RESOURCE = "supplier:widget"
WAIT_S = 10.0
# PostgreSQL: a pool of two is one write lane (store/postgres.py write_lanes), as
# SQLite's one writer.
ONE_LANE = "store_pool: {min_size: 1, max_size: 2}\n"


class Gate:
    """A write that holds its batch open until let go: on SQLite in the writer's
    thread (which runs operations without the event loop), on PostgreSQL on the loop."""

    def __init__(self, fence: Fence) -> None:
        self._in_thread = fence.backend == "sqlite"
        self.started = threading.Event()
        self._go = threading.Event()
        self._go_on_loop = asyncio.Event()

    async def __call__(self, tx: Tx) -> None:
        self.started.set()
        if self._in_thread:
            self._go.wait(WAIT_S)
        else:
            await asyncio.wait_for(self._go_on_loop.wait(), WAIT_S)

    def let_go(self) -> None:
        self._go.set()
        self._go_on_loop.set()


async def test_an_admission_whose_caller_left_mid_batch_is_settled_not_sent_at_once(
    make_fence: FenceFactory, backend: Backend
) -> None:
    fence = await make_fence(top_level=ONE_LANE if backend == "postgresql" else "")
    connector = fence.store.connector
    lease = await fence.acquire(RESOURCE, holder="worker-a")
    holder, behind = Gate(fence), Gate(fence)

    async def queued(n: int) -> bool:
        return connector.writes_queued == n

    holding = asyncio.create_task(connector.write(holder))
    await poll_until(is_set(holder.started), "the writer to be held")
    sent = asyncio.create_task(fence.order("widget", lease["token"], "k-left"))
    await poll_until(lambda: queued(1), "the admission to queue")
    held_open = asyncio.create_task(connector.write(behind))
    await poll_until(lambda: queued(2), "the write behind it to queue")
    holder.let_go()
    # The write behind the admission runs: the admission has run, the batch is open.
    await poll_until(is_set(behind.started), "the batch to run")
    sent.cancel()  # the worker goes away: its connection closes, its handler is cancelled
    with contextlib.suppress(asyncio.CancelledError):
        await sent
    runner = fence.client.server.runner
    assert runner is not None and runner.server is not None
    server = runner.server

    async def handler_cancelled() -> bool:
        # aiohttp cancels the handler as it drops the connection.
        return not server.connections

    await poll_until(handler_cancelled, "the server to drop the worker's connection")
    behind.let_go()
    await asyncio.wait_for(asyncio.gather(holding, held_open), WAIT_S)

    effects: list[Any] = []

    async def settled() -> bool:
        effects[:] = await fence.effects(resource=RESOURCE)
        return len(effects) == 1 and effects[0]["state"] != "DISPATCHING"

    # No sweep: the test clock does not move, so no effect passes its deadline.
    await poll_until(settled, "the admission to be settled")
    (effect,) = effects
    assert effect["state"] == "NOT_SENT", effect
    assert "cancelled" in effect["reason"], effect
    assert await fence.upstream_orders() == 0
    # Nothing blocks the resource and the key is free: the worker's retry is sent.
    retried = await fence.order("widget", lease["token"], "k-left")
    assert retried.status == 201, await retried.text()
    assert await fence.upstream_orders() == 1


def is_set(event: threading.Event) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return event.is_set()

    return check
