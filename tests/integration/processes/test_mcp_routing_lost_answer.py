"""The MCP routing example when the answer to a job's write is lost on its way back.

Real processes: the demo upstream, fenceproxy, the example's MCP server and its worker,
and between the worker and the proxy a relay (answer_dropping_relay.py) that forwards
the rule PUT and closes the worker's connection instead of relaying the proxy's answer.
The write reached the upstream and the proxy recorded it COMMITTED; the worker sees a
connection closed without an answer. That is not "nothing was done": the job sent its
write under its id as the Idempotency-Key, and asks the proxy again under it. The
evidence is the upstream's own rule history: the older job's write is never applied
again over the newer job's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from support.processes import ManagedProcess, free_port
from tests.integration.processes.conftest import (
    PROJECT_ROOT,
    STARTUP_TIMEOUT_S,
    Stack,
    http_call,
)
from tests.integration.processes.test_mcp_routing import (
    RESOURCE,
    RULE_ID,
    SEED_RULE,
    RoutingLogs,
    call,
    poll,
    routing_server,
)

OLDER_ROUTE, NEWER_ROUTE = "eu-west", "ap-south"


@pytest.fixture
def routing_logs(tmp_path: Path) -> RoutingLogs:
    return RoutingLogs(tmp_path / "mcp-server.log", tmp_path / "routing-state")


@pytest.fixture
def relay(stack: Stack, tmp_path: Path) -> Iterator[str]:
    """The relay's URL: the worker's way to the proxy."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tests.integration.processes.answer_dropping_relay",
        str(port),
        stack.proxy_url,
    ]
    with ManagedProcess(
        "relay", argv, log_path=tmp_path / "relay.log", cwd=PROJECT_ROOT, start_new_session=True
    ) as process:
        url = f"http://127.0.0.1:{port}"
        process.wait_http_ok(f"{url}/_fence/healthz", STARTUP_TIMEOUT_S)
        yield url


def drop_put_answers(relay: str, puts: int) -> int:
    """Drop the answers of the next `puts` rule PUTs; how many were dropped so far."""
    result = http_call(relay, "POST", f"/_relay/drop?puts={puts}")
    assert result.status == 200, result
    dropped: int = result.body["dropped"]
    return dropped


async def finished(session: ClientSession, job_id: str) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        status = await call(session, "job_status", job_id=job_id)
        return status if status["state"] not in ("pending", "running") else None

    return await poll(f"job {job_id} to end", ended)


def writers(stack: Stack) -> list[str]:
    """The jobs whose writes the upstream applied, in its order (after the seed)."""
    history = stack.upstream_rule_history(RULE_ID)
    assert history[0]["rule"] == SEED_RULE, history
    return [entry["rule"]["written_by"]["job"] for entry in history[1:]]


def proxy_effects_of(stack: Stack, job_id: str) -> list[str]:
    """The states of the proxy's effects sent under the job's key."""
    return [e["state"] for e in stack.proxy_effects(RESOURCE) if e["idempotency_key"] == job_id]


def seed(stack: Stack) -> None:
    seeded = http_call(stack.upstream_url, "PUT", f"/rules/{RULE_ID}", json_body=SEED_RULE)
    assert seeded.status == 200, seeded


async def test_a_lost_answer_is_asked_again_under_the_jobs_key_and_never_applied_twice(
    stack: Stack, routing_logs: RoutingLogs, relay: str
) -> None:
    seed(stack)
    drop_put_answers(relay, 1)
    async with routing_server(
        stack,
        routing_logs,
        proxy_url=relay,
        stop_before_write=False,
        lease_ttl_s=10.0,
        claim_ttl_s=20.0,
        settle_wait_s=5.0,
    ) as session:
        older = await call(session, "update_routing_rule", rule_id=RULE_ID, route_to=OLDER_ROUTE)
        newer = await call(session, "update_routing_rule", rule_id=RULE_ID, route_to=NEWER_ROUTE)
        older_status = await finished(session, older["job_id"])
        newer_status = await finished(session, newer["job_id"])
    assert drop_put_answers(relay, 0) == 1

    # The upstream's own record: the older job's write once, then the newer's; the
    # newer rule stands.
    assert writers(stack) == [older["job_id"], newer["job_id"]]
    assert stack.upstream_rule(RULE_ID).body["rule"]["route_to"] == NEWER_ROUTE
    # The proxy had forwarded the first send and recorded it applied: one effect.
    assert proxy_effects_of(stack, older["job_id"]) == ["COMMITTED"]
    # Done, because the proxy's record of its key says its write was applied.
    assert older_status["state"] == "done", older_status
    assert [a["outcome"] for a in older_status["attempts"]] == ["written"], older_status
    assert "replayed by the proxy" in older_status["result"]["detail"], older_status
    assert newer_status["state"] == "done", newer_status


async def test_a_lost_answer_the_proxy_cannot_be_asked_about_blocks_the_job_until_its_key_says(
    stack: Stack, routing_logs: RoutingLogs, relay: str
) -> None:
    seed(stack)
    drop_put_answers(relay, 1000)  # every send and every resend of the job's write
    async with routing_server(
        stack,
        routing_logs,
        proxy_url=relay,
        stop_before_write=False,
        lease_ttl_s=10.0,
        claim_ttl_s=20.0,
        settle_wait_s=1.0,
    ) as session:
        older = await call(session, "update_routing_rule", rule_id=RULE_ID, route_to=OLDER_ROUTE)
        status = await finished(session, older["job_id"])
        # Not "nothing was done", and not retried as a new write: blocked, saying why.
        assert status["state"] == "blocked", status
        assert status["result"]["outcome"] == "answer_lost", status
        assert "may or may not have been applied" in status["result"]["next"], status
        assert writers(stack) == [older["job_id"]]
        assert proxy_effects_of(stack, older["job_id"]) == ["COMMITTED"]

        drop_put_answers(relay, 0)
        # Looked at now: nothing is in doubt on the rule, so it runs again under its
        # key, with another body (a new read, a new epoch): the proxy refuses it
        # idempotency_key_reused, naming the first send's effect, which is COMMITTED.
        await call(session, "retry_job", job_id=older["job_id"])
        status = await finished(session, older["job_id"])
        assert status["state"] == "done", status
        assert [a["outcome"] for a in status["attempts"]] == ["answer_lost", "written"], status
        assert status["result"]["detail"].endswith("settled COMMITTED"), status

        newer = await call(session, "update_routing_rule", rule_id=RULE_ID, route_to=NEWER_ROUTE)
        assert (await finished(session, newer["job_id"]))["state"] == "done"
    assert writers(stack) == [older["job_id"], newer["job_id"]]
    assert proxy_effects_of(stack, older["job_id"]) == ["COMMITTED"]
