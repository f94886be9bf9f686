"""Group commit on PostgreSQL (store/operation_queue.py, store/postgres.py): writes that
queue while the connector's lanes are busy run as one transaction, each at its own
time; one write's failure, a deadlock between two replicas' batches, a lost COMMIT
answer and a caller that stops waiting each end as they would for a write alone.

A store opened with a pool of two connections has one lane: a write that holds it (it
waits inside its transaction) lets the test queue others behind it, which then run
together."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, cast

import pytest

from core.lifecycle import Event
from policies.model import StorePool
from proxy.metrics import Metrics
from store import AdmissionInDoubt, Admitted, NewEffect, Store, StoreError, open_store
from store.base import Operation, Tx
from store.postgres import PostgresConnector, PostgresTx, write_lanes
from tests.integration.app import backends
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import granted, new_token_hash
from tests.integration.replicas.conftest import eventually
from tests.nemesis.pgrelay import PgRelay

ONE_LANE = StorePool(1, 2)
WAIT_S = 10.0


@pytest.fixture
def backend() -> Backend:
    return "postgresql"


@contextlib.asynccontextmanager
async def one_lane_store(
    store_url: str, clock: FakeClock, instance_id: str = "instance-1"
) -> AsyncIterator[Store]:
    assert write_lanes(ONE_LANE) == 1
    store = open_store(store_url, clock, instance_id, ONE_LANE)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def connector_of(store: Store) -> PostgresConnector:
    connector = store.connector
    assert isinstance(connector, PostgresConnector)
    return connector


async def batched(
    store: Store, *calls: Callable[[], Coroutine[Any, Any, Any]]
) -> list[asyncio.Task[Any]]:
    """`calls` (each a store call that makes one write), queued behind a write that holds
    the store's one lane, then let go together: they run as one batch. Their tasks."""
    async with lane_held(store) as let_go:
        tasks = [asyncio.create_task(call()) for call in calls]
        await writes_queued(store, len(calls))
        let_go.set()
    await asyncio.wait(tasks, timeout=WAIT_S)
    return tasks


async def writes_queued(store: Store, n: int) -> None:
    """Until `n` writes wait for the store's lane (polled: the queue tells nobody)."""

    async def queued() -> bool:
        return store.connector.writes_queued == n

    await eventually(f"{n} writes to queue behind the lane", queued, WAIT_S, 0.005)


@contextlib.asynccontextmanager
async def lane_held(store: Store) -> AsyncIterator[asyncio.Event]:
    """The store's one lane held by a write until the event it yields is set (at the
    latest on leaving, which waits for that write's end)."""
    held, let_go = asyncio.Event(), asyncio.Event()

    async def hold(tx: Tx) -> None:
        held.set()
        await let_go.wait()

    holding = asyncio.create_task(store.connector.write(hold))
    await asyncio.wait_for(held.wait(), WAIT_S)
    try:
        yield let_go
    finally:
        let_go.set()
        await asyncio.wait_for(holding, WAIT_S)


def writing(
    store: Store, operation: Operation[Any], resource: str | None = None
) -> Callable[[], Coroutine[Any, Any, Any]]:
    return lambda: store.connector.write(operation, resource=resource)


def marking(ran: list[str], name: str) -> Operation[str]:
    """A write that notes, in `ran`, that it ran, and answers its name."""

    async def operation(tx: Tx) -> str:
        ran.append(name)
        return name

    return operation


async def transaction_id(tx: Tx) -> int:
    # The store has no named query for it and needs none: the test asks the connection
    # its transaction runs on (PostgresTx keeps it private; the test is the store's own).
    return int(await cast(PostgresTx, tx)._conn.fetchval("SELECT txid_current()"))


async def backend_of(tx: Tx) -> int:
    return int(await cast(PostgresTx, tx)._conn.fetchval("SELECT pg_backend_pid()"))


def _new(resource: str, key: str) -> NewEffect:
    return NewEffect("place-order", resource, key, f"fp-{key}", "POST", "/orders", 1, 5.0, 60.0)


