"""An MCP server that updates routing rules in the background, fenced by fenceproxy.

    python -m examples.mcp_routing.server --proxy http://127.0.0.1:8080 --state DIR [--workers 2]

It speaks MCP over stdio (the official SDK's MCPServer). `update_routing_rule`
enqueues a job in DIR's SQLite job table and returns its id at once; worker processes
(examples/mcp_routing/worker.py) claim jobs and write the rule through the proxy under
a lease on ``rule:{rule_id}``. A supervisor here keeps --workers of them running: a
worker that exited, or whose claim lapsed (it stalled), is replaced by a new one.
A stalled worker is not killed: if it wakes up, its late write reaches the proxy,
which refuses it, and its attempt is recorded next to its successor's.

stdout is the MCP channel, so everything else (logs, workers' output) goes to stderr
or to DIR/logs/.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import anyio
import httpx
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from examples.mcp_routing.jobs import JobStore

PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
SUPERVISE_INTERVAL_S: Final = 0.1
RESTART_BACKOFF_S: Final = 1.0
WORKER_COMMAND: Final = (sys.executable, "-m", "examples.mcp_routing.worker")
STOP_GRACE_S: Final = 5.0

# Rule ids become a URL path segment and part of a lease resource name.
RULE_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_ROUTE_TO_CHARS: Final = 200

log = logging.getLogger("mcp_routing.server")


@dataclass(frozen=True)
class ServerSettings:
    proxy_url: str
    state_dir: Path
    workers: int
    lease_ttl_s: float
    lease_wait_s: float
    claim_ttl_s: float
    http_timeout_s: float
    settle_wait_s: float


@dataclass
class WorkerProcess:
    name: str
    popen: subprocess.Popen[bytes]
    log_file: IO[bytes]
    started_at: float  # the supervisor's monotonic clock


@dataclass
class Supervisor:
    """Keeps `settings.workers` worker processes that are not known to be stalled."""

    settings: ServerSettings
    store: JobStore
    worker_command: tuple[str, ...] = WORKER_COMMAND
    clock: Callable[[], float] = time.monotonic
    slots: list[WorkerProcess] = field(default_factory=list)
    # Replaced for a stalled claim but still alive: reaped when they exit, stopped at
    # shutdown, never killed while running (their late write is the proxy's to refuse).
    retired: list[WorkerProcess] = field(default_factory=list)
    spawned: int = 0

    def spawn(self) -> WorkerProcess:
        self.spawned += 1
        name = f"worker-{self.spawned}.{os.getpid()}"
        logs = self.settings.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_file = (logs / f"{name}.log").open("ab")
        argv = [
            *self.worker_command,
            "--proxy",
            self.settings.proxy_url,
            "--state",
            str(self.settings.state_dir),
            "--name",
            name,
            "--lease-ttl",
            str(self.settings.lease_ttl_s),
            "--lease-wait",
            str(self.settings.lease_wait_s),
            "--claim-ttl",
            str(self.settings.claim_ttl_s),
            "--http-timeout",
            str(self.settings.http_timeout_s),
            "--settle-wait",
            str(self.settings.settle_wait_s),
        ]
        try:
            popen = subprocess.Popen(
                argv,
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log_file,  # never the MCP channel
                stderr=subprocess.STDOUT,
            )
        except BaseException:
            log_file.close()
            raise
        log.info("started %s (pid %d)", name, popen.pid)
        return WorkerProcess(name, popen, log_file, self.clock())

    def start(self) -> None:
        self.slots = [self.spawn() for _ in range(self.settings.workers)]

    def _reaped(self, worker: WorkerProcess) -> bool:
        """Whether the worker has exited; if so, close its open attempts and its log."""
        status = worker.popen.poll()
        if status is None:
            return False
        how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"status {status}"
        log.info("%s (pid %d) exited: %s", worker.name, worker.popen.pid, how)
        self.store.worker_gone(worker.name, worker.popen.pid, f"worker exited ({how})")
        worker.log_file.close()
        return True

    def check(self) -> None:
        for slot, worker in enumerate(self.slots):
            # A worker that cannot start (a broken install) would otherwise be
            # restarted ten times a second, each with a new log file.
            if self.clock() < worker.started_at + RESTART_BACKOFF_S:
                continue
            if self._reaped(worker):
                self.slots[slot] = self.spawn()
            elif self.store.has_lapsed_claim(worker.name):
                log.info("%s let its claim lapse: starting a replacement", worker.name)
                self.retired.append(worker)
                self.slots[slot] = self.spawn()
        self.retired = [worker for worker in self.retired if not self._reaped(worker)]

    def stop(self) -> None:
        everyone = [*self.slots, *self.retired]
        for worker in everyone:
            if worker.popen.poll() is None:
                worker.popen.terminate()
                # A stopped worker would hold SIGTERM pending until continued.
                worker.popen.send_signal(signal.SIGCONT)
        for worker in everyone:
            try:
                worker.popen.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                worker.popen.kill()
                worker.popen.wait()
            # Its open attempt is closed now, not left to look alive until a new claim.
            self._reaped(worker)
        self.slots, self.retired = [], []

    async def run(self) -> None:
        while True:
            self.check()
            await anyio.sleep(SUPERVISE_INTERVAL_S)


def _valid_rule_id(rule_id: str) -> str:
    if not RULE_ID_PATTERN.fullmatch(rule_id):
        raise ToolError(
            "rule_id must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit"
        )
    return rule_id


def _valid_route_to(route_to: str) -> str:
    if not 0 < len(route_to) <= MAX_ROUTE_TO_CHARS or not route_to.isprintable():
        raise ToolError(f"route_to must be 1-{MAX_ROUTE_TO_CHARS} printable characters")
    return route_to


def build_server(settings: ServerSettings) -> MCPServer[None]:
    store = JobStore(settings.state_dir)

    @asynccontextmanager
    async def supervised(server: MCPServer[None]) -> AsyncIterator[None]:
        supervisor = Supervisor(settings, store)
        supervisor.start()
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(supervisor.run)
                try:
                    yield
                finally:
                    tasks.cancel_scope.cancel()
        finally:
            supervisor.stop()
            store.close()

    server: MCPServer[None] = MCPServer(
        "fenceproxy-routing",
        instructions=(
            "Update staging routing rules behind fenceproxy. update_routing_rule starts a"
            " background job and returns its job_id at once; poll job_status until its"
            " state is done, blocked or failed."
        ),
        lifespan=supervised,
    )

    @server.tool()
    def update_routing_rule(rule_id: str, route_to: str) -> dict[str, Any]:
        """Start a background job that sets the rule's route_to; returns {"job_id"} at once."""
        job_id = store.enqueue(_valid_rule_id(rule_id), _valid_route_to(route_to))
        return {"job_id": job_id}

    @server.tool()
    def job_status(job_id: str) -> dict[str, Any]:
        """The job's state (pending, running, done, blocked, failed), every attempt with
        its worker, lease epoch and outcome, and the rule as last read."""
        status = store.status(job_id)
        if status is None:
            raise ToolError(f"no job {job_id!r}")
        return status

    @server.tool()
    async def get_routing_rule(rule_id: str) -> dict[str, Any]:
        """The rule as the upstream has it now, read through the proxy (an unfenced read)."""
        async with httpx.AsyncClient(
            base_url=settings.proxy_url, timeout=settings.http_timeout_s, trust_env=False
        ) as http:
            try:
                response = await http.get(f"/rules/{_valid_rule_id(rule_id)}")
            except httpx.TransportError as exc:
                raise ToolError(f"the proxy at {settings.proxy_url} did not answer: {exc}") from exc
        if response.status_code == httpx.codes.NOT_FOUND:
            return {"rule_id": rule_id, "found": False}
        if response.status_code != httpx.codes.OK:
            raise ToolError(f"reading the rule answered {response.status_code}: {response.text}")
        rule: dict[str, Any] = {"found": True, **response.json()}
        return rule

    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.mcp_routing.server",
        description="MCP server (stdio) updating routing rules through fenceproxy",
    )
    parser.add_argument("--proxy", required=True, help="fenceproxy's URL")
    parser.add_argument("--state", required=True, type=Path, help="directory for the job table")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--lease-ttl", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument(
        "--lease-wait", type=float, default=10.0, help="seconds to wait for a held lease"
    )
    parser.add_argument(
        "--claim-ttl",
        type=float,
        default=30.0,
        help="seconds a worker may go without progress before it is replaced (default 30)",
    )
    parser.add_argument("--http-timeout", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument(
        "--settle-wait",
        type=float,
        default=60.0,
        help="seconds a worker waits for a write in doubt to be settled before the job"
        " is left blocked (default 60)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    build_server(
        ServerSettings(
            proxy_url=args.proxy.rstrip("/"),
            state_dir=args.state.resolve(),
            workers=args.workers,
            lease_ttl_s=args.lease_ttl,
            lease_wait_s=args.lease_wait,
            claim_ttl_s=args.claim_ttl,
            http_timeout_s=args.http_timeout,
            settle_wait_s=args.settle_wait,
        )
    ).run("stdio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
