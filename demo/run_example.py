"""`make run`: the demo upstream and fenceproxy with config/example.yaml, until Ctrl-C.

Both run as child processes with their output in state/*.log. If either dies,
its log tail is printed and this exits non-zero. `make run PORT=8181
UPSTREAM_PORT=9101` (or those environment variables) moves them. The example runs
as state/fenceproxy.yaml, a copy pointing at the chosen upstream port and at the
store in the state directory (the proxy's port is given to `serve --port`).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from demo.upstream import demo_upstream_argv
from support.processes import ManagedProcess, ProcessFailed

PROJECT_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CONFIG = PROJECT_ROOT / "config" / "example.yaml"
# The ports of config/example.yaml, which the README's walkthroughs use.
DEFAULT_PORT = 8080
DEFAULT_UPSTREAM_PORT = 9001
EXAMPLE_UPSTREAM_URL = f"http://127.0.0.1:{DEFAULT_UPSTREAM_PORT}"
EXAMPLE_STORE = "sqlite:///../state/fenceproxy.db"
EXAMPLE_LISTEN = f"listen: {{host: 127.0.0.1, port: {DEFAULT_PORT}}}"
DEMO_ADMIN_TOKEN = "demo-admin-token"
STARTUP_TIMEOUT_S = 20.0
CHILD_CHECK_INTERVAL_S = 0.2


def what_to_try(admin_token_hint: str, port: int, upstream_port: int, state_dir: Path) -> str:
    return f"""
fenceproxy is listening on http://127.0.0.1:{port}, in front of the demo upstream on \
http://127.0.0.1:{upstream_port}.

The operator's status page (it asks for the admin token, {admin_token_hint}):
  http://127.0.0.1:{port}/_fence/ui/

Take a lease on supplier:widget and keep its token:
  TOKEN=$(curl -s -XPOST localhost:{port}/_fence/v1/leases -H 'content-type: application/json' \\
    -d '{{"resource":"supplier:widget","holder":"worker-a","ttl_s":30}}' \\
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')

Place an order under that lease (send it twice: the second reply is a replay):
  curl -s -XPOST localhost:{port}/orders/widget -H "Fence-Token: $TOKEN" \\
    -H 'Idempotency-Key: order-1' -H 'content-type: application/json' -d '{{"qty":2}}'

Show the resource's lease, epoch and anything in doubt:
  curl -s 'localhost:{port}/_fence/v1/leases?resource=supplier:widget'

What the upstream really received, from its own records:
  curl -s localhost:{upstream_port}/_demo/effects

Admin calls take -H "Authorization: Bearer {admin_token_hint}".
The walkthrough in README.md goes on from here.
The CLI: export FENCEPROXY_CONFIG={state_dir / "fenceproxy.yaml"}; .venv/bin/fenceproxy --help
Logs: {state_dir}/*.log. Ctrl-C stops both processes.
"""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo.run_example", description=__doc__)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="the proxy's port")
    parser.add_argument("--upstream-port", type=int, default=DEFAULT_UPSTREAM_PORT)
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=PROJECT_ROOT / "state",
        help="the store, the logs and the configuration run (default: state/)",
    )
    return parser.parse_args()


def _busy(port: int) -> bool:
    # Bound as the servers will bind (SO_REUSEADDR: a port in TIME_WAIT is free).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def write_config(port: int, upstream_port: int, state_dir: Path) -> Path:
    """config/example.yaml as run: the chosen ports, the store in `state_dir`.

    Written to `state_dir`/fenceproxy.yaml, so that the CLI reads the same store and
    probes the same upstream as the proxy (`--config state/fenceproxy.yaml`).
    """
    text = EXAMPLE_CONFIG.read_text(encoding="utf-8")
    for example, chosen in (
        (EXAMPLE_UPSTREAM_URL, f"http://127.0.0.1:{upstream_port}"),
        (EXAMPLE_STORE, f"sqlite:///{state_dir.resolve() / 'fenceproxy.db'}"),
        (EXAMPLE_LISTEN, f"listen: {{host: 127.0.0.1, port: {port}}}"),
    ):
        if text.count(example) != 1:
            raise RuntimeError(f"{EXAMPLE_CONFIG} no longer has {example} exactly once")
        text = text.replace(example, chosen)
    written = state_dir / "fenceproxy.yaml"
    written.write_text(
        f"# Written by `make run` from {EXAMPLE_CONFIG.name} (overwritten at every start).\n"
        + text,
        encoding="utf-8",
    )
    return written


def main() -> int:
    args = _arguments()
    for port, variable in ((args.port, "PORT"), (args.upstream_port, "UPSTREAM_PORT")):
        if _busy(port):
            print(
                f"make run: port {port} is in use; choose another: make run {variable}=N "
                "(or set the environment variable)",
                file=sys.stderr,
            )
            return 1
    state_dir: Path = args.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    config = write_config(args.port, args.upstream_port, state_dir)
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
                demo_upstream_argv(args.upstream_port, state_dir / "demo-upstream.db"),
                log_path=state_dir / "demo-upstream.log",
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        proxy = children.enter_context(
            ManagedProcess(
                "fenceproxy",
                [
                    *(sys.executable, "-m", "proxy.cli", "serve"),
                    *("--config", str(config), "--port", str(args.port)),
                ],
                log_path=state_dir / "fenceproxy.log",
                env=proxy_env,
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        try:
            upstream.wait_http_ok(
                f"http://127.0.0.1:{args.upstream_port}/_demo/healthz", STARTUP_TIMEOUT_S
            )
            proxy.wait_http_ok(f"http://127.0.0.1:{args.port}/_fence/healthz", STARTUP_TIMEOUT_S)
            print(
                what_to_try(admin_token_hint, args.port, args.upstream_port, state_dir),
                flush=True,
            )
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
