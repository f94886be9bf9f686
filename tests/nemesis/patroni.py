"""A PostgreSQL cluster run as users run one: two nodes managed by Patroni, with etcd as
its consensus store, for the nemesis and the tests that fail a store over for real.

`PatroniCluster(synchronous=...)` is a context manager. On enter it starts one etcd
(Debian's `etcd-server`, 3.4: Patroni speaks its v3 API through etcd's gRPC gateway,
the `etcd3:` section) on free 127.0.0.1 ports with a data directory of its own, then
two Patroni nodes (Debian's `patroni` package: it runs on the system's Python, which
the `postgres` user can run, unlike a virtualenv under /root), each with a PostgreSQL
on a free port, and waits until one leads and the other streams from it. As root,
Patroni runs as `postgres` (`runuser`), since PostgreSQL refuses root. On exit it stops
the nodes, anything they left running, and etcd, and removes the directory.

`url` names both nodes with `target_session_attrs=read-write` (libpq's rule, which
asyncpg follows): a client connects to whichever node takes writes now. The faults:
`kill_leader_postgres` (SIGKILL of the leader's postmaster: Patroni restarts it, or the
other node takes over), `kill_leader_patroni` (SIGKILL of the leader's Patroni: its
PostgreSQL runs on, leaderless, until Patroni is started again and demotes it if the
other node took over meanwhile; `restart_patroni` does that) and `switchover` (through
Patroni's REST API, as `patronictl switchover` does).

With `synchronous=True`, Patroni's `synchronous_mode` is on: a commit waits for the
standby, and only a synchronous standby is promoted.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from support.processes import ManagedProcess, free_port
from tests.needs import missing
from tests.pgstandby import require_postgres_bin

ETCD = Path("/usr/bin/etcd")
PATRONI = Path("/usr/bin/patroni")
START_TIMEOUT_S = 90.0
LEADER_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 3.0
POLL_S = 0.2
# Patroni's timing, short for tests: a leader that stops renewing its key is replaced
# after `TTL_S`; loop_wait + 2 * retry_timeout must stay under it.
TTL_S = 10
LOOP_WAIT_S = 1
RETRY_TIMEOUT_S = 3

_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def require_patroni() -> None:
    for binary, package in ((ETCD, "etcd-server"), (PATRONI, "patroni")):
        if not binary.exists():
            missing(f"{binary} is not installed (Debian's {package} package; .ci/run installs it)")
    require_postgres_bin()


def _http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with _direct.open(request, timeout=HTTP_TIMEOUT_S) as response:
            raw = response.read()
            status: int = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", errors="replace")


def _accepts(port: int) -> bool:
    """Whether a PostgreSQL listens on `port`: Patroni's view lags a crash by a loop."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT_S):
            return True
    except OSError:
        return False


class Node:
    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.pg_port = free_port()
        self.rest_port = free_port()
        self.data_dir = directory / name
        self.config_path = directory / f"{name}.yml"
        self.process: ManagedProcess | None = None
        self.starts = 0

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def postmaster_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first) if first.strip().isdigit() else None


