"""The MCP routing example (examples/mcp_routing), end to end: the stale-worker story.

The example's MCP server runs as a real process, driven over stdio by the official MCP
SDK's own client; its worker processes take leases and write through a real fenceproxy
in front of the demo upstream. Worker A claims the job, reads the rule and is stopped
(a real SIGSTOP, by the worker's test hook, at the point where it is about to write);
its lease and its claim expire; the supervisor's replacement B claims the job again,
takes the lease at the next epoch and writes. Then A either wakes up (SIGCONT) and its
late write is refused with stale_epoch, or is killed (SIGKILL). Either way the
upstream's own history holds B's write only, and job_status shows both attempts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from examples.mcp_routing.jobs import DB_NAME, JobStore
from examples.mcp_routing.server import RESTART_BACKOFF_S, ServerSettings, Supervisor
from examples.mcp_routing.worker import STOP_BEFORE_WRITE_ENV, ProxyAccess
from tests.integration.processes.conftest import (
    PROJECT_ROOT,
    Stack,
    http_call,
    wait_until,
)

RULE_ID = "staging-eu"
RESOURCE = f"rule:{RULE_ID}"
SEED_RULE = {"route_to": "us-east", "weight": 100}
LEASE_TTL_S = 1.0
# Longer than the lease, so the replacement finds A's lease already expired; and long
# enough that a slow step on a loaded machine does not make B look stalled too.
CLAIM_TTL_S = 3.0
STORY_TIMEOUT_S = 20.0
POLL_INTERVAL_S = 0.05

T = TypeVar("T")


@dataclass
class RoutingLogs:
    """The MCP server's stderr and its workers' logs, shown when a test fails."""

    server_log: Path
    state_dir: Path

    def log_tails(self) -> list[tuple[str, str]]:
        logs = [self.server_log, *sorted((self.state_dir / "logs").glob("*.log"))]
        return [
            (f"{log.name}", "\n".join(log.read_text(errors="replace").splitlines()[-60:]))
            for log in logs
            if log.exists()
        ]


@pytest.fixture
def routing_logs(tmp_path: Path) -> RoutingLogs:
    return RoutingLogs(tmp_path / "mcp-server.log", tmp_path / "routing-state")


@asynccontextmanager
async def routing_server(
    stack: Stack | None,
    logs: RoutingLogs,
    lease_ttl_s: float = LEASE_TTL_S,
    claim_ttl_s: float = CLAIM_TTL_S,
    settle_wait_s: float = 1.0,
    blocked_recheck_s: float = 60.0,
    proxy_url: str | None = None,
    stop_before_write: bool = True,
    extra_args: tuple[str, ...] = (),
    env: tuple[tuple[str, str], ...] = (),
) -> AsyncIterator[ClientSession]:
    """The example server with one worker, as an MCP client (Claude Desktop, ...) starts
    it; the worker holding the job's first claim stops itself before its write.
    `proxy_url`: a proxy of the test's own instead of the stack's."""
    if proxy_url is None:
        assert stack is not None
        proxy_url = stack.proxy_url
    parameters = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "examples.mcp_routing.server",
            "--proxy",
            proxy_url,
            "--state",
            str(logs.state_dir),
            "--workers",
            "1",
            "--lease-ttl",
            str(lease_ttl_s),
            "--claim-ttl",
            str(claim_ttl_s),
            "--lease-wait",
            "1",
            "--http-timeout",
            "5",
            "--settle-wait",
            str(settle_wait_s),
            "--blocked-recheck",
            str(blocked_recheck_s),
            *extra_args,
        ],
        env={
            "PYTHONUNBUFFERED": "1",
            **({STOP_BEFORE_WRITE_ENV: "1"} if stop_before_write else {}),
            **dict(env),
        },
        cwd=PROJECT_ROOT,
    )
    with logs.server_log.open("w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


async def call(session: ClientSession, tool: str, **arguments: str) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    structured: dict[str, Any] = result.structured_content
    return structured


async def poll(
    what: str, probe: Callable[[], Awaitable[T | None]], timeout_s: float = STORY_TIMEOUT_S
) -> T:
    """Ask `probe` until it answers something other than None; fail once time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = await probe()
        if answer is not None:
            return answer
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        await anyio.sleep(POLL_INTERVAL_S)


