"""`make run`: the demo upstream and fenceproxy with config/example.yaml, until Ctrl-C.

Both run as child processes with their output in state/*.log. If either dies,
its log tail is printed and this exits non-zero.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from demo.upstream import demo_upstream_argv
from support.processes import ManagedProcess, ProcessFailed

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = PROJECT_ROOT / "state"
UPSTREAM_PORT = 9001  # fixed because config/example.yaml points its upstream here
PROXY_URL = "http://127.0.0.1:8080"  # the listen address in config/example.yaml
UPSTREAM_URL = f"http://127.0.0.1:{UPSTREAM_PORT}"
DEMO_ADMIN_TOKEN = "demo-admin-token"
STARTUP_TIMEOUT_S = 20.0
CHILD_CHECK_INTERVAL_S = 0.2


def what_to_try(admin_token_hint: str) -> str:
    return f"""
fenceproxy is listening on {PROXY_URL}, in front of the demo upstream on {UPSTREAM_URL}.

The operator's status page (it asks for the admin token, {admin_token_hint}):
  {PROXY_URL}/_fence/ui/

Take a lease on supplier:widget and keep its token:
  TOKEN=$(curl -s -XPOST localhost:8080/_fence/v1/leases -H 'content-type: application/json' \\
    -d '{{"resource":"supplier:widget","holder":"worker-a","ttl_s":30}}' \\
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')

Place an order under that lease (send it twice: the second reply is a replay):
  curl -s -XPOST localhost:8080/orders/widget -H "Fence-Token: $TOKEN" \\
    -H 'Idempotency-Key: order-1' -H 'content-type: application/json' -d '{{"qty":2}}'

Show the resource's lease, epoch and anything in doubt:
  curl -s 'localhost:8080/_fence/v1/leases?resource=supplier:widget'

What the upstream really received, from its own records:
  curl -s localhost:{UPSTREAM_PORT}/_demo/effects

Admin calls take -H "Authorization: Bearer {admin_token_hint}".
The walkthrough in README.md goes on from here.
Logs: {STATE_DIR}/*.log. Ctrl-C stops both processes.
"""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> int:
    STATE_DIR.mkdir(exist_ok=True)
    proxy_env = dict(os.environ)
    # Never echo a token the user chose; only the well-known demo one.
    admin_token_hint = (
        "$FENCEPROXY_ADMIN_TOKEN" if "FENCEPROXY_ADMIN_TOKEN" in os.environ else DEMO_ADMIN_TOKEN
    )
    proxy_env.setdefault("FENCEPROXY_ADMIN_TOKEN", DEMO_ADMIN_TOKEN)
    # The children run in their own sessions, so Ctrl-C, a SIGTERM or a closed
    # terminal reaches them only through this process's cleanup. SIGINT is set
    # too because a shell starting this in the background ignores it.
    for stop_signal in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, _stop)

    with ExitStack() as children:
        upstream = children.enter_context(
            ManagedProcess(
                "demo upstream",
                demo_upstream_argv(UPSTREAM_PORT, STATE_DIR / "demo-upstream.db"),
                log_path=STATE_DIR / "demo-upstream.log",
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        proxy = children.enter_context(
            ManagedProcess(
                "fenceproxy",
                [sys.executable, "-m", "proxy.cli", "serve", "--config", "config/example.yaml"],
                log_path=STATE_DIR / "fenceproxy.log",
                env=proxy_env,
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        try:
            upstream.wait_http_ok(f"{UPSTREAM_URL}/_demo/healthz", STARTUP_TIMEOUT_S)
            proxy.wait_http_ok(f"{PROXY_URL}/_fence/healthz", STARTUP_TIMEOUT_S)
            print(what_to_try(admin_token_hint), flush=True)
            while True:
                for child in (upstream, proxy):
                    if not child.is_running():
                        raise child.failure(f"exited with status {child.returncode}")
                time.sleep(CHILD_CHECK_INTERVAL_S)
        except ProcessFailed as failure:
            print(failure, file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\nstopping fenceproxy and the demo upstream", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
