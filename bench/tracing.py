"""What tracing and JSON logs cost a fenced write: `python -m bench.tracing`.

One demo upstream and four `fenceproxy serve` processes on SQLite stores of their own,
differing only in `--tracing` and `--log-format`: `off` (the defaults), `json` (JSON log
lines: each request opens a scope), `otlp` (tracing on, every request sampled, its
spans exported with OTLP/HTTP to a receiver in this process, as a collector would take
them) and `otlp 1/10` (one request in ten sampled, by OTEL_TRACES_SAMPLER). The same
fenced POST load as `make bench` (bench/workload.py: a lease per worker, a fresh
Idempotency-Key per request) runs through each in turn, round after round, and the
proxy's CPU per request is read from /proc over each measured window: the figure that
holds still on a loaded machine where req/s does not. Printed: every round as it ends,
then per variant the medians of the rounds (JSON).

Beside them, `hooks_off_ns_per_write`: what the hooks a fenced write passes through
cost with both off (the default), timed in this process without any load: the four
`telemetry.about` calls and the three `telemetry.step` calls of one write. Below the
noise of any round, which is the point: off, tracing costs a fenced write nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import timeit
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from bench.cpu import CpuSnapshot
from bench.targets import STARTUP_TIMEOUT_S, fenceproxy_config, start_upstream
from bench.workload import Measurement, measure
from core import telemetry
from support.processes import ManagedProcess, free_port

# Each variant's `serve` options and environment.
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "off": ([], {}),
    "json": (["--log-format", "json"], {}),
    "otlp": (["--tracing", "otlp"], {}),
    "otlp 1/10": (
        ["--tracing", "otlp"],
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
    ),
}
PROXY = "fenceproxy"


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that reads each export and answers 200."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def otlp_receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def start_proxy(
    processes: ExitStack,
    workdir: Path,
    name: str,
    upstream_url: str,
    extra: list[str],
    env: dict[str, str],
) -> tuple[str, ManagedProcess]:
    port = free_port()
    config_path = workdir / f"{name}.yaml"
    store = f"sqlite:///{workdir / name}.db"
    config_path.write_text(
        yaml.safe_dump(fenceproxy_config(port, upstream_url, store), sort_keys=False)
    )
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config_path), *extra]
    process = processes.enter_context(
        ManagedProcess(name, argv, log_path=workdir / f"{name}.log", env=env)
    )
    process.wait_http_ok(f"{url}/_fence/healthz", STARTUP_TIMEOUT_S)
    return url, process


def cpu_ms_per_request(measurement: Measurement) -> float:
    assert measurement.cpu is not None
    return 10 * measurement.cpu.percent[PROXY] / measurement.req_per_s


async def run(
    args: argparse.Namespace, urls: dict[str, str], pids: dict[str, int]
) -> dict[str, list[Measurement]]:
    rounds: dict[str, list[Measurement]] = {variant: [] for variant in VARIANTS}
    for _ in range(args.rounds):
        for variant, url in urls.items():

            async def sample(pid: int = pids[variant]) -> CpuSnapshot:
                return CpuSnapshot.take({PROXY: [pid]})

            measured = await measure(
                variant, url, args.concurrency, args.warmup, args.duration, sample, fenced=True
            )
            if measured.errors:
                raise SystemExit(f"{variant}: {measured.errors} errors {measured.error_kinds}")
            rounds[variant].append(measured)
            print(
                f"{variant:>9}: {measured.req_per_s:7.0f} req/s, p50 {measured.p50_ms:.1f} ms, "
                f"p99 {measured.p99_ms:.1f} ms, "
                f"proxy CPU {cpu_ms_per_request(measured):.3f} ms/request",
                file=sys.stderr,
                flush=True,
            )
    return rounds


def summary(rounds: dict[str, list[Measurement]]) -> dict[str, Any]:
    return {
        variant: {
            "cpu_ms_per_request": round(statistics.median(map(cpu_ms_per_request, taken)), 3),
            "req_per_s": round(statistics.median(m.req_per_s for m in taken)),
            "p50_ms": round(statistics.median(m.p50_ms or 0.0 for m in taken), 1),
            "p99_ms": round(statistics.median(m.p99_ms or 0.0 for m in taken), 1),
            "rounds_cpu_ms_per_request": [round(cpu_ms_per_request(m), 3) for m in taken],
        }
        for variant, taken in rounds.items()
    }


# What one fenced write calls with tracing off: `about` for its route, its resource,
# its effect and epoch, and its outcome (proxy/metrics.py); `step` for its admission,
# its upstream call and its receipt.
ABOUT_PER_WRITE = 4
STEPS_PER_WRITE = 3


def hooks_off_ns_per_write(calls: int = 200_000) -> float:
    """Nanoseconds per fenced write spent in the telemetry hooks, tracing and JSON logs off."""
    telemetry.install(None, log_fields=False)
    work = object()

    def about() -> None:
        telemetry.about(effect_id="eff_0123456789abcdef", epoch=7)

    def step() -> None:
        telemetry.step("admission", work)  # type: ignore[arg-type]

    best: dict[str, float] = {}
    for name, call in (("about", about), ("step", step)):
        best[name] = min(timeit.repeat(call, number=calls, repeat=5)) / calls * 1e9
    return ABOUT_PER_WRITE * best["about"] + STEPS_PER_WRITE * best["step"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds a round")
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp, ExitStack() as processes:
        workdir = Path(tmp)
        receiver = processes.enter_context(otlp_receiver())
        upstream_url, _ = start_upstream(processes, workdir)
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver}
        urls: dict[str, str] = {}
        pids: dict[str, int] = {}
        for number, (variant, (extra, variables)) in enumerate(VARIANTS.items()):
            urls[variant], process = start_proxy(
                processes, workdir, f"fenceproxy-{number}", upstream_url, extra, env | variables
            )
            pids[variant] = process.pid
        rounds = asyncio.run(run(args, urls, pids))
    figures = summary(rounds)
    figures["hooks_off_ns_per_write"] = round(hooks_off_ns_per_write())
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