async def test_writes_queued_behind_a_busy_lane_commit_as_one_transaction(
    store_url: str, clock: FakeClock
) -> None:
    """Three writes, an admission and a receipt behind the lane: one BEGIN and one COMMIT
    for them all, and every statement counted."""
    async with one_lane_store(store_url, clock) as store:
        token = new_token_hash()
        granted(await store.acquire("together", "w", 30, token))
        first = await store.admit(token, _new("together", "k-0"))
        assert isinstance(first, Admitted)
        counted = connector_of(store).round_trips
        before = counted.count
        tasks = await batched(
            store,
            writing(store, transaction_id),
            writing(store, transaction_id),
            lambda: store.finish_effect(
                first.effect.id, Event.ANSWERED_COMMITTED, 201, "ok", None, admitted=first.effect
            ),
            lambda: store.admit(token, _new("together", "k-1")),
            writing(store, transaction_id),
        )
        one, two, _receipt, admitted, three = [task.result() for task in tasks]
        assert one == two == three
        assert isinstance(admitted, Admitted)
        # The lane's holder: BEGIN, clock, COMMIT. The batch: BEGIN, each write's clock
        # and statement, the receipt's statement, the admission's two, COMMIT.
        assert counted.count - before == 3 + 1 + 3 * 2 + 1 + 2 + 1
        settled = await store.effect(first.effect.id)
        assert settled is not None and settled.state.value == "COMMITTED"


async def test_each_write_in_a_batch_runs_at_its_own_time_not_the_transactions_start(
    store_url: str, clock: FakeClock
) -> None:
    """The first write takes 0.3 s: the time the next ones judge by (a lease's expiry,
    an effect's admission) is when they run, not when the batch's transaction began."""
    slow_s = 0.3

    async def slow(tx: Tx) -> tuple[float, int]:
        now = tx.now
        await asyncio.sleep(slow_s)
        return now, await transaction_id(tx)

    async def timed(tx: Tx) -> tuple[float, int]:
        return tx.now, await transaction_id(tx)

    async with one_lane_store(store_url, clock) as store:
        token = new_token_hash()
        granted(await store.acquire("timed", "w", 30, token))
        tasks = await batched(
            store,
            # One resource: the batch runs them in the order they queued.
            writing(store, slow, "timed"),
            writing(store, timed, "timed"),
            lambda: store.admit(token, _new("timed", "k")),
        )
        (started, tx_one), (later, tx_two), admitted = [task.result() for task in tasks]
        assert tx_one == tx_two  # one batch
        assert later >= started + slow_s
        assert isinstance(admitted, Admitted)
        assert admitted.effect.created_at >= started + slow_s


def setting_epoch(resource: str, epoch: int) -> Operation[int]:
    async def operation(tx: Tx) -> int:
        return await tx.execute("set_resource_epoch", resource=resource, epoch=epoch)

    return operation


async def test_one_writes_failure_in_a_batch_is_its_own_answer_alone(
    store_url: str, clock: FakeClock
) -> None:
    """A write that raises and one the database refuses (a constraint) fail the batch's
    transaction: the others run again alone and are kept, each failure is its own."""

    async def raises(tx: Tx) -> None:
        raise LookupError("this write's own failure")

    async def refused(tx: Tx) -> None:
        await cast(PostgresTx, tx)._conn.execute(
            "INSERT INTO resources (resource, epoch) VALUES (NULL, 1)"
        )

    async with one_lane_store(store_url, clock) as store:
        kept_a, failed, refused_task, kept_b = await batched(
            store,
            writing(store, setting_epoch("iso-a", 5)),
            writing(store, raises),
            writing(store, refused),
            writing(store, setting_epoch("iso-b", 5)),
        )
        assert kept_a.result() == kept_b.result() == 1
        with pytest.raises(LookupError, match="own failure"):
            failed.result()
        with pytest.raises(StoreError, match="refused the operation"):
            refused_task.result()
    rows = await backends.rows(
        store_url, "SELECT resource, epoch FROM resources WHERE resource LIKE 'iso-%' ORDER BY 1"
    )
    assert rows == [("iso-a", 5), ("iso-b", 5)]


