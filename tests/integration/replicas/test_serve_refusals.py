"""`fenceproxy serve` on a store it must never write to says so before its banner and
exits non-zero: a hot standby (a real one, tests/pgstandby.py), a database
with default_transaction_read_only, a transaction pooler with the statement cache on.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import yaml

from support.processes import free_port
from tests import pg
from tests.integration.replicas.conftest import PROJECT_ROOT, proxy_config
from tests.pgbouncer import Bouncer
from tests.pgstandby import StandbyPair

pytestmark = pytest.mark.timeout(90)

SERVE_TIMEOUT_S = 30.0


def serve(tmp_path: Path, store_url: str, **store_pool: Any) -> subprocess.CompletedProcess[str]:
    """`serve` on `store_url`, which must exit on its own (else the test fails)."""
    config = proxy_config(free_port(), "http://127.0.0.1:9", store_url)
    config["store_pool"] = {"min_size": 1, "max_size": 2, **store_pool}
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", "--config", str(path)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=SERVE_TIMEOUT_S,
        check=False,
    )


def assert_refused_before_the_banner(run: subprocess.CompletedProcess[str], says: str) -> None:
    assert run.returncode != 0, run
    assert says in run.stderr, run.stderr
    assert "fenceproxy on http" not in run.stdout, run.stdout


def test_serve_on_a_hot_standby_says_this_is_a_standby(tmp_path: Path) -> None:
    with StandbyPair() as pair:
        run = serve(tmp_path, pair.standby_url)
    assert_refused_before_the_banner(run, "this is a standby")
    assert "CREATE TABLE" not in run.stderr


async def test_serve_on_a_read_only_database_says_read_only(pg_url: str, tmp_path: Path) -> None:
    conn = await asyncpg.connect(pg.require_admin_url())
    try:
        name = pg.database_name(pg_url)
        await conn.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    finally:
        await conn.close()
    run = serve(tmp_path, pg_url)
    assert_refused_before_the_banner(run, "is read-only")


def test_serve_through_a_transaction_pooler_with_the_cache_on_names_the_option(
    pg_url: str, tmp_path: Path
) -> None:
    with Bouncer("transaction") as bouncer:
        run = serve(tmp_path, bouncer.url(pg_url))
    assert_refused_before_the_banner(run, "set store_pool.statement_cache: false")


def test_serve_on_a_database_that_does_not_exist_says_so_before_the_banner(
    tmp_path: Path,
) -> None:
    missing = urlsplit(pg.require_admin_url())._replace(path="/fenceproxy_never_created")
    run = serve(tmp_path, urlunsplit(missing))
    assert_refused_before_the_banner(run, 'database "fenceproxy_never_created" does not exist')


def test_serve_on_a_server_that_does_not_answer_says_so_before_the_banner(
    tmp_path: Path,
) -> None:
    run = serve(tmp_path, f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")
    assert_refused_before_the_banner(run, "cannot open the PostgreSQL store")
