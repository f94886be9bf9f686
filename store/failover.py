"""The store's watch over its PostgreSQL database's history: what it saw, and the
recovery when the database lost what the store acknowledged (store/history.py has the
rules and why).

The connector (store/postgres.py) only carries: it hands this watch what each new
connection's server answers to the `history` query and what every BEGIN and COMMIT
message told (`fenceproxy_history_position()`'s notice), and gives it a transaction on
the very connection that found a loss. What is judged, what is kept, and what recovery
writes (named queries of store/postgres_history.sql, and `fence_all`, the function
`store fence-restore` calls) are decided here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from store import history
from store.base import Operation, Row, Tx
from store.history import FAILOVER_EPOCH_ADVANCE, Position, RecoveryWindow, Replication
from store.housekeeping import fence_all

log = logging.getLogger("fenceproxy")

# Runs an operation in a transaction of its own on the connection that found a loss.
Transaction = Callable[[Operation[Any]], Awaitable[Any]]


@dataclass(frozen=True)
class Loss:
    """The server's position as judged (`current`), and why what was seen is lost."""

    current: Position
    reason: str


@dataclass(frozen=True)
class _Recovered:
    window: RecoveryWindow | None
    floor: int
    by_this_process: bool


class HistoryWatch:
    def __init__(self) -> None:
        # The recovery window as last read from the store.
        self.recovery: RecoveryWindow | None = None
        self.replication: Replication | None = None
        # The newest WAL position this process saw: a later one behind it went back,
        # one on another timeline is another history.
        self.seen: Position | None = None
        # The highest epoch floor this process set or found in a recovery: a recovery on
        # a database that never saw it (an old primary come back) raises past it.
        self._floor = 0
        # False where the WAL functions are refused: transactions are not checked.
        self.checked = False
        self._unchecked_said = False

    def cannot_read_wal(self, why: Exception) -> None:
        """A role or a service that may not read the WAL position: no check."""
        if not self._unchecked_said:
            self._unchecked_said = True
            log.warning(
                "the WAL position cannot be read (%s): a failover that lost history "
                "cannot be detected; after one, run `fenceproxy store fence-restore` and "
                "restart every replica",
                why,
            )

    async def connected(
        self, row: Row, before: Position | None, statements: Tx, transaction: Transaction
    ) -> None:
        """A new connection's server (`row`: its `history` or `history_unchecked`, read
        when `seen` was `before`): has the database lost what this store acknowledged?
        If so, recover at once, before this connection serves anything; and note the
        recovery window and the replication state either way. `statements` run on that
        connection outside a transaction."""
        self.recovery = _window(row)
        self.replication = history.replication_of(row)
        if row["walfile"] is None:
            self.checked = False
            return
        self.checked = True
        inserted = history.parse_position(row["walfile"], row["inserted"])
        current = Position(inserted.timeline, inserted.lsn, int(row["next_xid"]))
        recorded = row["history_timeline"]
        lost = history.judge(recorded, current, before)
        if lost is not None:
            await self.recover(transaction, Loss(current, lost))
            return
        if recorded is None:
            await statements.execute("record_history_timeline", timeline=current.timeline)
        self.seen = history.advance(
            self.seen, history.parse_position(row["walfile"], row["flushed"])
        )

    def opened(self, told: tuple[Position, Position], before: Position | None) -> Loss | None:
        """What a BEGIN told (the position to judge, the one to keep), sent when `seen`
        was `before` (a COMMIT that returns meanwhile, on another connection, may have
        been after this server's answer): the loss, or None once kept."""
        current, kept = told
        lost = history.judge(None, current, before)
        if lost is not None:
            return Loss(current, lost)
        self.seen = history.advance(self.seen, kept)
        return None

    def committed(self, told: tuple[Position, Position] | None) -> None:
        """What a COMMIT told, once it returned: this transaction's own id is kept."""
        if told is not None and self.seen is not None and self.seen.timeline == told[1].timeline:
            self.seen = history.advance(self.seen, told[1])

    async def recover(self, transaction: Transaction, loss: Loss) -> None:
        """As `store fence-restore` (the same function, `fence_all`), in one transaction
        with the recovery window opened: every epoch past anything the lost history
        could have issued, every lease ended; unless another replica already recovered
        on this very server, to floors at least as high as this process saw."""
        floor_seen = self._floor

        async def operation(tx: Tx) -> _Recovered:
            row = await tx.one("history_for_recovery")
            assert row is not None
            tx.now = float(row["now"])
            server = history.Server(loss.current.timeline, float(row["server_started"]))
            recorded = None
            if row["history_timeline"] is not None and row["history_server_started"] is not None:
                recorded = history.Server(
                    int(row["history_timeline"]), float(row["history_server_started"])
                )
            if history.recovered_on(recorded, server) and int(row["epoch_floor"]) >= floor_seen:
                return _Recovered(_window(row), int(row["epoch_floor"]), False)
            floor = await fence_all(tx, FAILOVER_EPOCH_ADVANCE, "failover", floor_seen)
            await tx.execute(
                "record_recovery",
                timeline=loss.current.timeline,
                server_started=server.started,
                now=tx.now,
                reason=loss.reason,
            )
            return _Recovered(RecoveryWindow(tx.now, loss.reason), floor, True)

        recovered: _Recovered = await transaction(operation)
        self.recovery = recovered.window
        self._floor = recovered.floor
        # Kept again from the next transaction's (flushed, crash-safe) positions.
        self.seen = Position(loss.current.timeline, 0)
        if recovered.by_this_process:
            log.warning(
                "the store lost history (%s): every epoch was raised to %d, every lease "
                "ended, and the recovery window opened",
                loss.reason,
                recovered.floor,
            )


def _window(row: Row) -> RecoveryWindow | None:
    opened = row["recovery_opened_at"]
    return None if opened is None else RecoveryWindow(float(opened), str(row["recovery_reason"]))
