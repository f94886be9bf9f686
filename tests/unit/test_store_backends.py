"""One registry of store backends: every scheme a policy accepts opens a connector,
and both backends' SQL files name the same queries."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies import ConfigError, parse_policy
from policies.store_backends import BACKEND_BY_SCHEME, StoreBackend
from store import CONNECTORS, StoreError, open_store
from store.postgres import PostgresConnector
from store.queries import load_queries
from store.sqlite import SQLiteConnector

POLICY = """\
version: 1
store: {store}
upstreams:
  supplier: {{url: "http://127.0.0.1:9001"}}
routes:
  - name: put-x
    upstream: supplier
    match: {{methods: [PUT], path: "/x/{{id}}"}}
    resource: "x:{{id}}"
"""
CONNECTOR_CLASS = {StoreBackend.SQLITE: SQLiteConnector, StoreBackend.POSTGRESQL: PostgresConnector}


def store_url(scheme: str, backend: StoreBackend, tmp_path: Path) -> str:
    if backend is StoreBackend.SQLITE:
        return f"{scheme}:///{tmp_path / 'fence.db'}"
    return f"{scheme}://fence@127.0.0.1:5432/fence"


def test_every_backend_has_a_connector_and_a_scheme() -> None:
    assert set(CONNECTORS) == set(StoreBackend)
    assert set(BACKEND_BY_SCHEME.values()) == set(StoreBackend)


@pytest.mark.parametrize(("scheme", "backend"), BACKEND_BY_SCHEME.items())
def test_a_scheme_the_policy_accepts_opens_its_backend(
    scheme: str, backend: StoreBackend, tmp_path: Path
) -> None:
    url = store_url(scheme, backend, tmp_path)
    assert parse_policy(POLICY.format(store=url)).store == url
    store = open_store(url, lambda: 0.0, "test-instance")
    assert type(store.connector) is CONNECTOR_CLASS[backend]


def test_a_scheme_the_policy_refuses_opens_no_store() -> None:
    url = "mysql://fence@127.0.0.1/fence"
    with pytest.raises(ConfigError, match="expected sqlite"):
        parse_policy(POLICY.format(store=url))
    with pytest.raises(StoreError, match="no store backend for 'mysql'"):
        open_store(url, lambda: 0.0, "test-instance")


def test_both_backends_sql_files_define_the_same_queries() -> None:
    assert sorted(load_queries("sqlite.sql")) == sorted(load_queries("postgres.sql"))