def attempt_pid(logs: RoutingLogs, job_id: str, generation: int) -> int:
    """A worker's pid, from the job table: job_status does not show pids to the model."""
    with contextlib.closing(sqlite3.connect(logs.state_dir / DB_NAME)) as jobs:
        (pid,) = jobs.execute(
            "SELECT pid FROM attempts WHERE job_id = ? AND generation = ?", (job_id, generation)
        ).fetchone()
    found: int = pid
    return found


def process_state(pid: int) -> str:
    """The scheduler state letter from /proc (T: stopped by a signal); "gone" once reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rpartition(")")[2].split()[0]


async def worker_a_stopped_before_its_write(
    session: ClientSession, logs: RoutingLogs, job_id: str
) -> dict[str, Any]:
    """A's attempt (with its pid from the job table) once A has read the rule and
    stopped itself just before its PUT."""

    async def stopped() -> dict[str, Any] | None:
        attempts = (await call(session, "job_status", job_id=job_id))["attempts"]
        if not attempts or attempts[0]["phase"] != "writing":
            return None
        assert "pid" not in attempts[0]
        first: dict[str, Any] = {**attempts[0], "pid": attempt_pid(logs, job_id, 1)}
        return first if process_state(first["pid"]) == "T" else None

    return await poll("worker A to stop before its write", stopped)


async def job_done_by_replacement(session: ClientSession, job_id: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        status = await call(session, "job_status", job_id=job_id)
        return status if status["state"] == "done" else None

    return await poll("the replacement worker to finish the job", done)


def assert_only_b_wrote(stack: Stack, worker_b: dict[str, Any], epoch_a: int) -> None:
    """The upstream's own history: the seed, then B's write under epoch A + 1, nothing else."""
    history = stack.upstream_rule_history(RULE_ID)
    assert len(history) == 2, history
    seed, written = history
    assert seed["rule"] == SEED_RULE, history
    assert written["rule"] == {
        **SEED_RULE,
        "route_to": "eu-west",
        "written_by": {
            "job": written["rule"]["written_by"]["job"],
            "worker": worker_b["worker"],
            "epoch": epoch_a + 1,
        },
    }, written
    assert written["fence_epoch"] == str(epoch_a + 1), written


async def start_story(
    stack: Stack, session: ClientSession, logs: RoutingLogs
) -> tuple[str, dict[str, Any]]:
    """Seed the rule upstream, ask for the update, and wait for A to stall before writing."""
    seeded = http_call(stack.upstream_url, "PUT", f"/rules/{RULE_ID}", json_body=SEED_RULE)
    assert seeded.status == 200, seeded
    job_id = (await call(session, "update_routing_rule", rule_id=RULE_ID, route_to="eu-west"))[
        "job_id"
    ]
    worker_a = await worker_a_stopped_before_its_write(session, logs, job_id)
    assert worker_a["generation"] == 1
    assert worker_a["epoch"] == 1
    assert worker_a["outcome"] is None
    return job_id, worker_a


async def test_a_stalled_worker_resumed_after_its_replacement_wrote_is_refused(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    async with routing_server(stack, routing_logs) as session:
        job_id, worker_a = await start_story(stack, session, routing_logs)
        epoch_a = worker_a["epoch"]

        status = await job_done_by_replacement(session, job_id)
        worker_b = status["attempts"][1]
        assert worker_b["worker"] != worker_a["worker"]
        assert (worker_b["generation"], worker_b["epoch"]) == (2, epoch_a + 1)
        assert worker_b["outcome"] == "written", worker_b
        assert status["rule_read"] == SEED_RULE
        # A is still stopped: it has not written, and cannot have noticed anything.
        assert process_state(worker_a["pid"]) == "T"

        os.kill(worker_a["pid"], signal.SIGCONT)

        async def a_finished() -> dict[str, Any] | None:
            status = await call(session, "job_status", job_id=job_id)
            return status if status["attempts"][0]["outcome"] is not None else None

        status = await poll("worker A's late write to be answered", a_finished)
        assert status["attempts"][0]["outcome"] == "stale_epoch", status
        # A's stale claim could not touch the job: B's outcome stands.
        assert status["state"] == "done", status
        assert status["result"]["outcome"] == "written", status
        assert status["attempts"][1:] == [worker_b], status

        assert_only_b_wrote(stack, worker_b, epoch_a)
        # The proxy's own record of the refused write (A's release was refused as well).
        refused_writes = [r for r in stack.rejections(RESOURCE) if r["route"] == "put-rule"]
        assert [(r["code"], r["holder"], r["epoch"]) for r in refused_writes] == [
            ("stale_epoch", worker_a["worker"], epoch_a)
        ], refused_writes
        rule = await call(session, "get_routing_rule", rule_id=RULE_ID)
        assert rule["rule"]["written_by"]["worker"] == worker_b["worker"], rule


async def test_a_killed_worker_is_replaced_and_its_attempt_closed(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    async with routing_server(stack, routing_logs) as session:
        job_id, worker_a = await start_story(stack, session, routing_logs)

        os.kill(worker_a["pid"], signal.SIGKILL)

        status = await job_done_by_replacement(session, job_id)
        assert len(status["attempts"]) == 2, status
        worker_b = status["attempts"][1]
        assert worker_b["worker"] != worker_a["worker"]
        assert (worker_b["generation"], worker_b["epoch"]) == (2, worker_a["epoch"] + 1)
        assert worker_b["outcome"] == "written", worker_b
        closed = status["attempts"][0]
        assert closed["outcome"] == "worker_exited", status
        assert closed["detail"] == "worker exited (killed by SIGKILL)", status

        assert_only_b_wrote(stack, worker_b, worker_a["epoch"])
        assert stack.rejections(RESOURCE) == []


async def write_in_doubt(
    stack: Stack, session: ClientSession, routing_logs: RoutingLogs
) -> tuple[str, str]:
    """A, stopped before its write, is continued with the upstream paused: its write is
    sent and never answered, so the proxy answers outcome_unknown. (job id, effect id)"""
    job_id, worker_a = await start_story(stack, session, routing_logs)
    stack.pause_upstream()
    os.kill(worker_a["pid"], signal.SIGCONT)

    async def in_doubt() -> str | None:
        effects = stack.proxy_effects(RESOURCE)
        return next((e["id"] for e in effects if e["state"] == "UNKNOWN"), None)

    effect_id = await poll("A's write to be in doubt at the proxy", in_doubt)
    # The proxy gave up on the request and closed its connection before the stopped
    # upstream read it, so the write never lands; but only evidence may say so.
    stack.resume_upstream()
    return job_id, effect_id


async def test_a_write_left_in_doubt_blocks_the_job_and_is_not_resent(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    # Leases long enough that A is still the holder when it writes.
    async with routing_server(
        stack, routing_logs, lease_ttl_s=10.0, claim_ttl_s=20.0, settle_wait_s=0.5
    ) as session:
        job_id, effect_id = await write_in_doubt(stack, session, routing_logs)

        async def finished() -> dict[str, Any] | None:
            status = await call(session, "job_status", job_id=job_id)
            return status if status["state"] not in ("pending", "running") else None

        status = await poll("A to give up waiting for the settlement", finished)
        assert status["state"] == "blocked", status
        result = status["result"]
        assert (result["outcome"], result["detail"], result["effect_id"]) == (
            "outcome_unknown",
            f"effect {effect_id} in doubt",
            effect_id,
        ), status
        # What happens next, for the model to relay.
        assert result["next"].startswith("Nothing will be resent."), result
        assert f"fenceproxy reconcile resolve {effect_id}" in result["next"], result
        # The rule route has no probe: the proxy's record schedules none, and the job says
        # that only an operator settles the write.
        assert result["next_probe_at"] is None
        assert stack.effect(effect_id)["next_probe_at"] is None
        assert "the proxy has no probe scheduled for it" in result["next"], result
        assert [(a["outcome"], a["epoch"]) for a in status["attempts"]] == [
            ("outcome_unknown", 1)
        ], status
        assert stack.effect(effect_id)["state"] == "UNKNOWN"
        assert [entry["rule"] for entry in stack.upstream_rule_history(RULE_ID)] == [SEED_RULE]


async def test_a_write_in_doubt_settled_not_committed_is_run_again_once(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    async with routing_server(
        stack, routing_logs, lease_ttl_s=10.0, claim_ttl_s=20.0, settle_wait_s=STORY_TIMEOUT_S
    ) as session:
        job_id, effect_id = await write_in_doubt(stack, session, routing_logs)

        async def settling() -> dict[str, Any] | None:
            status = await call(session, "job_status", job_id=job_id)
            return status if status["attempts"][0]["phase"] == "settling" else None

        await poll("A to wait for the settlement", settling)
        # What an operator checks before saying so: the upstream's own history.
        assert [entry["rule"] for entry in stack.upstream_rule_history(RULE_ID)] == [SEED_RULE]
        stack.cli_json(
            "reconcile",
            "resolve",
            effect_id,
            "--outcome",
            "not-committed",
            "--reason",
            "not in the rule's history upstream",
        )

        async def done() -> dict[str, Any] | None:
            status = await call(session, "job_status", job_id=job_id)
            return status if status["state"] == "done" else None

        status = await poll("the job to run again after the settlement", done)
        attempts = [(a["generation"], a["epoch"], a["outcome"]) for a in status["attempts"]]
        assert attempts == [(1, 1, "not_committed"), (2, 2, "written")], status
        assert status["attempts"][0]["detail"] == f"effect {effect_id} settled NOT_COMMITTED"
        history = stack.upstream_rule_history(RULE_ID)
        assert [entry["rule"]["route_to"] for entry in history] == ["us-east", "eu-west"]
        assert history[1]["fence_epoch"] == "2", history


async def test_bad_tool_input_is_an_error_result_and_enqueues_nothing(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    async with routing_server(stack, routing_logs) as session:
        for rule_id in ("../admin", "", "a/b", "x?y", "-lead", "r" * 65):
            result = await session.call_tool(
                "update_routing_rule", {"rule_id": rule_id, "route_to": "eu-west"}
            )
            assert result.is_error, (rule_id, result)
        for route_to in ("", "x" * 201, "eu\nwest"):
            result = await session.call_tool(
                "update_routing_rule", {"rule_id": RULE_ID, "route_to": route_to}
            )
            assert result.is_error, (route_to, result)
        unknown = await session.call_tool("job_status", {"job_id": "no-such-job"})
        assert unknown.is_error
        assert "no job" in json.dumps(unknown.model_dump(mode="json"))
    with contextlib.closing(sqlite3.connect(routing_logs.state_dir / DB_NAME)) as jobs:
        assert jobs.execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)
    assert stack.upstream_mutations_received() == 0


def test_the_readme_client_updates_a_rule_through_the_server(stack: Stack, tmp_path: Path) -> None:
    """examples/mcp_routing/README.md's terminal command, as a user would type it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.mcp_routing.client",
            "--proxy",
            stack.proxy_url,
            "--state",
            str(tmp_path / "routing-state"),
            "update",
            RULE_ID,
            "eu-west",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=STORY_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["state"] == "done", status
    assert [attempt["outcome"] for attempt in status["attempts"]] == ["written"], status
    assert status["rule_read"] == {}, status  # the upstream had no such rule yet (404)
    history = stack.upstream_rule_history(RULE_ID)
    assert [entry["rule"]["route_to"] for entry in history] == ["eu-west"], history


