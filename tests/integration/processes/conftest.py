"""Real processes for the fence tests: the demo upstream, fenceproxy, and worker programs.

Every test gets its own upstream and proxy process on free ports of 127.0.0.1,
each with its own SQLite files under the test's tmp_path, so the upstream's own
counts (GET /_demo/effects) start from zero. Processes are always stopped; when
a test fails, the last lines of every process's log are added to its report.

A test can shape its stack with ``@pytest.mark.fence_stack(...)`` (see
`StackOptions`): the upstream timeout, a reconcile block on place-order, the
proxy's SIGTERM grace. The proxy runs with a fixed FENCEPROXY_INSTANCE_ID, so
`Stack.restart_proxy` starts "the same" proxy again on the same port and store.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

import pytest

from demo.upstream import demo_upstream_argv
from support.processes import ManagedProcess, free_port

PROJECT_ROOT = Path(__file__).resolve().parents[3]
WORKER_SCRIPT = Path(__file__).resolve().parent / "worker.py"
ADMIN_TOKEN_ENV = "FENCEPROXY_ADMIN_TOKEN"
UPSTREAM_TIMEOUT_S = 0.5
STARTUP_TIMEOUT_S = 20.0
POLL_INTERVAL_S = 0.02
HTTP_TIMEOUT_S = 5.0

CONFIG_TEMPLATE = """\
version: 1
listen: {{host: 127.0.0.1, port: {proxy_port}}}
store: sqlite:///{store_path}
admin_token_env: {admin_token_env}
leases: {{min_ttl_s: 0.5, max_ttl_s: 60, default_ttl_s: 2}}
{limits}
{retention}
upstreams:
  supplier: {{url: "http://127.0.0.1:{upstream_port}", timeout_s: {timeout_s},
              connect_timeout_s: 0.25}}
routes:
  - name: place-order
    upstream: supplier
    match: {{methods: [POST], path: "/orders/{{sku}}"}}
    resource: "supplier:{{sku}}"
    fence: required
    forward_fence_headers: true
    max_in_flight: 1
    idempotency: {{required: true, retain_s: 3600}}
{place_order_reconcile}  - name: put-rule
    upstream: supplier
    match: {{methods: [PUT], path: "/rules/{{rule_id}}"}}
    resource: "rule:{{rule_id}}"
    fence: required
    forward_fence_headers: true
    idempotency: {{required: false, retain_s: 3600}}
  - name: read-orders
    upstream: supplier
    match: {{methods: [GET], path: "/orders/{{rest:.*}}"}}
    fence: none
  - name: read-rules
    upstream: supplier
    match: {{methods: [GET], path: "/rules/{{rest:.*}}"}}
    fence: none
"""


INSTANCE_ID_ENV = "FENCEPROXY_INSTANCE_ID"
FENCEPROXY_CLI = Path(sys.executable).with_name("fenceproxy")
CLI_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ReconcileBlock:
    """place-order's reconcile block: probe GET /orders/by-key/{idempotency_key}."""

    settle_s: float = 2.0
    attempts: int = 5
    committed: tuple[str, ...] = ("200",)
    not_committed: tuple[str, ...] = ("404",)

    def yaml(self) -> str:
        return (
            "    reconcile:\n"
            '      probe: {method: GET, path: "/orders/by-key/{idempotency_key}"}\n'
            f"      committed: {json.dumps(list(self.committed))}\n"
            f"      not_committed: {json.dumps(list(self.not_committed))}\n"
            f"      settle_s: {self.settle_s}\n"
            f"      attempts: {self.attempts}\n"
        )


@dataclass(frozen=True)
class StackOptions:
    """What ``@pytest.mark.fence_stack(**fields)`` may change; the defaults are the
    stack every test had before the marker existed."""

    upstream_timeout_s: float = UPSTREAM_TIMEOUT_S
    reconcile: ReconcileBlock | None = None
    grace_s: float | None = None  # `fenceproxy serve --grace`; None: the CLI's default
    limits: str | None = None  # the policy's `limits:` mapping (YAML); None: the defaults
    top_level: str = ""  # YAML appended to the policy (more top-level blocks)
    env: tuple[tuple[str, str], ...] = ()  # more environment for the proxy process
    retention: str | None = None  # the policy's `retention:` mapping (YAML); None: defaults


