"""Domain operations on the authority's records: the `Store`.

Each public method is one transaction: load records with named queries, ask a
pure decision in `core.fencing` or a step of `core.lifecycle`'s table, write what
it decided, checking that every guarded update changed the row it was decided on.
Nothing here knows which database answers.

The Store is composed of one part per job, each a module of its own (a mixin of
`StorePart`, which holds what they share): a caller sees one object and the
method names it always had, and a reader of one job opens one file of it.
"""

from __future__ import annotations

import logging

from store.base import StoreError
from store.effects import Effects
from store.housekeeping import Housekeeping
from store.instances import Instances
from store.leases import Leases
from store.reconciliation import Reconciliation
from store.schema import open_current

log = logging.getLogger(__name__)


class Store(Leases, Effects, Reconciliation, Housekeeping, Instances):
    """Leases (store/leases.py), admission and receipts (store/effects.py), effects in
    doubt (store/reconciliation.py), the refusal tally, retention and fence-restore
    (store/housekeeping.py), the store's identity and the replicas
    (store/instances.py)."""

    async def open(self) -> None:
        """Open the store at the current schema (created or migrated now if need be).
        A PostgreSQL server it must never write to (a standby, a read-only database, a
        transaction pooler with the statement cache on) is refused, once, by its
        connector's open: before `serve` says it started."""
        await open_current(self.connector)

    async def close(self) -> None:
        try:
            await self.flush_refusal_counts()
        except StoreError:
            log.warning("refusals counted since the last write are lost: the store failed")
        await self.connector.close()