def test_a_worker_that_dies_at_once_is_restarted_at_most_once_a_second(tmp_path: Path) -> None:
    now = [1000.0]
    store = JobStore(tmp_path / "routing-state")
    supervisor = Supervisor(
        ServerSettings(
            proxy=ProxyAccess("http://127.0.0.1:9"),
            state_dir=tmp_path / "routing-state",
            workers=1,
            lease_ttl_s=LEASE_TTL_S,
            lease_wait_s=1.0,
            claim_ttl_s=CLAIM_TTL_S,
            http_timeout_s=1.0,
            settle_wait_s=1.0,
        ),
        store,
        worker_command=(sys.executable, "-c", "raise SystemExit(3)"),
        clock=lambda: now[0],
    )
    supervisor.start()
    try:
        first = supervisor.slots[0]
        wait_until("the broken worker to exit", lambda: first.popen.poll() is not None, 10.0)

        now[0] += RESTART_BACKOFF_S - 0.1
        supervisor.check()
        assert (supervisor.spawned, supervisor.slots) == (1, [first])

        now[0] += 0.1
        supervisor.check()
        assert supervisor.spawned == 2
        assert supervisor.slots[0] is not first
    finally:
        supervisor.stop()
        store.close()


async def test_shutdown_stops_a_stalled_worker_before_its_write_and_closes_its_attempt(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    async with routing_server(stack, routing_logs) as session:
        job_id, worker_a = await start_story(stack, session, routing_logs)
    # The MCP client closed the server's stdin: the server stopped its workers (SIGTERM,
    # then SIGCONT for a stopped one, which dies of the pending SIGTERM before it runs).

    assert process_state(worker_a["pid"]) == "gone"
    store = JobStore(routing_logs.state_dir)
    try:
        status = store.status(job_id)
    finally:
        store.close()
    assert status is not None
    assert [(a["outcome"], a["detail"]) for a in status["attempts"]] == [
        ("worker_exited", "worker exited (killed by SIGTERM)")
    ], status
    assert [entry["rule"] for entry in stack.upstream_rule_history(RULE_ID)] == [SEED_RULE]