# -- a small synchronous HTTP client ---------------------------------------------------


class HttpResult(NamedTuple):
    """(status, JSON body or None, headers with lower-case names)."""

    status: int
    body: Any
    headers: dict[str, str]


def http_call(
    base_url: str,
    method: str,
    path: str,
    *,
    json_body: Any = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = HTTP_TIMEOUT_S,
) -> HttpResult:
    """One request on a fresh connection (http.client never uses an HTTP proxy)."""
    host_port = base_url.removeprefix("http://").rstrip("/")
    host, _, port = host_port.partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    sent_headers = dict(headers or {})
    payload: bytes | None = None
    if json_body is not None:
        payload = json.dumps(json_body).encode()
        sent_headers.setdefault("Content-Type", "application/json")
    try:
        connection.request(method, path, body=payload, headers=sent_headers)
        response = connection.getresponse()
        raw = response.read()
        received = {name.lower(): value for name, value in response.getheaders()}
        status = response.status
    finally:
        connection.close()
    body: Any = None
    if raw:
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", errors="replace")
    return HttpResult(status, body, received)


def wait_until(
    what: str, condition: Callable[[], bool], timeout_s: float, interval_s: float = POLL_INTERVAL_S
) -> None:
    """Poll `condition` until it holds; fail the test with `what` once time is up."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


class BackgroundCall:
    """One HTTP call on its own thread, so the test can act (kill, SIGTERM) while the call
    is in flight. The outcome is the HttpResult or the exception the call raised."""

    def __init__(self, name: str, call: Callable[[], HttpResult]) -> None:
        self.name = name
        self._outcome: HttpResult | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], HttpResult]) -> None:
        try:
            self._outcome = call()
        except BaseException as exc:  # reported through outcome(), never lost on the thread
            self._outcome = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def outcome(self, timeout_s: float) -> HttpResult | BaseException:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            pytest.fail(f"{self.name}: no outcome within {timeout_s:g} s")
        assert self._outcome is not None
        return self._outcome


def _proc_state(pid: int) -> str:
    """The scheduler state letter of a process from /proc (T: stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0]


# -- worker programs as real OS processes ---------------------------------------------------


