"""What an error from PostgreSQL (or a pooler in front of it) means to the proxy,
decided in this one place at the backend's boundary (as procrastinate maps SQLSTATEs).

Three answers: try the transaction again (a serialization failure or a deadlock:
nothing happened); the store is unavailable (the server or the pooler refused or did
not answer: 503 `store_unavailable`, try again later); or a bug (a statement the
server rejects for what it says, not for its state: `StoreError`, a 500).

"Unavailable" is every refusal that says something about the server's state rather
than the statement (the SQLSTATE classes of PostgreSQL's Appendix A):

- class 08, connection exception: the connection broke, or a pooler refused (pgbouncer
  sends 08P01 for `query_wait_timeout`, `no more connections allowed`, a server
  connection gone, and a statement bound on the wrong server connection);
- class 53, insufficient resources: too many connections, disk full, out of memory;
- class 57, operator intervention: `statement_timeout` and cancels (57014), the
  server shutting down or starting (57P01-57P05);
- class 58, system error: I/O errors of the server;
- 25006, read-only transaction: a hot standby, or `default_transaction_read_only`;
- 25P03, idle in transaction timeout; 55P03, `lock_timeout`;
- 26000 and 42P05, a prepared statement missing or already there: what a
  transaction-mode pooler does to a driver's statement cache.
"""

from __future__ import annotations

import asyncpg

# Everything the driver raises when the connection, not the statement, failed: a
# connection terminated mid-statement can surface as any of these (a killed backend
# has been seen to raise InternalClientError "cannot switch to state 15"); TimeoutError
# is also a pool that had no free connection within `acquire_timeout_s`, or a
# statement over `command_timeout_s`.
CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)

# Whatever the driver raises for a failed exchange: the connection's, or the server's.
FAILURES: tuple[type[BaseException], ...] = (*CONNECTION_LOST, asyncpg.PostgresError)

UNAVAILABLE_CLASSES = frozenset({"08", "53", "57", "58"})
UNAVAILABLE_STATES = frozenset({"25006", "25P03", "55P03", "26000", "42P05"})
RETRY_STATES = frozenset({"40001", "40P01"})
READ_ONLY = "25006"


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE the server (or the pooler) answered, if it answered one."""
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else None


def should_retry(exc: BaseException) -> bool:
    """Nothing happened and the same transaction may well succeed at once."""
    return sqlstate(exc) in RETRY_STATES


def unavailable(exc: BaseException) -> bool:
    """The store did not answer or refused for its own state, not for the statement."""
    if isinstance(exc, CONNECTION_LOST):
        return True
    state = sqlstate(exc)
    if state is None:
        return False
    return state[:2] in UNAVAILABLE_CLASSES or state in UNAVAILABLE_STATES


def describe(exc: BaseException) -> str:
    """One line for the log and `/readyz`: what the server said, and what it means
    when the words alone would mislead."""
    state = sqlstate(exc)
    text = str(exc) or type(exc).__name__
    if state == READ_ONLY:
        return (
            f"the database is read-only ({text}): a hot standby, or "
            "default_transaction_read_only is on"
        )
    if isinstance(exc, TimeoutError):
        return f"PostgreSQL did not answer in time ({text or 'timeout'})"
    return f"{text} (SQLSTATE {state})" if state is not None else text
