"""What a newcomer meets first, run as a user runs it: ports to choose and a
busy one refused in one line (`make run`, `serve`), `store migrate` saying what it
did, `check-config` naming a missing key, a refused probe, and a SQLite backup taken
while the proxy runs, restored and fenced.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from demo.run_example import EXAMPLE_STORE
from demo.upstream import demo_upstream_argv
from proxy import cli as proxy_cli
from proxy import cli_serve
from store.queries import load_migrations
from support.processes import ManagedProcess, free_port
from tests.acceptance.test_cli import EXAMPLE, RESOURCE, Cli

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 20.0
ADMIN_TOKEN = "newcomer-admin-token-0123456789abcdef"
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@contextmanager
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 that something is listening on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def example_on_store(store_url: str) -> str:
    """The example policy's text with its store replaced (it must be there to replace)."""
    text = EXAMPLE.read_text(encoding="utf-8")
    assert text.count(EXAMPLE_STORE) == 1
    return text.replace(EXAMPLE_STORE, store_url)


def configured(tmp_path: Path, upstream_port: int | None = None) -> Path:
    """The example policy on a store under tmp_path (and the upstream on that port)."""
    text = example_on_store(f"sqlite:///{tmp_path / 's.db'}")
    if upstream_port is not None:
        text = text.replace("http://127.0.0.1:9001", f"http://127.0.0.1:{upstream_port}")
    path = tmp_path / "fenceproxy.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def call(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    """(status, JSON body) of one HTTP call."""
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with _direct.open(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, json.loads(refused.read())


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def leases_in(database: Path) -> int:
    """The leases recorded in a SQLite file read alone (0 if it has no schema yet)."""
    with closing(sqlite3.connect(database)) as conn:
        try:
            count: int = conn.execute("SELECT count(*) FROM leases").fetchone()[0]
        except sqlite3.OperationalError:
            return 0
    return count


# --- ports ------------------------------------------------------------------------------


@pytest.mark.parametrize("busy", ["PORT", "UPSTREAM_PORT"])
def test_make_run_on_a_busy_port_says_which_and_how_to_choose_another(busy: str) -> None:
    with busy_port() as taken:
        ports = {"PORT": str(free_port()), "UPSTREAM_PORT": str(free_port()), busy: str(taken)}
        # One of them from the environment, as docs/tutorials/index.md allows.
        # As from a user's shell, not from within `make test`.
        environment = {
            key: value
            for key, value in os.environ.items()
            if key not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")
        }
        environment["PORT"] = ports["PORT"]
        upstream_option = f"UPSTREAM_PORT={ports['UPSTREAM_PORT']}"
        venv = f"VENV={sys.prefix}"
        done = subprocess.run(
            # The virtualenv running these tests, wherever it is: never a build of one.
            ["make", "--no-print-directory", "-C", str(ROOT), "run", upstream_option, venv],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode != 0
    assert done.stdout == ""
    first, *rest = done.stderr.strip().splitlines()
    assert first == (
        f"make run: port {taken} is in use; choose another: make run {busy}=N "
        "(or set the environment variable)"
    )
    assert "Traceback" not in done.stderr
    assert all(line.startswith("make: ***") for line in rest), done.stderr


def test_serve_on_a_busy_port_is_one_line_naming_it(cli: Cli, tmp_path: Path) -> None:
    config = configured(tmp_path)
    with busy_port() as taken:
        result = cli("serve", "--config", str(config), "--port", str(taken))
    assert result.code == 1
    assert result.out == ""
    assert result.one_line_error() == (
        f"fenceproxy: cannot listen on 127.0.0.1:{taken}: it is in use; "
        "choose another with --port N (or listen.port)"
    )
    assert not (tmp_path / "s.db").exists(), "nothing may start before the port is known"


def test_serve_host_and_port_override_the_file(tmp_path: Path) -> None:
    config = configured(tmp_path)
    port = free_port()
    argv = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    with ManagedProcess("fenceproxy", argv, log_path=tmp_path / "serve.log", cwd=tmp_path) as proxy:
        proxy.wait_http_ok(f"http://127.0.0.1:{port}/_fence/healthz", STARTUP_TIMEOUT_S)
        assert f"fenceproxy on http://127.0.0.1:{port} " in proxy.log_tail()
        # The instance's name follows the port it serves (two replicas, one file).
        assert any(tmp_path.glob(f"fenceproxy-instance-*{port}*.json"))


def test_a_bad_port_option_is_refused_by_the_parser(cli: Cli, tmp_path: Path) -> None:
    result = cli("serve", "--config", str(configured(tmp_path)), "--port", "70000")
    assert result.code == 2
    assert "--port: must be 1-65535: '70000'" in result.err


# --- store migrate --------------------------------------------------------------------------


def test_store_migrate_says_whether_it_created_applied_or_found_it_up_to_date(
    cli: Cli, tmp_path: Path
) -> None:
    config = configured(tmp_path)
    migrations = load_migrations("sqlite")
    latest = migrations[-1][0]

    created = cli("store", "migrate", "--config", str(config))
    again = cli("store", "migrate", "--config", str(config))

    assert created.code == 0, created.err
    assert f"created schema version {latest}" in created.out
    assert again.code == 0, again.err
    assert f"up to date (schema version {latest})" in again.out

    # A store created by an older release: all but the last two migrations.
    (tmp_path / "older").mkdir()
    older = configured(tmp_path / "older")
    with closing(sqlite3.connect(tmp_path / "older" / "s.db")) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        for version, name, sql in migrations[:-2]:
            conn.executescript(sql)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (version, name))
        conn.commit()
    applied = cli("store", "migrate", "--config", str(older), "--json")
    assert applied.code == 0, applied.err
    assert applied.json() == {
        "store": f"sqlite:///{tmp_path / 'older' / 's.db'}",
        "version": latest,
        "applied": [version for version, _, _ in migrations[-2:]],
        "created": False,
    }


# --- check-config and probes -------------------------------------------------------------


def test_check_config_names_a_missing_upstreams_section(cli: Cli, tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    start = text.index("upstreams:\n")
    without = text[:start] + text[text.index("routes:\n") :]
    bad = tmp_path / "bad.yaml"
    bad.write_text(without, encoding="utf-8")
    result = cli("check-config", str(bad))
    assert result.code == 1
    assert f"{bad}:2: upstreams: missing required key 'upstreams'" in result.err


# --- backup and restore -------------------------------------------------------------------


def test_a_backup_taken_while_serving_restores_with_fence_restore(cli: Cli, tmp_path: Path) -> None:
    """Backup while the proxy runs (what is still in the -wal included), writes after
    the backup, the file restored, fence-restore: every token from before is refused,
    and every epoch issued from then on is above anything issued before."""
    upstream_port, port = free_port(), free_port()
    config = configured(tmp_path, upstream_port)
    env = {**os.environ, "FENCEPROXY_ADMIN_TOKEN": ADMIN_TOKEN}
    proxy_url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)]
    serve += ["--port", str(port)]

    def order(sku: str, token: str, key: str) -> Any:
        return call(
            "POST",
            f"{proxy_url}/orders/{sku}",
            {"qty": 1},
            {"Fence-Token": token, "Idempotency-Key": key},
        )

    def acquire(resource: str) -> Any:
        status, lease = call(
            "POST",
            f"{proxy_url}/_fence/v1/leases",
            {"resource": resource, "holder": "worker-a", "ttl_s": 30},
        )
        assert status == 201, lease
        return lease

    backup = tmp_path / "backup.db"
    with ManagedProcess(
        "demo upstream",
        demo_upstream_argv(upstream_port, tmp_path / "upstream.db"),
        log_path=tmp_path / "upstream.log",
    ) as upstream:
        upstream.wait_http_ok(f"http://127.0.0.1:{upstream_port}/_demo/healthz")
        with ManagedProcess("fenceproxy", serve, log_path=tmp_path / "a.log", env=env) as proxy:
            proxy.wait_http_ok(f"{proxy_url}/_fence/healthz", STARTUP_TIMEOUT_S)
            before = acquire(RESOURCE)
            assert order("widget", before["token"], "k-1")[0] == 201

            # What the proxy committed is still in the -wal: a plain copy of the
            # database file misses it, the backup does not.
            plain = tmp_path / "plain-copy.db"
            shutil.copyfile(tmp_path / "s.db", plain)
            assert leases_in(plain) == 0
            taken = cli("store", "backup", str(backup), "--config", str(config))
            assert taken.code == 0, taken.err

            # After the backup: the lease released, two more lives of the resource.
            released = call(
                "POST",
                f"{proxy_url}/_fence/v1/leases/release",
                {},
                {"Fence-Token": before["token"]},
            )
            assert released[0] == 200, released
            later = acquire(RESOURCE)
            assert order("widget", later["token"], "k-2")[0] == 201
            issued = later["epoch"]
            assert issued >= 2
        with closing(sqlite3.connect(backup)) as copy:
            assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert leases_in(backup) == 1
        assert not backup.with_name("backup.db-wal").exists()

        # The restore, as docs/how-to/backup-restore.md says.
        for stale in (tmp_path / "s.db-wal", tmp_path / "s.db-shm"):
            stale.unlink(missing_ok=True)
        shutil.copyfile(backup, tmp_path / "s.db")
        fenced = cli("store", "fence-restore", "--yes", "--advance", "100", "--config", str(config))
        assert fenced.code == 0, fenced.err
        floor = 1 + 100  # the highest epoch in the backup, advanced
        never_leased = cli("leases", "show", "rule:r9", "--json", "--config", str(config)).json()
        assert (never_leased["epoch"], never_leased["next_epoch"]) == (0, floor + 1)

        with ManagedProcess("fenceproxy", serve, log_path=tmp_path / "b.log", env=env) as proxy:
            proxy.wait_http_ok(f"{proxy_url}/_fence/healthz", STARTUP_TIMEOUT_S)
            status, refused = order("widget", before["token"], "k-3")
            assert (status, refused["code"]) == (409, "stale_epoch"), refused
            status, refused = order("widget", later["token"], "k-4")  # unknown to the backup
            assert (status, refused["code"]) == (403, "invalid_token"), refused
            again = acquire(RESOURCE)
            assert again["epoch"] == floor + 1 > issued
            assert acquire("rule:r9")["epoch"] == floor + 1
        _, effects = call("GET", f"http://127.0.0.1:{upstream_port}/_demo/effects")
        assert effects["orders"] == 2, "a refused token reached the upstream"


def test_store_backup_of_postgresql_points_to_pg_dump(cli: Cli, tmp_path: Path) -> None:
    text = example_on_store("postgresql://nobody@127.0.0.1:1/none")
    config = tmp_path / "pg.yaml"
    config.write_text(text, encoding="utf-8")
    result = cli("store", "backup", str(tmp_path / "b.db"), "--config", str(config))
    assert result.code == 1
    assert "pg_dump" in result.one_line_error()


def test_store_backup_never_overwrites(cli: Cli, tmp_path: Path) -> None:
    config = configured(tmp_path)
    assert cli("store", "migrate", "--config", str(config)).code == 0
    existing = tmp_path / "existing.db"
    existing.write_bytes(b"keep me")
    result = cli("store", "backup", str(existing), "--config", str(config))
    assert result.code == 1
    assert "exists" in result.one_line_error()
    assert existing.read_bytes() == b"keep me"


def test_serve_losing_the_port_after_the_check_is_still_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The port is taken between the check and the bind (another process was quicker):
    the bind's own error, in one line. The race is made certain by skipping the check."""
    config = configured(tmp_path)
    monkeypatch.setattr(cli_serve, "_check_free", lambda host, port, how_to_change: None)
    with busy_port() as taken, pytest.raises(SystemExit) as exited:
        proxy_cli.main(
            [
                *("serve", "--config", str(config), "--port", str(taken)),
                *("--state-dir", str(tmp_path / "state")),
            ]
        )
    assert exited.value.code == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("fenceproxy: error while attempting to bind on address ")
    assert f"{taken}): address already in use; choose another with --port N" in error