class WorkerProcess:
    """tests/integration/processes/worker.py as a child process driven over stdin/stdout.

    Its JSON lines are read by a thread into a queue, so every wait has a deadline.
    Stderr goes to a log file shown when the test fails.
    """

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.transcript: list[str] = []
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stderr: IO[bytes] = log_path.open("wb")
        try:
            self._popen = subprocess.Popen(
                argv,
                cwd=PROJECT_ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                encoding="utf-8",
            )
        except BaseException:
            self._stderr.close()
            raise
        self._reader = threading.Thread(target=self._read_stdout, name=f"{name}-stdout")
        self._reader.daemon = True
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._popen.pid

    def _read_stdout(self) -> None:
        assert self._popen.stdout is not None
        for line in self._popen.stdout:
            self.transcript.append(line.rstrip("\n"))
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self._events.put(event)
        self._events.put(None)

    def next_event(self, timeout_s: float) -> dict[str, Any]:
        try:
            event = self._events.get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"{self.name}: no output within {timeout_s:g} s\n{self.log_tail()}")
        if event is None:
            pytest.fail(f"{self.name} exited ({self._popen.poll()})\n{self.log_tail()}")
        return event

    def wait_event(
        self, name: str, timeout_s: float
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The first event called `name`, and the events read before it."""
        deadline = time.monotonic() + timeout_s
        skipped: list[dict[str, Any]] = []
        while True:
            event = self.next_event(max(0.0, deadline - time.monotonic()))
            if event.get("event") == name:
                return event, skipped
            skipped.append(event)

    def has_pending_output(self) -> bool:
        return not self._events.empty()

    def send(self, line: str) -> None:
        """Queue a command; a stopped worker finds it in its stdin pipe when continued."""
        assert self._popen.stdin is not None
        self._popen.stdin.write(line + "\n")
        self._popen.stdin.flush()

    def write(self, body: Mapping[str, Any], idempotency_key: str) -> None:
        self.send(f"write {json.dumps(body, separators=(',', ':'))} {idempotency_key}")

    def pause(self) -> None:
        """A real SIGSTOP; returns once the kernel reports the process stopped."""
        os.kill(self.pid, signal.SIGSTOP)
        wait_until(f"{self.name} to be stopped", lambda: self.state() == "T", 5.0)

    def resume(self) -> None:
        """A real SIGCONT; returns once the process runs again."""
        os.kill(self.pid, signal.SIGCONT)
        wait_until(f"{self.name} to run again", lambda: self.state() != "T", 5.0)

    def kill(self) -> None:
        """A real SIGKILL; returns once the process is reaped (it prints nothing more)."""
        os.kill(self.pid, signal.SIGKILL)
        self._popen.wait(timeout=5)
        self._reader.join(timeout=5)

    def exited(self) -> bool:
        return self._popen.poll() is not None

    def state(self) -> str:
        """The scheduler state letter from /proc (T: stopped by a signal)."""
        return _proc_state(self.pid)

    def stop(self) -> None:
        if self._popen.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGCONT)
        if self._popen.stdin is not None:
            with contextlib.suppress(OSError):
                self._popen.stdin.close()
        try:
            self._popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
        self._reader.join(timeout=5)
        if self._popen.stdout is not None:
            self._popen.stdout.close()
        self._stderr.close()

    def log_tail(self, lines: int = 40) -> str:
        stderr = ""
        with contextlib.suppress(FileNotFoundError):
            stderr = self.log_path.read_text(encoding="utf-8", errors="replace")
        out = "\n".join(self.transcript[-lines:])
        err = "\n".join(stderr.splitlines()[-lines:])
        return f"--- {self.name} stdout ---\n{out}\n--- {self.name} stderr ---\n{err}"


# -- the stack: upstream + proxy ------------------------------------------------------------


@dataclass
class Stack:
    proxy_url: str
    upstream_url: str
    admin_token: str
    proxy: ManagedProcess
    upstream: ManagedProcess
    tmp_path: Path
    workers: list[WorkerProcess] = field(default_factory=list)
    # What restart_proxy needs to start "the same" proxy again (same argv, port, store,
    # FENCEPROXY_INSTANCE_ID); set by the fixture.
    config_path: Path | None = None
    proxy_argv: list[str] = field(default_factory=list)
    proxy_env: dict[str, str] = field(default_factory=dict)
    processes: contextlib.ExitStack | None = None
    earlier_proxies: list[ManagedProcess] = field(default_factory=list)

    # proxy: the process itself

    @property
    def proxy_port(self) -> int:
        return int(self.proxy_url.rpartition(":")[2])

    @property
    def instance_id(self) -> str:
        return self.proxy_env[INSTANCE_ID_ENV]

    def kill_proxy(self) -> None:
        """A real SIGKILL of the proxy: no shutdown code runs. Returns once it is reaped."""
        assert self.proxy.is_running(), "the proxy is not running"
        os.kill(self.proxy.pid, signal.SIGKILL)
        self.wait_proxy_exit(5.0)

    def sigterm_proxy(self) -> float:
        """Send the proxy a real SIGTERM without waiting; returns time.monotonic() at sending."""
        assert self.proxy.is_running(), "the proxy is not running"
        os.kill(self.proxy.pid, signal.SIGTERM)
        return time.monotonic()

    def wait_proxy_exit(self, timeout_s: float) -> int:
        """Poll until the proxy process has exited; its exit status (negative: signal)."""
        wait_until("the proxy process to exit", lambda: not self.proxy.is_running(), timeout_s)
        status = self.proxy.returncode
        assert status is not None
        return status

    def proxy_accepts_connections(self) -> bool:
        """Does a TCP connect to the proxy's port succeed right now?"""
        try:
            with socket.create_connection(("127.0.0.1", self.proxy_port), timeout=1.0):
                return True
        except OSError:
            return False

    def restart_proxy(self, *extra_args: str, wait_ready: bool = True) -> float:
        """Start the proxy again after it exited: same port, store, config and instance id,
        with `extra_args` after `serve`'s own.

        Returns time.monotonic() taken just before the new process was started; returns
        once it answers /_fence/healthz (its startup recovery ran before the listener),
        or at once with `wait_ready=False` (for a start that is expected to fail).
        """
        assert not self.proxy.is_running(), "stop the proxy before restarting it"
        assert self.processes is not None, "this stack cannot restart its proxy"
        self.earlier_proxies.append(self.proxy)
        number = len(self.earlier_proxies) + 1
        started = time.monotonic()
        self.proxy = self.processes.enter_context(
            ManagedProcess(
                f"fenceproxy#{number}",
                [*self.proxy_argv, *extra_args],
                log_path=self.tmp_path / f"proxy-{number}.log",
                env=self.proxy_env,
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        if wait_ready:
            self.proxy.wait_http_ok(f"{self.proxy_url}/_fence/healthz", STARTUP_TIMEOUT_S)
        return started

    # proxy: leases

    def acquire(self, resource: str, holder: str, ttl_s: float | None = None) -> HttpResult:
        body: dict[str, Any] = {"resource": resource, "holder": holder}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return http_call(self.proxy_url, "POST", "/_fence/v1/leases", json_body=body)

    def acquire_ok(self, resource: str, holder: str, ttl_s: float) -> dict[str, Any]:
        result = self.acquire(resource, holder, ttl_s)
        assert result.status == 201, result
        granted: dict[str, Any] = result.body
        return granted

    def release(self, token: str) -> HttpResult:
        return http_call(
            self.proxy_url,
            "POST",
            "/_fence/v1/leases/release",
            json_body={},
            headers={"Fence-Token": token},
        )

    def lease(self, resource: str) -> dict[str, Any]:
        result = http_call(self.proxy_url, "GET", f"/_fence/v1/leases?resource={resource}")
        assert result.status == 200, result
        view: dict[str, Any] = result.body
        return view

    def wait_not_live(self, resource: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """Poll the lease view (no bare sleep) until the resource's lease is not live."""
        views: list[dict[str, Any]] = []

        def not_live() -> bool:
            views.append(self.lease(resource))
            return views[-1]["live"] is False

        wait_until(f"the lease on {resource} to end", not_live, timeout_s)
        return views[-1]

    # proxy: admin

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def revoke(self, resource: str, reason: str) -> HttpResult:
        return http_call(
            self.proxy_url,
            "POST",
            "/_fence/v1/admin/revoke",
            json_body={"resource": resource, "reason": reason},
            headers=self.admin_headers(),
        )

    def rejections_raw(self, resource: str | None) -> HttpResult:
        """The refusals on record of `resource`; None: all of them."""
        query = "" if resource is None else f"?resource={resource}"
        result = http_call(
            self.proxy_url, "GET", f"/_fence/v1/rejections{query}", headers=self.admin_headers()
        )
        assert result.status == 200, result
        return result

    def rejections(self, resource: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.rejections_raw(resource).body["rejections"]
        return found

    def effect(self, effect_id: str) -> dict[str, Any]:
        """GET /_fence/v1/effects/{id} (admin): the receipt with its "events"."""
        result = http_call(
            self.proxy_url, "GET", f"/_fence/v1/effects/{effect_id}", headers=self.admin_headers()
        )
        assert result.status == 200, result
        receipt: dict[str, Any] = result.body
        return receipt

    def proxy_effects(self, resource: str) -> list[dict[str, Any]]:
        result = http_call(
            self.proxy_url,
            "GET",
            f"/_fence/v1/effects?resource={resource}",
            headers=self.admin_headers(),
        )
        assert result.status == 200, result
        effects: list[dict[str, Any]] = result.body["effects"]
        return effects

    # proxy: fenced writes

    def place_order(
        self,
        sku: str,
        token: str,
        idempotency_key: str,
        qty: int = 1,
        extra_headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        headers = {"Fence-Token": token, "Idempotency-Key": idempotency_key}
        headers.update(extra_headers or {})
        return http_call(
            self.proxy_url, "POST", f"/orders/{sku}", json_body={"qty": qty}, headers=headers
        )

    def put_rule(
        self, rule_id: str, token: str, rule: Mapping[str, Any], idempotency_key: str | None = None
    ) -> HttpResult:
        headers = {"Fence-Token": token}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return http_call(
            self.proxy_url, "PUT", f"/rules/{rule_id}", json_body=dict(rule), headers=headers
        )

    # upstream: its own records, asked directly

    def upstream_effects(self) -> dict[str, Any]:
        result = http_call(self.upstream_url, "GET", "/_demo/effects")
        assert result.status == 200, result
        effects: dict[str, Any] = result.body
        return effects

    def fence_token_seen(self) -> int:
        result = http_call(self.upstream_url, "GET", "/_demo/headers-seen")
        assert result.status == 200, result
        seen: int = result.body["fence_token_seen"]
        return seen

    def upstream_orders(self) -> int:
        """How many orders the upstream has committed, by its own count."""
        orders: int = self.upstream_effects()["orders"]
        return orders

    def upstream_mutations_received(self) -> int:
        """How many POST/PUT/PATCH/DELETE requests reached the upstream at all, committed or
        not, read from the upstream's own SQLite file (it records each one on arrival)."""
        return self._upstream_rows("mutation_headers")

    def upstream_orders_on_disk(self) -> int:
        """The upstream's committed orders read from its SQLite file: works while the
        upstream process is stopped (SIGSTOP), when it answers no HTTP."""
        return self._upstream_rows("orders")

    def _upstream_rows(self, table: str) -> int:
        with contextlib.closing(sqlite3.connect(self.tmp_path / "upstream.db")) as db:
            (count,) = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
        rows: int = count
        return rows

    def pause_upstream(self) -> None:
        """A real SIGSTOP of the upstream: it holds its requests and answers nothing, until
        resume_upstream. Returns once the kernel reports it stopped."""
        os.kill(self.upstream.pid, signal.SIGSTOP)
        wait_until("the upstream to be stopped", lambda: _proc_state(self.upstream.pid) == "T", 5)

    def resume_upstream(self) -> None:
        os.kill(self.upstream.pid, signal.SIGCONT)
        wait_until("the upstream to run again", lambda: _proc_state(self.upstream.pid) != "T", 5)

    def upstream_rule(self, rule_id: str) -> HttpResult:
        return http_call(self.upstream_url, "GET", f"/rules/{rule_id}")

    def upstream_rule_history(self, rule_id: str) -> list[dict[str, Any]]:
        result = http_call(self.upstream_url, "GET", f"/rules/{rule_id}/history")
        assert result.status == 200, result
        history: list[dict[str, Any]] = result.body["history"]
        return history

    # the installed `fenceproxy` command, on the store directly

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the installed `fenceproxy` CLI with --config appended; never raises on exit."""
        assert self.config_path is not None
        return subprocess.run(
            [str(FENCEPROXY_CLI), *args, "--config", str(self.config_path)],
            cwd=self.tmp_path,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            check=False,
        )

    def cli_json(self, *args: str) -> Any:
        """`fenceproxy ARGS --json --config CFG`, which must succeed; its parsed output."""
        done = self.cli(*args, "--json")
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        return json.loads(done.stdout)

    # workers

    def spawn_worker(
        self,
        name: str,
        *,
        resource: str,
        holder: str,
        ttl_s: float,
        method: str,
        path: str,
        acquire_timeout_s: float = 0.0,
        headers: Mapping[str, str] | None = None,
    ) -> WorkerProcess:
        argv = [
            sys.executable,
            str(WORKER_SCRIPT),
            "--proxy",
            self.proxy_url,
            "--resource",
            resource,
            "--holder",
            holder,
            "--ttl",
            str(ttl_s),
            "--method",
            method,
            "--path",
            path,
            "--acquire-timeout",
            str(acquire_timeout_s),
        ]
        for name, value in (headers or {}).items():
            argv += ["--header", f"{name}:{value}"]
        worker = WorkerProcess(name, argv, self.tmp_path / f"worker-{name}.log")
        self.workers.append(worker)
        return worker

    def log_tails(self) -> list[tuple[str, str]]:
        sections = [(f"{p.name} log", p.log_tail(80)) for p in self.earlier_proxies]
        sections += [
            (f"{self.proxy.name} log", self.proxy.log_tail(80)),
            (f"{self.upstream.name} log", self.upstream.log_tail(40)),
        ]
        sections += [(f"worker {w.name}", w.log_tail()) for w in self.workers]
        return sections


def assert_refused(result: HttpResult, status: int, code: str) -> dict[str, Any]:
    """A problem+json refusal with this status and stable code."""
    assert result.status == status, result
    assert result.headers.get("content-type", "").startswith("application/problem+json"), result
    problem: dict[str, Any] = result.body
    assert problem["code"] == code, problem
    assert problem["status"] == status, problem
    return problem


def assert_rejection_recorded(
    stack: Stack,
    resource: str | None,
    code: str,
    *,
    count: int = 1,
    secrets_: tuple[str, ...] = (),
    holder: str | None = None,
    epoch: int | None = None,
) -> list[dict[str, Any]]:
    """The admin rejection log holds `count` refusals with `code`, and no secret or body.
    Each kind of refusal is one entry with its `count` (store/refusals.py): the sum is
    what was refused. `resource` None: the refusals that name no resource (a resource
    never leased is not named on the record)."""
    raw = stack.rejections_raw(resource)
    records: list[dict[str, Any]] = [
        r for r in raw.body["rejections"] if r["code"] == code and r["resource"] == resource
    ]
    assert sum(r["count"] for r in records) == count, raw.body
    text = json.dumps(raw.body)
    for secret in (*secrets_, stack.admin_token):
        assert secret not in text, f"a secret leaked into the rejection log: {raw.body}"
    for record in records:
        assert record["resource"] == resource, record
        assert not {"token", "fence_token", "body", "authorization"} & {k.lower() for k in record}
        if holder is not None:
            assert record["holder"] == holder, record
        if epoch is not None:
            assert record["epoch"] == epoch, record
    return records


def _start_stack(tmp_path: Path, options: StackOptions | None = None) -> Iterator[Stack]:
    options = options or StackOptions()
    upstream_port = free_port()
    proxy_port = free_port()
    admin_token = secrets.token_urlsafe(24)
    config_path = tmp_path / "fenceproxy.yaml"
    config_path.write_text(
        CONFIG_TEMPLATE.format(
            proxy_port=proxy_port,
            upstream_port=upstream_port,
            store_path=tmp_path / "fence.db",
            admin_token_env=ADMIN_TOKEN_ENV,
            timeout_s=options.upstream_timeout_s,
            place_order_reconcile=options.reconcile.yaml() if options.reconcile else "",
            limits=f"limits: {options.limits}" if options.limits else "",
            retention=f"retention: {options.retention}" if options.retention else "",
        )
        + options.top_level
    )
    proxy_argv = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config_path)]
    if options.grace_s is not None:
        proxy_argv += ["--grace", str(options.grace_s)]
    proxy_env = {
        **os.environ,
        ADMIN_TOKEN_ENV: admin_token,
        INSTANCE_ID_ENV: f"process-test-proxy:{proxy_port}",
        **dict(options.env),
    }
    with contextlib.ExitStack() as processes:
        upstream = processes.enter_context(
            ManagedProcess(
                "demo upstream",
                demo_upstream_argv(upstream_port, tmp_path / "upstream.db"),
                log_path=tmp_path / "upstream.log",
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        # Started together: the proxy needs no upstream to come up.
        proxy = processes.enter_context(
            ManagedProcess(
                "fenceproxy",
                proxy_argv,
                log_path=tmp_path / "proxy.log",
                env=proxy_env,
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        upstream_url = f"http://127.0.0.1:{upstream_port}"
        proxy_url = f"http://127.0.0.1:{proxy_port}"
        upstream.wait_http_ok(f"{upstream_url}/_demo/healthz", STARTUP_TIMEOUT_S)
        proxy.wait_http_ok(f"{proxy_url}/_fence/healthz", STARTUP_TIMEOUT_S)
        stack = Stack(
            proxy_url,
            upstream_url,
            admin_token,
            proxy,
            upstream,
            tmp_path,
            config_path=config_path,
            proxy_argv=proxy_argv,
            proxy_env=proxy_env,
            processes=processes,
        )
        try:
            yield stack
        finally:
            for worker in stack.workers:
                worker.stop()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fence_stack(**options): StackOptions for the test's `stack` fixture"
    )


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    marker = request.node.get_closest_marker("fence_stack")
    options = StackOptions(**marker.kwargs) if marker is not None else StackOptions()
    yield from _start_stack(tmp_path, options)