async def test_two_replicas_batches_that_deadlock_end_in_a_retry_not_an_error(
    store_url: str, clock: FakeClock
) -> None:
    """Each replica's batch locks one resource, then the other's: PostgreSQL breaks the
    deadlock (40P01) by failing one batch, whose writes run again alone and succeed."""
    held = {"dl-a": asyncio.Event(), "dl-b": asyncio.Event()}
    runs: list[str] = []

    def lock(resource: str, then: str | None) -> Operation[str]:
        async def operation(tx: Tx) -> str:
            if then is not None:
                await asyncio.wait_for(held[then].wait(), WAIT_S)
                resource_now = then
            else:
                resource_now = resource
            runs.append(resource_now)
            await tx.execute("lock_resource", resource=resource_now)
            held[resource_now].set()
            return resource_now

        return operation

    async with (
        one_lane_store(store_url, clock, "replica-1") as one,
        one_lane_store(store_url, clock, "replica-2") as two,
    ):
        for resource in held:
            await one.connector.write(lock(resource, None))
        for event in held.values():
            event.clear()
        runs.clear()
        # Replica 1 locks dl-a, then (once replica 2 holds dl-b) dl-b; replica 2 crosswise.
        first, second = await asyncio.gather(
            batched(one, writing(one, lock("dl-a", None)), writing(one, lock("dl-a", "dl-b"))),
            batched(two, writing(two, lock("dl-b", None)), writing(two, lock("dl-b", "dl-a"))),
        )
        answers = [task.result() for task in (*first, *second)]
    assert answers == ["dl-a", "dl-b", "dl-b", "dl-a"]
    assert len(runs) > 4  # the batch that lost the deadlock ran again


async def test_a_lost_commit_answer_leaves_each_admission_of_the_batch_in_doubt(
    store_url: str, clock: FakeClock, relay: PgRelay
) -> None:
    """The batch's COMMIT answer is cut: each admission names its own effect, which
    settle_unsent finds recorded and settles NOT_SENT."""
    async with one_lane_store(relay.url(store_url), clock) as store:
        tokens = [new_token_hash(), new_token_hash()]
        for resource, token in zip(("doubt-a", "doubt-b"), tokens, strict=True):
            granted(await store.acquire(resource, "w", 30, token))
        fault = relay.arm("cut_after_commit", match="fenceproxy_admission_state")
        tasks = await batched(
            store,
            lambda: store.admit(tokens[0], _new("doubt-a", "k")),
            lambda: store.admit(tokens[1], _new("doubt-b", "k")),
        )
        assert fault.wait(5.0)
        lost = []
        for task in tasks:
            with pytest.raises(AdmissionInDoubt) as raised:
                task.result()
            lost.append(raised.value)
        assert [doubt.resource for doubt in lost] == ["doubt-a", "doubt-b"]
        assert lost[0].effect_id != lost[1].effect_id
        for doubt in lost:
            settled = await store.settle_unsent(doubt.effect_id, doubt.resource, "answer lost")
            assert settled is not None and settled.state.value == "NOT_SENT"


async def test_a_caller_that_stops_waiting_is_left_out_of_a_batch_not_yet_taken(
    store_url: str, clock: FakeClock
) -> None:
    ran: list[str] = []

    async with one_lane_store(store_url, clock) as store:
        async with lane_held(store):
            gone = asyncio.create_task(store.connector.write(marking(ran, "gone")))
            kept = asyncio.create_task(store.connector.write(marking(ran, "kept")))
            await writes_queued(store, 2)
            gone.cancel()
            await asyncio.wait([gone])
            assert store.connector.writes_queued == 1  # its caller left: not counted
        assert await asyncio.wait_for(kept, WAIT_S) == "kept"
        assert gone.cancelled()
    assert ran == ["kept"]


async def test_a_caller_that_stops_waiting_while_its_batch_runs_leaves_the_batch_whole(
    store_url: str, clock: FakeClock
) -> None:
    """Its write runs to its end with the others and is kept; the others are answered."""
    started, go_on = asyncio.Event(), asyncio.Event()

    async def slow(tx: Tx) -> int:
        started.set()
        await go_on.wait()
        return await tx.execute("set_resource_epoch", resource="cancelled", epoch=3)

    async def other(tx: Tx) -> int:
        return await tx.execute("set_resource_epoch", resource="answered", epoch=4)

    async with one_lane_store(store_url, clock) as store:
        async with lane_held(store) as let_go:
            cancelled = asyncio.create_task(store.connector.write(slow))
            answered = asyncio.create_task(store.connector.write(other))
            await writes_queued(store, 2)
            let_go.set()
            await asyncio.wait_for(started.wait(), WAIT_S)
            cancelled.cancel()
            go_on.set()
            assert await asyncio.wait_for(answered, WAIT_S) == 1
        assert cancelled.cancelled()
    rows = await backends.rows(
        store_url,
        "SELECT resource, epoch FROM resources WHERE resource IN ('cancelled', 'answered')"
        " ORDER BY 1",
    )
    assert rows == [("answered", 4), ("cancelled", 3)]


