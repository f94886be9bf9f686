"""The MCP routing example as a team would deploy it, driven through
the official MCP SDK's stdio client as a host does, against real processes.

1. A worker that cannot read an upstream's answer (another JSON shape, from an upstream
   that is not the demo) ends its attempt with the reason; three in a row fail the job.
2. A blocked job follows its effect's settlement: periodically, or when the model asks
   (retry_job); update_routing_rule on the blocked rule says so at once.
3. A worker that died gives its claim back at once: its job does not wait out the claim.
4. The tools' schemas, annotations, list_jobs, cancel_job and retry_job.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from examples.mcp_routing.jobs import MAX_SAME_FAILURES
from support.processes import ManagedProcess, free_port
from tests.integration.processes.conftest import (
    PROJECT_ROOT,
    STARTUP_TIMEOUT_S,
    Stack,
    StackOptions,
    _start_stack,
    http_call,
)
from tests.integration.processes.test_mcp_routing import (
    RULE_ID,
    SEED_RULE,
    RoutingLogs,
    call,
    poll,
    routing_server,
    start_story,
    write_in_doubt,
)

OTHER_POLICY = """\
version: 1
listen: {{host: 127.0.0.1, port: {proxy_port}}}
store: sqlite:///{store_path}
leases: {{min_ttl_s: 0.5, max_ttl_s: 60, default_ttl_s: 2}}
upstreams:
  rules: {{url: "http://127.0.0.1:{upstream_port}", timeout_s: 1, connect_timeout_s: 0.25}}
routes:
  - name: put-rule
    upstream: rules
    match: {{methods: [PUT], path: "/rules/{{rule_id}}"}}
    resource: "rule:{{rule_id}}"
    fence: required
  - name: read-rules
    upstream: rules
    match: {{methods: [GET], path: "/rules/{{rest:.*}}"}}
    fence: none
