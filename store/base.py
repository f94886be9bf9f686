"""The narrow interface between the domain operations and a database backend."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from store.history import RecoveryWindow, Replication

T = TypeVar("T")
Row = dict[str, Any]
# One row's values in the order of its block's columns, for a read on the request path
# (building a dict per row and records from it by name is measurable there): the
# reader names the columns (store/reads.py ADMISSION_COLUMNS).
Values = tuple[Any, ...]


class StoreError(Exception):
    """The store could not do what was asked; nothing was changed or acknowledged."""


class ReleaseRefused(StoreError):
    """This release must not run on this store beside what is there: the schema's floor,
    a running replica, or a contraction an older replica still needs (core/releases.py)."""


class StoreUnavailable(StoreError):
    """The database did not answer or refused a write (I/O error, lock timeout, gone)."""


class CommitUnknown(StoreUnavailable):
    """A write's COMMIT was sent and no answer came back (the connection broke, the
    command timed out): the transaction may have committed or not. Only the store can
    tell, asked again once whatever held the transaction's locks has let them go."""


class AdmissionInDoubt(CommitUnknown):
    """An admission whose COMMIT's answer was lost: effect `effect_id` on `resource` may
    be recorded DISPATCHING, although nothing was sent. `Store.settle_unsent` finds out,
    and settles it NOT_SENT if it was."""

    def __init__(self, message: str, effect_id: str, resource: str) -> None:
        super().__init__(message)
        self.effect_id = effect_id
        self.resource = resource


# A write's outcome, told when its caller stopped waiting once it was taken into a
# batch (`Connector.write`): ok, and its result or its error.
Left = Callable[[bool, Any], None]


class Tx(Protocol):
    """One transaction; every statement is a named query of the backend's SQL file."""

    now: float

    async def one(self, query: str, **params: Any) -> Row | None: ...

    async def values(self, query: str, **params: Any) -> Values | None:
        """The first row's values, in the order of the block's columns; None: no row."""
        ...

    async def all(self, query: str, **params: Any) -> list[Row]: ...

    async def execute(self, query: str, **params: Any) -> int: ...


Operation = Callable[[Tx], Coroutine[Any, Any, T]]


class SchemaTx(Tx, Protocol):
    """The transaction that creates or migrates the schema (store/schema.py): its named
    queries, and the schema's own files run whole."""

    async def script(self, sql: str) -> None:
        """Run a schema file or a migration, its statements in order."""
        ...


SchemaOperation = Callable[[SchemaTx], Coroutine[Any, Any, T]]


class Connector(Protocol):
    # The recovery window after lost history, as last read (store/history.py).
    recovery: RecoveryWindow | None
    # What a PostgreSQL primary said of its standbys, as last read (None on SQLite).
    replication: Replication | None
    # The instance this connector speaks for: its own row in `replicas` is no peer.
    instance_id: str | None

    # The schema files' and the migrations' folder name: "postgresql" or "sqlite".
    backend: str

    @property
    def writes_queued(self) -> int:
        """How many writes wait for a write lane now (store/operation_queue.py): the
        group commit's backlog, 0 while the store is closed."""
        ...

    async def open(self) -> None:
        """Connect; nothing of the schema is read yet (there may be none)."""
        ...

    async def change_schema(self, operation: SchemaOperation[T]) -> T:
        """Run `operation` in a write transaction before the store serves: no store id
        or history is checked (there may be no schema yet) and no statement timeout
        bounds it (a migration may rewrite whole tables)."""
        ...

    async def ready(self) -> None:
        """The schema is current: learn what this store is (its id, its history) before
        the first operation."""
        ...

    async def close(self) -> None: ...

    async def write(
        self,
        operation: Operation[T],
        own_clock: bool = False,
        resource: str | None = None,
        left: Left | None = None,
    ) -> T:
        """Run `operation` in a write transaction; return only after it is durable.
        `own_clock`: the operation's first statement answers the time (`now`, which
        the operation sets as tx.now if not NULL) and the store id (`store_id`, checked
        by the connector), so the connector need not ask for them first. `resource`:
        the resource whose row lock the operation takes first, if the caller knows it
        (store/operation_queue.py: a batch takes its writes' locks in resource order).
        `left`: told the operation's outcome (ok, and its result or error) if the caller
        stops waiting (is cancelled) once the operation was taken into a batch: it then
        runs, or may have run, with the others."""
        ...

    async def statement(self, query: str, **params: Any) -> Values | None:
        """One named block as a write transaction of its own, durable on return; its
        row's values, in the order of the block's columns (the receipt's: store/steps.py
        RECEIPT_COLUMNS), whose `store_id` is checked by the connector, which passes its
        own as the `store_id` parameter, and whose `resource` parameter, if any, is the
        resource it locks (as `write`'s). None when this backend's block is empty: the
        caller then does the same step by step in a write transaction."""
        ...

    async def read(self, operation: Operation[T]) -> T: ...