async def test_two_replicas_batches_on_crossed_resources_lock_them_in_one_order(
    store_url: str, clock: FakeClock
) -> None:
    """Replica 1's batch writes ord-a then ord-b, replica 2's ord-b then ord-a, each write
    declaring the resource it locks. Each batch runs its writes in resource order, so
    both take ord-a first: one waits for the other's COMMIT, neither deadlocks, and no
    write runs twice. In queue order, each batch's first write took its lock and its
    second waited for the other's: a deadlock, one batch failed and rerun alone."""
    other = {"replica-1": "replica-2", "replica-2": "replica-1"}
    # Per replica: its batch's backend, and how many of its writes hold their lock.
    backend_pid: dict[str, int] = {}
    locked: dict[str, int] = {name: 0 for name in other}
    runs: list[tuple[str, str]] = []

    async def blocked(tx: Tx, pid: int) -> bool:
        return bool(
            await cast(PostgresTx, tx)._conn.fetchval(
                "SELECT cardinality(pg_blocking_pids($1)) > 0", pid
            )
        )

    def lock(replica: str, resource: str) -> Operation[str]:
        async def operation(tx: Tx) -> str:
            runs.append((replica, resource))
            backend_pid[replica] = await backend_of(tx)
            if locked[replica]:
                # The second write: not before the other batch's first holds its lock,
                # or waits for one (for this batch's).
                peer = other[replica]

                async def peer_went_first() -> bool:
                    return locked[peer] > 0 or (
                        peer in backend_pid and await blocked(tx, backend_pid[peer])
                    )

                await eventually("the other batch to lock first", peer_went_first, WAIT_S)
            await tx.execute("lock_resource", resource=resource)
            locked[replica] += 1
            return resource

        return operation

    async with (
        one_lane_store(store_url, clock, "replica-1") as one,
        one_lane_store(store_url, clock, "replica-2") as two,
    ):
        for resource in ("ord-a", "ord-b"):  # their rows exist: each batch only locks
            await one.connector.write(setting_epoch(resource, 1))
        first, second = await asyncio.gather(
            batched(
                one,
                lambda: one.connector.write(lock("replica-1", "ord-a"), resource="ord-a"),
                lambda: one.connector.write(lock("replica-1", "ord-b"), resource="ord-b"),
            ),
            batched(
                two,
                lambda: two.connector.write(lock("replica-2", "ord-b"), resource="ord-b"),
                lambda: two.connector.write(lock("replica-2", "ord-a"), resource="ord-a"),
            ),
        )
        answers = [task.result() for task in (*first, *second)]
    assert answers == ["ord-a", "ord-b", "ord-b", "ord-a"]
    assert sorted(runs) == sorted(set(runs))  # no write ran twice: no batch was rerun
    assert len(runs) == 4


async def test_a_batch_runs_its_writes_in_resource_order_keeping_queue_order_per_resource(
    store_url: str, clock: FakeClock
) -> None:
    """Stable: writes to one resource keep the order they queued in; writes that declare
    no resource run after those that do, in queue order."""
    ran: list[str] = []

    async with one_lane_store(store_url, clock) as store:
        writes = [
            ("b-1", "r-b"),
            ("none-1", None),
            ("a-1", "r-a"),
            ("b-2", "r-b"),
            ("none-2", None),
            ("a-2", "r-a"),
        ]
        tasks = await batched(
            store,
            *[
                (
                    lambda name=name, resource=resource: store.connector.write(
                        marking(ran, name), resource=resource
                    )
                )
                for name, resource in writes
            ],
        )
        assert [task.result() for task in tasks] == [name for name, _ in writes]
    assert ran == ["a-1", "a-2", "b-1", "b-2", "none-1", "none-2"]


async def test_the_metrics_export_the_writes_waiting_for_a_lane(
    store_url: str, clock: FakeClock
) -> None:
    def exported(metrics: bytes) -> str:
        found = re.search(rb"^fenceproxy_store_writes_queued (\S+)$", metrics, re.MULTILINE)
        assert found is not None
        return found.group(1).decode()

    async with one_lane_store(store_url, clock) as store:
        metrics = Metrics()
        async with lane_held(store):
            waiting = [asyncio.create_task(store.connector.write(transaction_id)) for _ in "ab"]
            await writes_queued(store, 2)
            assert exported(await metrics.render(store)) == "2.0"
        await asyncio.wait(waiting, timeout=WAIT_S)
        assert exported(await metrics.render(store)) == "0.0"
