"""A PostgreSQL primary and its hot standby of its own, for the tests that need one.

`StandbyPair()` is a context manager: on enter it makes a primary cluster in a
temporary directory (`initdb`, trust authentication, on a free 127.0.0.1 port),
starts it, clones it with `pg_basebackup -R` (a streaming standby) and starts the
clone on another free port; on exit it stops both (`pg_ctl stop -m immediate`) and
removes the directory. About 4 s on this project's machine. `StandbyPair(standby=False)`
is the primary alone.

For the histories a store must notice (store/history.py): `both_url` names both servers
(asyncpg tries them in order: a pool reconnects to the standby while the primary is
down), `start_old_primary` brings a crashed primary back as a primary, never rewound,
and `snapshot` / `restore` put a copy of the primary's files back in place while its
clients stay connected to the address.

The clusters are plain directories, not `pg_createcluster` clusters: nothing is
registered system-wide, so a test that dies leaves nothing for the next run but a
temporary directory. PostgreSQL refuses to run as root: as root the binaries run as
the `postgres` user (`runuser`). The binaries are the newest under
/usr/lib/postgresql (Debian's layout), or on PATH; without them the tests that need
them fail under CI and skip otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from support.processes import free_port
from tests.needs import missing

COMMAND_TIMEOUT_S = 60.0


def postgres_bin() -> Path | None:
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1]
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb is not None else None


def require_postgres_bin() -> Path:
    found = postgres_bin()
    if found is not None and (found / "initdb").exists():
        return found
    missing("PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup) are not installed")


class StandbyPair:
    """A primary and its hot standby; `primary_url` and `standby_url` name database
    `postgres` on each, as user `postgres`."""

    def __init__(self, *, standby: bool = True) -> None:
        self._with_standby = standby
        self.primary_port = 0
        self.standby_port = 0
        self._dir: Path | None = None
        self._bin = Path()
        self._started: list[Path] = []

    @property
    def primary_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.primary_port}/postgres"

    @property
    def standby_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/postgres"

    @property
    def both_url(self) -> str:
        """Both servers, the primary first (asyncpg's default target_session_attrs=any:
        the first that answers, primary or not)."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary_port},"
            f"127.0.0.1:{self.standby_port}/postgres"
        )

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self._bin / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=COMMAND_TIMEOUT_S)

    def _start(self, data: Path, port: int) -> None:
        assert self._dir is not None
        options = f"-p {port} -k {self._dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(data), "-o", options, "-l", f"{data}.log", "-w", "start")
        self._started.append(data)

    def __enter__(self) -> StandbyPair:
        self._bin = require_postgres_bin()
        self._dir = Path(tempfile.mkdtemp(prefix="fenceproxy-standby-"))
        if os.geteuid() == 0:
            shutil.chown(self._dir, "postgres")
        try:
            primary, standby = self._dir / "primary", self._dir / "standby"
            self._run("initdb", "-D", str(primary), "-A", "trust", "-U", "postgres", "--no-sync")
            self.primary_port = free_port()
            self._start(primary, self.primary_port)
            if not self._with_standby:
                return self
            self._run(
                "pg_basebackup",
                "-D",
                str(standby),
                "-R",
                "-c",
                "fast",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.primary_port),
                "-U",
                "postgres",
            )
            self.standby_port = free_port()
            self._start(standby, self.standby_port)
        except BaseException:
            self._stop()
            raise
        return self

    def wait_caught_up(self) -> None:
        """Return once the standby has replayed everything the primary wrote so far."""
        target = self._psql(self.primary_port, "SELECT pg_current_wal_lsn()")
        caught_up = f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while self._psql(self.standby_port, caught_up) != "t":
            if time.monotonic() > deadline:
                raise TimeoutError("the standby did not catch up")
            time.sleep(0.05)

    def make_synchronous(self) -> None:
        """Make every commit on the primary wait for the standby (`synchronous_commit`
        is `on` by default)."""
        self.configure_primary(synchronous_standby_names="*")

    def configure_primary(self, **settings: str) -> None:
        """ALTER SYSTEM SET each setting on the primary, then reload its configuration."""
        for name, value in settings.items():
            self._psql(self.primary_port, f"ALTER SYSTEM SET {name} = '{value}'")
        self._psql(self.primary_port, "SELECT pg_reload_conf()")

    def detach_standby(self) -> None:
        """Cut the standby off its primary, as a link that lags: what the primary
        commits from now on is not on the standby when it is promoted.
        (A paused replay would not do: a promotion replays what was received.) Returns
        once the primary has no WAL sender left."""
        self._psql(self.standby_port, "ALTER SYSTEM SET primary_conninfo = ''")
        self._psql(self.standby_port, "SELECT pg_reload_conf()")
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while self._psql(self.primary_port, "SELECT count(*) FROM pg_stat_replication") != "0":
            if time.monotonic() > deadline:
                raise TimeoutError("the primary still streams to the standby")
            time.sleep(0.05)

    def _psql(self, port: int, sql: str) -> str:
        argv = [
            str(self._bin / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
            "-d", "postgres", "-Atc", sql,
        ]  # fmt: skip
        done = subprocess.run(
            argv, check=True, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
        return done.stdout.strip()

    def crash_primary(self) -> None:
        """Stop the primary hard, as a machine that dies: `-m immediate`."""
        assert self._dir is not None
        primary = self._dir / "primary"
        self._run("pg_ctl", "-D", str(primary), "-m", "immediate", "-w", "stop")
        self._started.remove(primary)

    def promote(self) -> None:
        """Promote the standby (a paused replay is left where it is: what it had not
        replayed is lost), and wait until it takes writes."""
        assert self._dir is not None
        self._run("pg_ctl", "-D", str(self._dir / "standby"), "-w", "promote")
        # pg_ctl's wait can end before a new session sees the server out of recovery.
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while self._psql(self.standby_port, "SELECT pg_is_in_recovery()") != "f":
            if time.monotonic() > deadline:
                raise TimeoutError("the standby was not promoted")
            time.sleep(0.05)

    def start_old_primary(self) -> None:
        """Start the primary stopped by `crash_primary` again, as it was: a primary on its
        old timeline, never rewound, whatever the standby became meanwhile."""
        assert self._dir is not None
        self._start(self._dir / "primary", self.primary_port)

    def stop_standby(self) -> None:
        """Stop the standby (or the primary it was promoted to) hard."""
        assert self._dir is not None
        standby = self._dir / "standby"
        self._run("pg_ctl", "-D", str(standby), "-m", "immediate", "-w", "stop")
        self._started.remove(standby)

    def snapshot(self) -> None:
        """A copy of the primary's files now, taken while it runs (pg_basebackup with its
        WAL), for `restore`."""
        assert self._dir is not None
        self._run(
            "pg_basebackup", "-D", str(self._dir / "snapshot"), "-X", "stream", "-c", "fast",
            "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
        )  # fmt: skip

    def restore(self) -> None:
        """Put the `snapshot` back in place of the primary's files, as a volume restored
        from a snapshot: the primary stops hard and starts again on the copy, at the
        same address and on the same timeline, its WAL back where the copy was taken."""
        assert self._dir is not None
        primary = self._dir / "primary"
        self.crash_primary()
        shutil.rmtree(primary)
        (self._dir / "snapshot").rename(primary)
        self._start(primary, self.primary_port)

    def _stop(self) -> None:
        for data in reversed(self._started):
            self._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        self._started = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop()
