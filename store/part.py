"""What every part of the Store shares: its connector, the instance it speaks for, the
refusal record, and who is told how leases end. The Store (store/manager.py) is
composed of one part per job, each in its own module."""

from __future__ import annotations

from store.base import Connector
from store.history import RecoveryWindow, Replication
from store.refusals import RefusalRecord
from store.types import LeaseObserver


class StorePart:
    def __init__(self, connector: Connector, instance_id: str) -> None:
        self.connector = connector
        self.instance_id = instance_id
        connector.instance_id = instance_id
        # Every refusal is counted there and written by flush_refusal_counts.
        self.refusals = RefusalRecord(connector, instance_id)
        self.lease_observer: LeaseObserver | None = None

    def _observe(self, resource: str, how: str, turn_s: float | None = None) -> None:
        if self.lease_observer is not None:
            self.lease_observer(resource, how, turn_s)

    @property
    def recovery(self) -> RecoveryWindow | None:
        """The recovery window after lost history (store/history.py), as last read: on
        every new connection to the store, and by `refresh_recovery`."""
        return self.connector.recovery

    @property
    def replication(self) -> Replication | None:
        """What the PostgreSQL primary said of its standbys when last asked (None on
        SQLite): on every new connection, and by `refresh_recovery`."""
        return self.connector.replication
