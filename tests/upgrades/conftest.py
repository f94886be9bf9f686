"""The replicas' processes and a fresh PostgreSQL database per test, as in
tests/integration/replicas (request `pg_url` before `fleet`)."""

from tests import pg
from tests.integration.replicas.conftest import fleet

pg_url = pg.database_fixture()

__all__ = ["fleet", "pg_url"]
