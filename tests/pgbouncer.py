"""A pgbouncer process in front of the tests' PostgreSQL server, started by a test.

`Bouncer(mode, pool_size=...)` is a context manager: on enter it writes a config
(trust authentication, every database forwarded to the server of
FENCEPROXY_TEST_POSTGRES_URL), starts `pgbouncer` on a free 127.0.0.1 port and waits
until it answers; on exit it stops it. `bouncer.url(database_url)` is the URL of the
same database through the pooler.

pgbouncer refuses to run as root: as root it is started with `-u postgres`, and its
files live in a directory that user can read. `.ci/run` installs pgbouncer (apt);
without it (`PGBOUNCER` not found) the tests that need it fail, never skip, when CI
is set, and skip otherwise.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from support.processes import ManagedProcess, free_port
from tests import pg
from tests.needs import missing

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
STARTUP_TIMEOUT_S = 15.0
POLL_INTERVAL_S = 0.05

PoolMode = Literal["session", "transaction"]


def require_pgbouncer() -> str:
    """The pgbouncer executable; skips the test without it, or fails it under CI."""
    if os.access(PGBOUNCER, os.X_OK):
        return PGBOUNCER
    missing("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")


class Bouncer:
    """One pgbouncer in `mode`, with `pool_size` server connections per database and
    user, that lets a client wait `query_wait_timeout_s` for one (0: forever)."""

    def __init__(
        self,
        mode: PoolMode,
        *,
        pool_size: int = 20,
        query_wait_timeout_s: int = 120,
        max_client_conn: int = 200,
    ) -> None:
        self.mode = mode
        self.pool_size = pool_size
        self.query_wait_timeout_s = query_wait_timeout_s
        self.max_client_conn = max_client_conn
        self.port = 0
        self._dir: Path | None = None
        self._process: ManagedProcess | None = None

    def url(self, database_url: str) -> str:
        """`database_url` (on the tests' server) reached through this pooler."""
        parts = urlsplit(database_url)
        netloc = f"{parts.username or 'postgres'}@127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))

    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines) if self._process is not None else ""

    def __enter__(self) -> Bouncer:
        executable = require_pgbouncer()
        server = urlsplit(pg.require_admin_url())
        self._dir = Path(tempfile.mkdtemp(prefix="fenceproxy-pgbouncer-"))
        # Readable by the user pgbouncer switches to when started as root.
        self._dir.chmod(0o755)
        users = self._dir / "users.txt"
        users.write_text(f'"{server.username or "postgres"}" ""\n')
        self.port = free_port()
        config = self._dir / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={server.hostname or '127.0.0.1'} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            f"pool_mode = {self.mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "min_pool_size = 0\n"
            "reserve_pool_size = 0\n"
            f"max_client_conn = {self.max_client_conn}\n"
            f"query_wait_timeout = {self.query_wait_timeout_s}\n"
            # asyncpg sends these at startup; the pooler must let them through.
            "ignore_startup_parameters = extra_float_digits\n"
        )
        argv = [executable, str(config)]
        if os.geteuid() == 0:
            argv[1:1] = ["-u", "postgres"]
        self._process = ManagedProcess("pgbouncer", argv, log_path=self._dir / "pgbouncer.log")
        self._wait_listening()
        return self

    def _wait_listening(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if not self._process.is_running():
                raise self._process.failure("pgbouncer exited before it listened")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() >= deadline:
                    raise self._process.failure("pgbouncer did not listen in time") from None
            time.sleep(POLL_INTERVAL_S)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