"""


@pytest.fixture
def routing_logs(tmp_path: Path) -> RoutingLogs:
    return RoutingLogs(tmp_path / "mcp-server.log", tmp_path / "routing-state")


@dataclass
class OtherStack:
    proxy_url: str
    upstream_url: str


@pytest.fixture
def other_stack(tmp_path: Path) -> Iterator[OtherStack]:
    """fenceproxy in front of tests/integration/processes/other_shape_upstream.py."""
    upstream_port, proxy_port = free_port(), free_port()
    config = tmp_path / "fenceproxy.yaml"
    config.write_text(
        OTHER_POLICY.format(
            proxy_port=proxy_port, upstream_port=upstream_port, store_path=tmp_path / "fence.db"
        )
    )
    upstream_argv = [
        sys.executable,
        "-m",
        "tests.integration.processes.other_shape_upstream",
        str(upstream_port),
    ]
    proxy_argv = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)]
    with (
        ManagedProcess(
            "other upstream",
            upstream_argv,
            log_path=tmp_path / "upstream.log",
            cwd=PROJECT_ROOT,
            start_new_session=True,
        ) as upstream,
        ManagedProcess(
            "fenceproxy",
            proxy_argv,
            log_path=tmp_path / "proxy.log",
            cwd=PROJECT_ROOT,
            start_new_session=True,
        ) as proxy,
    ):
        stack = OtherStack(f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{upstream_port}")
        upstream.wait_http_ok(f"{stack.upstream_url}/healthz", STARTUP_TIMEOUT_S)
        proxy.wait_http_ok(f"{stack.proxy_url}/_fence/healthz", STARTUP_TIMEOUT_S)
        yield stack


async def status_in(session: ClientSession, job_id: str, *states: str) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        status = await call(session, "job_status", job_id=job_id)
        return status if status["state"] in states else None

    return await poll(f"job {job_id} to be {' or '.join(states)}", reached)


async def test_an_answer_the_worker_cannot_read_fails_the_job_with_the_reason(
    other_stack: OtherStack, routing_logs: RoutingLogs
) -> None:
    async with routing_server(
        None, routing_logs, proxy_url=other_stack.proxy_url, stop_before_write=False
    ) as session:
        queued = await call(session, "update_routing_rule", rule_id=RULE_ID, route_to="eu-west")
        status = await status_in(session, queued["job_id"], "failed")
    assert status["result"] == {
        "outcome": "worker_error",
        "detail": f"KeyError: 'rule' ({MAX_SAME_FAILURES} attempts in a row ended so)",
        "effect_id": None,
        "next_probe_at": None,
        "next": None,
    }, status
    assert [(a["outcome"], a["detail"]) for a in status["attempts"]] == [
        ("worker_error", "KeyError: 'rule'")
    ] * MAX_SAME_FAILURES, status
    # No crash loop: the one worker survived every attempt, and nothing was written.
    assert {a["worker"] for a in status["attempts"]} == {status["attempts"][0]["worker"]}
    assert len(list((routing_logs.state_dir / "logs").glob("*.log"))) == 1
    assert http_call(other_stack.upstream_url, "GET", "/puts").body == {"puts": 0}


async def test_a_killed_workers_job_is_taken_over_before_its_claim_expires(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    claim_ttl_s = 60.0  # the replacement must not wait for it
    async with routing_server(stack, routing_logs, claim_ttl_s=claim_ttl_s) as session:
        job_id, worker_a = await start_story(stack, session, routing_logs)
        os.kill(worker_a["pid"], signal.SIGKILL)

        async def done() -> dict[str, Any] | None:
            status = await call(session, "job_status", job_id=job_id)
            return status if status["state"] == "done" else None

        status = await poll("the replacement to finish the job", done, timeout_s=claim_ttl_s / 3)
    assert [(a["generation"], a["outcome"]) for a in status["attempts"]] == [
        (1, "worker_exited"),
        (2, "written"),
    ], status


async def test_a_blocked_job_follows_its_settlement_when_the_model_asks(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    async with routing_server(
        stack, routing_logs, lease_ttl_s=10.0, claim_ttl_s=20.0, settle_wait_s=0.5
    ) as session:
        job_id, effect_id = await write_in_doubt(stack, session, routing_logs)
        await status_in(session, job_id, "blocked")

        # A new job on the blocked rule would block too: said at once, nothing queued.
        refused = await session.call_tool(
            "update_routing_rule", {"rule_id": RULE_ID, "route_to": "us-west"}
        )
        assert refused.is_error
        text = " ".join(getattr(block, "text", "") for block in refused.content)
        assert f"rule {RULE_ID} is blocked by job {job_id}" in text, text
        assert f"reconcile resolve {effect_id}" in text, text
        assert [j["job_id"] for j in (await call(session, "list_jobs"))["jobs"]] == [job_id]

        # Asked while still in doubt: still blocked.
        still = await call(session, "retry_job", job_id=job_id)
        assert still["state"] == "blocked", still

        stack.cli_json(
            "reconcile", "resolve", effect_id, "--outcome", "committed", "--reason", "checked"
        )
        followed = await call(session, "retry_job", job_id=job_id)
        assert followed["state"] == "done", followed
        assert followed["result"] == {
            "outcome": "written",
            "detail": f"effect {effect_id} settled COMMITTED",
            "effect_id": None,
            "next_probe_at": None,
            "next": None,
        }, followed


async def test_a_blocked_job_settled_not_committed_runs_again_on_its_own(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    async with routing_server(
        stack,
        routing_logs,
        lease_ttl_s=10.0,
        claim_ttl_s=20.0,
        settle_wait_s=0.5,
        blocked_recheck_s=0.3,
    ) as session:
        job_id, effect_id = await write_in_doubt(stack, session, routing_logs)
        await status_in(session, job_id, "blocked")
        stack.cli_json(
            "reconcile", "resolve", effect_id, "--outcome", "not-committed", "--reason", "absent"
        )
        status = await status_in(session, job_id, "done")
    assert [(a["generation"], a["outcome"]) for a in status["attempts"]] == [
        (1, "outcome_unknown"),
        (2, "written"),
    ], status
    history = stack.upstream_rule_history(RULE_ID)
    assert [entry["rule"]["route_to"] for entry in history] == [SEED_RULE["route_to"], "eu-west"]


async def test_the_tools_describe_their_limits_and_manage_jobs(
    stack: Stack, routing_logs: RoutingLogs
) -> None:
    async with routing_server(stack, routing_logs) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == {
            "update_routing_rule",
            "job_status",
            "list_jobs",
            "cancel_job",
            "retry_job",
            "get_routing_rule",
        }
        update = tools["update_routing_rule"].input_schema["properties"]
        assert update["rule_id"]["maxLength"] == 64
        assert update["rule_id"]["pattern"].startswith("^[A-Za-z0-9]")
        assert update["route_to"]["maxLength"] == 200
        for tool in tools.values():
            assert tool.output_schema is not None, tool.name
            assert tool.annotations is not None, tool.name
        assert tools["job_status"].annotations is not None
        assert tools["job_status"].annotations.read_only_hint is True
        assert tools["list_jobs"].annotations is not None
        assert tools["list_jobs"].annotations.read_only_hint is True
        assert tools["cancel_job"].annotations is not None
        assert tools["cancel_job"].annotations.destructive_hint is True

        # The one worker is stopped on the first job, so the second waits its turn.
        running, _ = await start_story(stack, session, routing_logs)
        waiting = (await call(session, "update_routing_rule", rule_id="other", route_to="x"))[
            "job_id"
        ]
        cancelled = await call(session, "cancel_job", job_id=waiting)
        assert cancelled["state"] == "cancelled", cancelled
        refused = await session.call_tool("cancel_job", {"job_id": running})
        assert refused.is_error
        listed = (await call(session, "list_jobs"))["jobs"]
        assert [(j["job_id"], j["state"]) for j in listed] == [
            (waiting, "cancelled"),
            (running, "running"),
        ]
        only = (await session.call_tool("list_jobs", {"state": "cancelled"})).structured_content
        assert only is not None
        assert [j["job_id"] for j in only["jobs"]] == [waiting]
        again = await call(session, "retry_job", job_id=waiting)
        assert again["state"] == "pending", again
        # Limits are checked before anything runs.
        too_many = await session.call_tool("list_jobs", {"limit": 101})
        assert too_many.is_error


ROUTING_KEY_ENV = "ROUTING_WORKERS_KEY"
ROUTING_KEY = secrets.token_urlsafe(32)
ROUTING_AUTH = f"""\
auth:
  clients:
    - name: routing-workers
      key_env: {ROUTING_KEY_ENV}
      resources: ["rule:*"]
      may: [lease, read]
"""


@pytest.fixture
def auth_stack(tmp_path: Path) -> Iterator[Stack]:
    yield from _start_stack(
        tmp_path, StackOptions(top_level=ROUTING_AUTH, env=((ROUTING_KEY_ENV, ROUTING_KEY),))
    )


async def test_the_server_passes_its_client_key_to_the_workers(
    auth_stack: Stack, routing_logs: RoutingLogs
) -> None:
    """Where `auth:` is on: --api-key-env names the variable (the key never goes on a
    command line), and the server's workers lease with it."""
    async with routing_server(
        auth_stack,
        routing_logs,
        stop_before_write=False,
        extra_args=("--api-key-env", ROUTING_KEY_ENV),
        env=((ROUTING_KEY_ENV, ROUTING_KEY),),
    ) as session:
        queued = await call(session, "update_routing_rule", rule_id=RULE_ID, route_to="eu-west")
        status = await status_in(session, queued["job_id"], "done", "failed", "blocked")
    assert status["state"] == "done", status
    # With `auth:` on, a lease without the key is refused (401): done is the key's work.
    history = auth_stack.upstream_rule_history(RULE_ID)
    assert [entry["rule"]["route_to"] for entry in history] == ["eu-west"]
