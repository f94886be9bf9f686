"""An MCP server that updates routing rules in the background, fenced by fenceproxy.

    python -m examples.mcp_routing.server --proxy http://127.0.0.1:8080 --state DIR [--workers 2]

It speaks MCP over stdio (the official SDK's MCPServer). `update_routing_rule`
enqueues a job in DIR's SQLite job table and returns its id at once; worker processes
(examples/mcp_routing/worker.py) claim jobs and write the rule through the proxy under
a lease on ``rule:{rule_id}``. A supervisor here keeps --workers of them running: a
worker that exited (its claim is given back at once), or whose claim lapsed (it
stalled), is replaced by a new one. A stalled worker is not killed: if it wakes up,
its late write reaches the proxy, which refuses it, and its attempt is recorded next
to its successor's. Blocked jobs follow the settlement of the effect they wait for:
the supervisor looks again every --blocked-recheck seconds (and `retry_job` at once).

stdout is the MCP channel, so everything else (logs, workers' output) goes to stderr
or to DIR/logs/.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Annotated, Any, Final, Literal

import anyio
import httpx
from fenceproxy_client import AsyncFenceClient, errors
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from examples.mcp_routing.jobs import (
    BLOCKED_RECHECK_S,
    PENDING,
    BlockedJob,
    JobStore,
    Outcome,
)
from examples.mcp_routing.worker import ProxyAccess, outcome_of_settlement

PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
SUPERVISE_INTERVAL_S: Final = 0.1
RESTART_BACKOFF_S: Final = 1.0
WORKER_COMMAND: Final = (sys.executable, "-m", "examples.mcp_routing.worker")
STOP_GRACE_S: Final = 5.0

# Rule ids become a URL path segment and part of a lease resource name. The limits are
# in the tools' input schemas, so a model sees them before calling; the SDK checks them.
RULE_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_ROUTE_TO_CHARS: Final = 200
MAX_LISTED_JOBS: Final = 100
# The holder name of the supervisor's look at a blocked rule's settlement.
RECHECK_HOLDER: Final = "mcp-routing-recheck"

RuleId = Annotated[
    str,
    Field(
        pattern=RULE_ID_PATTERN,
        min_length=1,
        max_length=64,
        description="1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit",
    ),
]
# Printable: no control characters (a newline, a tab...).
RouteTo = Annotated[
    str,
    Field(
        pattern=r"^[^\x00-\x1f\x7f]+$",
        min_length=1,
        max_length=MAX_ROUTE_TO_CHARS,
        description=f"1-{MAX_ROUTE_TO_CHARS} printable characters",
    ),
]
JobId = Annotated[
    str, Field(min_length=1, max_length=64, description="as update_routing_rule answered")
]
JobState = Literal["pending", "running", "done", "blocked", "failed", "cancelled"]


class JobQueued(BaseModel):
    job_id: str


class JobResult(BaseModel):
    outcome: str = Field(description="written, stale_epoch, outcome_unknown, worker_error, ...")
    detail: str | None
    effect_id: str | None = Field(
        default=None, description="the job's write in doubt at the proxy, when it is blocked"
    )
    next_probe_at: float | None = Field(
        default=None,
        description="for a job blocked on its write: when the proxy probes it next (Unix"
        " seconds); null when no probe is scheduled, so an operator must settle it",
    )
    next: str | None = Field(default=None, description="for a blocked job: what happens next")


class Attempt(BaseModel):
    generation: int = Field(description="the claim's number; the newest is the job's")
    worker: str
    epoch: int | None = Field(description="the lease's fencing epoch")
    phase: str
    outcome: str | None
    detail: str | None


class JobStatus(BaseModel):
    job_id: str
    rule_id: str
    route_to: str
    state: JobState
    generation: int
    claimed_by: str | None
    rule_read: dict[str, Any] | None = Field(description="the rule as last read by the job")
    result: JobResult | None
    attempts: list[Attempt]


class JobSummary(BaseModel):
    job_id: str
    rule_id: str
    route_to: str
    state: JobState
    attempts: int
    result: JobResult | None
    created_at: float = Field(description="Unix time")
    updated_at: float = Field(description="Unix time")


class JobList(BaseModel):
    jobs: list[JobSummary]


class RoutingRule(BaseModel):
    rule_id: str
    found: bool
    rule: dict[str, Any] | None = None
    version: int | None = None


log = logging.getLogger("mcp_routing.server")


@dataclass(frozen=True)
class ServerSettings:
    proxy: ProxyAccess
    state_dir: Path
    workers: int
    lease_ttl_s: float
    lease_wait_s: float
    claim_ttl_s: float
    http_timeout_s: float
    settle_wait_s: float
    blocked_recheck_s: float = BLOCKED_RECHECK_S


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
            *self.settings.proxy.argv(),
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
            "--blocked-recheck",
            str(self.settings.blocked_recheck_s),
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
            for blocked in self.store.blocked_due():
                await recheck(self.settings, self.store, blocked)
            await anyio.sleep(SUPERVISE_INTERVAL_S)


async def recheck(settings: ServerSettings, store: JobStore, blocked: BlockedJob) -> None:
    """Look whether what a blocked job waits for was settled, and move the job on.

    The look is a lease on the rule: the proxy grants none while a write to it is in
    doubt, and the lease's token reads the job's effect (the token of any lease on
    the effect's resource may). Committed: the job is done. Not committed (or someone
    else's effect, now settled, or a write of its own whose answer was lost): it runs
    again under a new claim and lease."""
    outcome: Outcome | None = None
    try:
        async with (
            AsyncFenceClient(
                settings.proxy.url,
                timeout_s=settings.http_timeout_s,
                **settings.proxy.client_options(),
            ) as client,
            client.lease(f"rule:{blocked.rule_id}", RECHECK_HOLDER) as lease,
        ):
            if blocked.effect_id is None:
                # Nothing on the rule is in doubt now (the lease was granted). A job whose
                # own answer was lost runs again under its key: the proxy's record of
                # it says whether its write was applied.
                outcome = Outcome("settled", PENDING, "nothing on the rule is in doubt now")
            else:
                state = await lease.wait_settled(blocked.effect_id, 0)
                outcome = outcome_of_settlement(blocked.effect_id, state)
    except (errors.ResourceBlocked, errors.LeaseHeld, TimeoutError):
        outcome = None  # still in doubt, or the rule is busy: look again later
    except (errors.FenceError, httpx.TransportError) as exc:
        log.warning("job %s: the settlement could not be read: %s", blocked.job_id, exc)
    if store.follow_settlement(blocked, outcome) and outcome is not None:
        log.info("job %s: blocked no more: %s", blocked.job_id, outcome.detail)


def build_server(settings: ServerSettings) -> MCPServer[None]:
    store = JobStore(settings.state_dir, blocked_recheck_s=settings.blocked_recheck_s)

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
            " state is done, blocked, failed or cancelled. A blocked job's result says"
            " what happens next (relay it: an operator may have to act); list_jobs shows"
            " recent jobs, cancel_job and retry_job act on one."
        ),
        lifespan=supervised,
    )

    def status_of(job_id: str) -> JobStatus:
        status = store.status(job_id)
        if status is None:
            raise ToolError(f"no job {job_id!r}")
        return JobStatus.model_validate(status)  # the attempts' pids stay in the table

    @server.tool(
        annotations=ToolAnnotations(
            title="Update a routing rule",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=False,
            open_world_hint=True,
        )
    )
    def update_routing_rule(rule_id: RuleId, route_to: RouteTo) -> JobQueued:
        """Start a background job that sets the rule's route_to; returns its job_id at
        once. Refused at once (nothing queued) while a job on the same rule is blocked."""
        blocked = store.blocked_on_rule(rule_id)
        if blocked is not None:
            raise ToolError(
                f"rule {rule_id} is blocked by job {blocked['job_id']}: nothing was queued,"
                f" a new job would block too. {blocked['result']['next']}"
            )
        return JobQueued(job_id=store.enqueue(rule_id, route_to))

    @server.tool(annotations=ToolAnnotations(title="A job's status", read_only_hint=True))
    def job_status(job_id: JobId) -> JobStatus:
        """The job's state (pending, running, done, blocked, failed, cancelled), every
        attempt with its worker, lease epoch and outcome, the rule as last read, and
        `result` (for a blocked job, `result.next` says what happens next)."""
        return status_of(job_id)

    @server.tool(annotations=ToolAnnotations(title="Recent jobs", read_only_hint=True))
    def list_jobs(
        state: JobState | None = None,
        limit: Annotated[int, Field(ge=1, le=MAX_LISTED_JOBS)] = 20,
    ) -> JobList:
        """The newest jobs first (at most `limit`), only those in `state` if given."""
        return JobList.model_validate({"jobs": store.list_jobs(state, limit)})

    @server.tool(
        annotations=ToolAnnotations(
            title="Cancel a job",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=False,
            open_world_hint=False,
        )
    )
    def cancel_job(job_id: JobId) -> JobStatus:
        """Cancel a pending or blocked job: it will not run (a blocked job's write in
        doubt stays at the proxy for an operator). A running job cannot be cancelled."""
        refused = store.cancel(job_id)
        if refused is not None:
            raise ToolError(refused)
        return status_of(job_id)

    @server.tool(
        annotations=ToolAnnotations(
            title="Retry a job",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=False,
            open_world_hint=True,
        )
    )
    async def retry_job(job_id: JobId) -> JobStatus:
        """A failed or cancelled job runs again; a blocked job looks at its settlement
        now (done if its write was committed, run again if not, else still blocked)."""
        blocked = store.blocked_job(job_id)
        if blocked is not None:
            await recheck(settings, store, blocked)
            return status_of(job_id)
        refused = store.retry(job_id)
        if refused is not None:
            raise ToolError(refused)
        return status_of(job_id)

    @server.tool(
        annotations=ToolAnnotations(
            title="Read a routing rule", read_only_hint=True, open_world_hint=True
        )
    )
    async def get_routing_rule(rule_id: RuleId) -> RoutingRule:
        """The rule as the upstream has it now, read through the proxy (an unfenced read)."""
        # No client key on it: a pass-through request is forwarded to the upstream.
        async with httpx.AsyncClient(
            base_url=settings.proxy.url,
            timeout=settings.http_timeout_s,
            verify=settings.proxy.ssl_context(),
            trust_env=False,
        ) as http:
            try:
                response = await http.get(f"/rules/{rule_id}")
            except httpx.TransportError as exc:
                raise ToolError(f"the proxy at {settings.proxy.url} did not answer: {exc}") from exc
        if response.status_code == httpx.codes.NOT_FOUND:
            return RoutingRule(rule_id=rule_id, found=False)
        if response.status_code != httpx.codes.OK:
            raise ToolError(f"reading the rule answered {response.status_code}: {response.text}")
        body = response.json()
        if not isinstance(body, dict):
            raise ToolError(f"reading the rule answered {response.text!r}, not a JSON object")
        return RoutingRule(
            rule_id=rule_id,
            found=True,
            rule=body.get("rule") if isinstance(body.get("rule"), dict) else body,
            version=body.get("version") if isinstance(body.get("version"), int) else None,
        )

    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.mcp_routing.server",
        description="MCP server (stdio) updating routing rules through fenceproxy",
    )
    ProxyAccess.add_arguments(parser)
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
    parser.add_argument(
        "--blocked-recheck",
        type=float,
        default=BLOCKED_RECHECK_S,
        help="seconds between looks at whether a blocked job's write in doubt was settled"
        f" (default {BLOCKED_RECHECK_S:g})",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.api_key_env and not os.environ.get(args.api_key_env):
        # Else every worker would die at start, and be restarted once a second.
        parser.error(f"--api-key-env: {args.api_key_env} is not set")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    build_server(
        ServerSettings(
            proxy=ProxyAccess.from_arguments(args),
            state_dir=args.state.resolve(),
            workers=args.workers,
            lease_ttl_s=args.lease_ttl,
            lease_wait_s=args.lease_wait,
            claim_ttl_s=args.claim_ttl,
            http_timeout_s=args.http_timeout,
            settle_wait_s=args.settle_wait,
            blocked_recheck_s=args.blocked_recheck,
        )
    ).run("stdio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
