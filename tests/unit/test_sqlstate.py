"""What each PostgreSQL or pooler error means to the proxy (store/sqlstate.py): the
server's refusals are "unavailable" (503 store_unavailable), conflicts are retried,
and only a statement the server rejects for what it says is a bug (500)."""

from __future__ import annotations

import asyncpg
import pytest

from store import sqlstate


def server_error(state: str, message: str = "refused") -> asyncpg.PostgresError:
    error = asyncpg.PostgresError.new({"C": state, "M": message, "S": "ERROR"})
    assert error.sqlstate == state
    return error


@pytest.mark.parametrize(
    "state",
    [
        "08P01",  # pgbouncer: query_wait_timeout, max_client_conn; a mismatched Bind
        "08006",  # connection failure
        "53300",  # too many connections
        "53100",  # disk full
        "57014",  # statement_timeout
        "57P01",  # admin shutdown
        "57P03",  # the server is starting
        "58030",  # I/O error
        "25006",  # read-only transaction: a standby, default_transaction_read_only
        "25P03",  # idle in transaction timeout
        "55P03",  # lock_timeout
        "26000",  # prepared statement missing (a transaction pooler)
        "42P05",  # prepared statement already there (a transaction pooler)
    ],
)
def test_the_servers_refusals_are_unavailable(state: str) -> None:
    error = server_error(state)
    assert sqlstate.unavailable(error)
    assert not sqlstate.should_retry(error)


@pytest.mark.parametrize("state", ["42601", "23505", "22P02", "42703", "0A000"])
def test_a_rejected_statement_is_a_bug_not_an_outage(state: str) -> None:
    assert not sqlstate.unavailable(server_error(state))


@pytest.mark.parametrize("state", ["40001", "40P01"])
def test_conflicts_are_retried(state: str) -> None:
    assert sqlstate.should_retry(server_error(state))


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError(),
        ConnectionResetError(),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.InternalClientError("cannot switch to state 15"),
    ],
)
def test_a_lost_connection_is_unavailable(error: BaseException) -> None:
    assert sqlstate.unavailable(error)


def test_read_only_says_standby_or_read_only() -> None:
    described = sqlstate.describe(
        server_error("25006", "cannot execute INSERT in a read-only transaction")
    )
    assert "read-only" in described and "hot standby" in described


def test_a_timeout_says_in_time() -> None:
    assert "did not answer in time" in sqlstate.describe(TimeoutError())
