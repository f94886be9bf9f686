"""A SQLite COMMIT that raises after it may have committed: an I/O error while the log
is written can leave the whole transaction in it, which the next start replays. The
store says so (`CommitUnknown`; an admission names its effect: `AdmissionInDoubt`),
never retries such a batch, and the proxy settles the effect NOT_SENT before it tells
the worker that nothing was sent, as on PostgreSQL (the process test in
tests/integration/replicas/test_lost_admission.py).

The failure is injected where SQLite would raise it: the sqlite3 connection's `execute`
of the writer's "COMMIT", which runs (or not) and then raises. The connector reaches
that connection through aiosqlite's `_conn` (store/sqlite.py says why), which is where
the fixture puts a connection that fails on cue in its place."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from typing import Any

import aiosqlite
import pytest

from store import AdmissionInDoubt, Admitted, CommitUnknown, NewEffect, StoreUnavailable
from store.base import Tx
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock, Fence, assert_problem
from tests.integration.app.test_metrics import labels, scrape
from tests.integration.app.test_store_contract import (
    acquire,
    granted,
    new_token_hash,
    running_store,
)


@pytest.fixture
def backend() -> Backend:
    return "sqlite"


class FailingCommit:
    """Once armed, the next COMMIT of a transaction that ran a statement holding
    `match` (the app's other writers, such as its refusal counts, commit too): run
    (`commits`) or not, then raise `error`."""

    def __init__(self) -> None:
        self.armed = False
        self.match = "INSERT INTO effects"
        self.commits = True
        self.error: sqlite3.Error = sqlite3.OperationalError("disk I/O error")
        self.fired = 0
        # Each connection's statements since its BEGIN IMMEDIATE (the writer's).
        self.statements: dict[int, list[str]] = {}


class _FailingConnection:
    """The sqlite3 connection of one aiosqlite connection, with `execute` watched."""

    def __init__(self, conn: sqlite3.Connection, control: FailingCommit, key: int) -> None:
        self._conn = conn
        self._control = control
        self._key = key

    def execute(self, sql: str, *args: Any) -> Any:
        control = self._control
        if sql == "BEGIN IMMEDIATE":
            control.statements[self._key] = []
        said = control.statements.setdefault(self._key, [])
        said.append(sql)
        if sql == "COMMIT" and control.armed and any(control.match in line for line in said):
            control.armed = False
            control.fired += 1
            if control.commits:
                self._conn.execute(sql, *args)
            raise control.error
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.fixture
def failing_commit(monkeypatch: pytest.MonkeyPatch) -> Iterator[FailingCommit]:
    control = FailingCommit()
    plain = aiosqlite.Connection._conn

    def watched(self: aiosqlite.Connection) -> Any:
        conn = plain.__get__(self)
        return _FailingConnection(conn, control, id(self))

    monkeypatch.setattr(aiosqlite.Connection, "_conn", property(watched))
    yield control


def _new(resource: str, key: str) -> NewEffect:
    return NewEffect("place-order", resource, key, "fp", "POST", "/orders/x", 1, 5.0, 60.0)


async def test_an_admission_whose_commit_raised_is_in_doubt_and_settles_not_sent(
    store_url: str, clock: FakeClock, failing_commit: FailingCommit
) -> None:
    async with running_store(store_url, clock) as store:
        token = new_token_hash()
        granted(await store.acquire("r", "w", 30, token))
        failing_commit.armed = True
        with pytest.raises(AdmissionInDoubt) as raised:
            await store.admit(token, _new("r", "k"))
        lost = raised.value
        assert failing_commit.fired == 1
        effect = await store.effect(lost.effect_id)
        assert effect is not None and effect.state.value == "DISPATCHING"
        settled = await store.settle_unsent(lost.effect_id, "r", "its answer was lost")
        assert settled is not None and settled.state.value == "NOT_SENT"
        again = await store.admit(token, _new("r", "k"))  # the key was freed
        assert isinstance(again, Admitted), again


async def test_a_commit_refused_busy_is_not_in_doubt(
    store_url: str, clock: FakeClock, failing_commit: FailingCommit
) -> None:
    """SQLITE_BUSY leaves the transaction open, and the rollback ends it: nothing was
    written, which the plain StoreUnavailable ("nothing was done") says."""
    async with running_store(store_url, clock) as store:
        token = new_token_hash()
        granted(await store.acquire("r", "w", 30, token))
        busy = sqlite3.OperationalError("database is locked")
        busy.sqlite_errorcode = sqlite3.SQLITE_BUSY
        failing_commit.error, failing_commit.commits, failing_commit.armed = busy, False, True
        with pytest.raises(StoreUnavailable) as raised:
            await store.admit(token, _new("r", "k"))
        assert not isinstance(raised.value, CommitUnknown)
        assert await store.effects(resource="r") == []


async def test_a_batch_whose_commit_is_in_doubt_is_not_run_again(
    store_url: str, clock: FakeClock, failing_commit: FailingCommit
) -> None:
    runs: list[str] = []

    def counted(name: str) -> Any:
        async def operation(tx: Tx) -> str:
            runs.append(name)
            await tx.execute("set_resource_epoch", resource=name, epoch=3)
            return name

        return operation

    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "warm-up"))
        failing_commit.match, failing_commit.armed = "INSERT INTO resources", True
        results = await asyncio.gather(
            store.connector.write(counted("a")),
            store.connector.write(counted("b")),
            return_exceptions=True,
        )
    assert [type(result) for result in results] == [CommitUnknown, CommitUnknown]
    assert sorted(runs) == ["a", "b"]  # once each: they may have committed already


async def test_the_worker_is_told_nothing_was_sent_and_the_retry_goes_through(
    fence: Fence, failing_commit: FailingCommit
) -> None:
    lease = await fence.acquire("supplier:widget", "worker-a")
    failing_commit.armed = True
    answer = await fence.order("widget", lease["token"], "k-1")
    body = await assert_problem(answer, 503, "store_unavailable")
    assert failing_commit.fired == 1
    assert "nothing was sent" in body["detail"], body
    assert "nothing was done" not in body["detail"], body
    assert body["settled"] is True and body["state"] == "NOT_SENT", body
    [effect] = await fence.effects()
    assert effect["state"] == "NOT_SENT", effect
    assert await fence.upstream_orders() == 0
    # What an operator alerts on: every 503 store_unavailable is counted.
    metrics = await scrape(fence)
    assert metrics["fenceproxy_refusals_total"][labels(code="store_unavailable")] == 1
    retry = await fence.order("widget", lease["token"], "k-1")
    assert retry.status == 201, await retry.text()
    assert await fence.upstream_orders() == 1