class PatroniCluster:
    def __init__(self, *, synchronous: bool = False, nodes: int = 2) -> None:
        self.synchronous = synchronous
        self.scope = f"fenceproxy-{secrets.token_hex(4)}"
        self._count = nodes
        self._dir: Path | None = None
        self.nodes: list[Node] = []
        self.etcd: ManagedProcess | None = None
        self.etcd_port = 0
        self._stack = contextlib.ExitStack()

    @property
    def directory(self) -> Path:
        assert self._dir is not None
        return self._dir

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{node.pg_port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    def __enter__(self) -> PatroniCluster:
        require_patroni()
        self._dir = Path(tempfile.mkdtemp(prefix="fenceproxy-patroni-"))
        try:
            if os.geteuid() == 0:
                shutil.chown(self._dir, "postgres")
            self._start_etcd()
            self.nodes = [Node(f"pg{number}", self._dir) for number in range(self._count)]
            for node in self.nodes:
                self._write_config(node)
                self.start_patroni(node)
            self.wait_healthy(START_TIMEOUT_S)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop()

    # -- processes ---------------------------------------------------------------------

    def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{peer}"
        argv = [
            str(ETCD), "--name", "etcd0", "--data-dir", str(self.directory / "etcd"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"etcd0={peer_url}", "--initial-cluster-state", "new",
            "--initial-cluster-token", self.scope,
        ]  # fmt: skip
        self.etcd = self._stack.enter_context(
            ManagedProcess("etcd", argv, log_path=self.directory / "etcd.log")
        )
        self.etcd.wait_http_ok(f"{client_url}/health", START_TIMEOUT_S)

    def _write_config(self, node: Node) -> None:
        hba = [
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "host replication all 127.0.0.1/32 trust",
        ]
        config = {
            "scope": self.scope,
            "namespace": "/fenceproxy-tests/",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{node.rest_port}",
                "connect_address": f"127.0.0.1:{node.rest_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_S,
                    "loop_wait": LOOP_WAIT_S,
                    "retry_timeout": RETRY_TIMEOUT_S,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": self.synchronous,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "parameters": {
                            "wal_log_hints": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "fsync": "off",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": hba,
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data_dir),
                "bin_dir": str(require_postgres_bin()),
                "pgpass": str(self.directory / f"{node.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.directory)},
                "pg_hba": hba,
            },
        }
        node.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def start_patroni(self, node: Node) -> None:
        argv = [str(PATRONI), str(node.config_path)]
        if os.geteuid() == 0:
            # setpriv execs Patroni in place (runuser would fork it): the process this
            # starts is Patroni itself, so a SIGKILL reaches Patroni, not a wrapper.
            argv = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *argv]
        node.starts += 1
        log = self.directory / f"{node.name}-patroni-{node.starts}.log"
        env = {**os.environ, "HOME": str(self.directory)}
        node.process = ManagedProcess(
            node.name, argv, log_path=log, env=env, start_new_session=True
        )

    def _stop(self) -> None:
        for node in self.nodes:
            if node.process is not None:
                node.process.terminate(grace_s=15.0)
        # Whatever a killed Patroni left behind: its PostgreSQL, stopped hard.
        for node in self.nodes:
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        self._stack.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- state -------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (GET /cluster), from any node that answers."""
        for node in self.nodes:
            try:
                status, body = _http("GET", f"{node.rest_url}/cluster")
            except OSError:
                continue
            if status == 200 and isinstance(body, dict):
                members: list[dict[str, Any]] = body.get("members", [])
                return members
        return []

    def leader(self) -> Node | None:
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                return next((n for n in self.nodes if n.name == member.get("name")), None)
        return None

    def wait_healthy(self, timeout_s: float = LEADER_TIMEOUT_S) -> Node:
        """Until one node leads and every other streams from it (synchronously, in
        synchronous mode); the leader."""
        deadline = time.monotonic() + timeout_s
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process is not None and not node.process.is_running():
                    raise node.process.failure("Patroni exited")
            last = self.members()
            leader = self.leader()
            followers = [m for m in last if m.get("role") != "leader"]
            wanted = "sync_standby" if self.synchronous else None
            if (
                leader is not None
                and _accepts(leader.pg_port)
                and len(last) == len(self.nodes)
                and all(m.get("state") in ("streaming", "running") for m in followers)
                and all(wanted is None or m.get("role") == wanted for m in followers)
            ):
                return leader
            time.sleep(POLL_S)
        raise TimeoutError(f"the Patroni cluster is not healthy after {timeout_s:g} s: {last}")

    # -- faults ------------------------------------------------------------------------

    def kill_leader_postgres(self) -> str:
        leader = self.wait_healthy()
        pid = leader.postmaster_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        return f"SIGKILL to {leader.name}'s postmaster (pid {pid})"

    def kill_leader_patroni(self, unmanaged_s: float = 0.0) -> str:
        """SIGKILL the leader's Patroni, wait until the other node leads (its PostgreSQL
        is still running meanwhile, as a primary nobody manages), `unmanaged_s` more
        (two primaries: as long as a crashed Patroni takes to be restarted), then start
        Patroni on the old leader again, which demotes its PostgreSQL."""
        leader = self.wait_healthy()
        assert leader.process is not None
        leader.process.kill()
        deadline = time.monotonic() + LEADER_TIMEOUT_S
        while time.monotonic() < deadline:
            now = self.leader()
            if now is not None and now is not leader:
                break
            time.sleep(POLL_S)
        time.sleep(unmanaged_s)
        self.start_patroni(leader)
        return (
            f"SIGKILL to {leader.name}'s Patroni; its PostgreSQL ran on until it came back, "
            f"{unmanaged_s:.1f} s after another node led"
        )

    def switchover(self) -> str:
        leader = self.wait_healthy()
        candidate = next(node for node in self.nodes if node is not leader)
        status, body = _http(
            "POST",
            f"{leader.rest_url}/switchover",
            {"leader": leader.name, "candidate": candidate.name},
        )
        if status != 200:
            raise RuntimeError(f"switchover refused: {status} {body}")
        return f"switchover {leader.name} -> {candidate.name}"
