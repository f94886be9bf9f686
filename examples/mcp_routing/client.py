"""Try the routing server from a terminal, as an MCP client would use it.

    python -m examples.mcp_routing.client --proxy http://127.0.0.1:8080 --state DIR \\
        update r1 eu-west
    python -m examples.mcp_routing.client --proxy http://127.0.0.1:8080 --state DIR get r1

Starts the server over stdio with the official SDK's client (as Claude Desktop or any
other MCP client does), calls its tools and prints their answers as JSON. `update`
waits until the job is no longer pending or running and prints its job_status.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Final

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from examples.mcp_routing.worker import ProxyAccess

PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
POLL_INTERVAL_S: Final = 0.2
UNFINISHED: Final = frozenset({"pending", "running"})


class ToolFailed(RuntimeError):
    """The server answered a tool call with an error result."""


async def _call(session: ClientSession, tool: str, **arguments: str) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    if result.is_error:
        raise ToolFailed(" ".join(getattr(block, "text", "") for block in result.content))
    answer: dict[str, Any] = result.structured_content
    return answer


async def run(server: StdioServerParameters, args: argparse.Namespace) -> dict[str, Any]:
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        if args.command == "get":
            return await _call(session, "get_routing_rule", rule_id=args.rule_id)
        job = await _call(
            session, "update_routing_rule", rule_id=args.rule_id, route_to=args.route_to
        )
        deadline = time.monotonic() + args.wait
        while True:
            status = await _call(session, "job_status", job_id=job["job_id"])
            if status["state"] not in UNFINISHED or time.monotonic() >= deadline:
                return status
            await anyio.sleep(POLL_INTERVAL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.mcp_routing.client")
    ProxyAccess.add_arguments(parser)  # passed on to the server
    parser.add_argument("--state", required=True, help="the server's state directory")
    parser.add_argument(
        "--wait", type=float, default=30.0, help="seconds to wait for the job (default 30)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    update = commands.add_parser("update", help="set a rule's route_to and wait for the job")
    update.add_argument("rule_id")
    update.add_argument("route_to")
    get = commands.add_parser("get", help="read a rule through the proxy")
    get.add_argument("rule_id")
    args = parser.parse_args(argv)
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "examples.mcp_routing.server",
            *ProxyAccess.from_arguments(args).argv(),
            "--state",
            # The server runs in the project's directory, not in this one.
            str(Path(args.state).resolve()),
        ],
        # The SDK hands a server only a few safe variables (PATH, HOME, ...): the
        # client key's variable is passed on by name.
        env={args.api_key_env: os.environ[args.api_key_env]} if args.api_key_env else None,
        cwd=PROJECT_ROOT,
    )
    try:
        answer = anyio.run(run, server, args)
    except ToolFailed as failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
