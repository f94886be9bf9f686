"""Benchmark: a header flood without a credential against a real `fenceproxy serve`.

    python -m bench.header_flood [--fenceproxy PATH] [--connections 100] [--headers 250]
                                 [--reconnect-s 0] [--settle-s 5] [--json]

Starts `fenceproxy serve` (PATH: the command to run, by default the one installed
next to this Python; give another checkout's to compare) on a fresh SQLite store
with the default limits, as a deployment without a `limits:` block has them. Then
`--connections` connections each send a request line and `--headers` headers of
60 KiB with no blank line after them (the issue's attack: 100 x 250, about 1.5 GB).
Meanwhile a worker acquires a lease again and again, each on a new connection.
With `--reconnect-s N`, for N seconds every connection the proxy closes is replaced
by a new one that starts over (an attacker who does not give up).

Prints the proxy's resident set (VmRSS) before, at its peak during the attack and
`--settle-s` seconds after the attacking connections are gone, and the worker's
acquire latencies during the attack (each acquire waits at most 30 s).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

from support.header_flood import HeaderFlood, rss_kib
from support.processes import ManagedProcess, free_port

POLICY = """\
version: 1
listen: {{host: 127.0.0.1, port: {port}}}
store: sqlite:///{store}
upstreams:
  supplier: {{url: "http://127.0.0.1:{upstream_port}", timeout_s: 2}}
routes:
  - name: read-orders
    upstream: supplier
    match: {{methods: [GET], path: "/orders/{{rest:.*}}"}}
    fence: none
"""
ACQUIRE_TIMEOUT_S = 30.0
ATTACK_TIMEOUT_S = 300.0
SAMPLE_S = 0.02
DONE = -1.0  # the acquirer's last message


@dataclass
class Figures:
    fenceproxy: str
    connections: int
    headers: int
    reconnect_s: float
    connections_opened: int
    sent_mib: float
    attack_s: float
    rss_before_mib: float
    rss_peak_mib: float
    rss_after_mib: float
    proxy_cpu_s: float  # the proxy's user + system time from the attack's start to its end
    acquires_during: int = 0
    acquire_failures: int = 0
    acquire_latencies_ms: list[float] = field(default_factory=list)


def cpu_seconds(pid: int) -> float:
    """User and system time the process used so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def acquire_ms(port: int, number: int) -> float | None:
    """One acquire on a new connection: its latency, or None if it failed or timed out."""
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=ACQUIRE_TIMEOUT_S)
    try:
        body = json.dumps({"resource": f"bench:{number}", "holder": "worker", "ttl_s": 5})
        connection.request("POST", "/_fence/v1/leases", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        if response.status != 201:
            return None
    except OSError:
        return None
    finally:
        connection.close()
    return (time.monotonic() - started) * 1000


def acquire_loop(port: int, stop: EventType, measured: multiprocessing.Queue[float | None]) -> None:
    number = 0
    while not stop.is_set():
        measured.put(acquire_ms(port, number))
        number += 1
    measured.put(DONE)


def drain(
    measured: multiprocessing.Queue[float | None], acquirer: BaseProcess
) -> list[float | None]:
    """The acquirer's latencies, up to its DONE mark; then it is joined."""
    latencies: list[float | None] = []
    while (latency := measured.get(timeout=ACQUIRE_TIMEOUT_S + 5)) != DONE:
        latencies.append(latency)
    acquirer.join(timeout=5)
    return latencies


def run(
    fenceproxy: str, connections: int, headers: int, reconnect_s: float, settle_s: float
) -> Figures:
    with tempfile.TemporaryDirectory(prefix="header-flood-") as scratch:
        port = free_port()
        policy = Path(scratch) / "policy.yaml"
        policy.write_text(
            POLICY.format(port=port, store=Path(scratch) / "store.db", upstream_port=free_port())
        )
        argv = [fenceproxy, "serve", "--config", str(policy), "--new-store"]
        with ManagedProcess(
            "fenceproxy", argv, log_path=Path(scratch) / "proxy.log", start_new_session=True
        ) as proxy:
            proxy.wait_http_ok(f"http://127.0.0.1:{port}/_fence/healthz", 20.0)
            for number in range(5):  # warm: the first requests build caches
                acquire_ms(port, -1 - number)
            before = rss_kib(proxy.pid)
            flood = HeaderFlood("127.0.0.1", port, connections, headers, reconnect_s)
            # The worker is a process of its own: a thread here would wait for the
            # flood's thread to let go of the GIL, and measure that instead.
            spawn = multiprocessing.get_context("spawn")
            stop_acquiring = spawn.Event()
            measured: multiprocessing.Queue[float | None] = spawn.Queue()
            acquirer = spawn.Process(target=acquire_loop, args=(port, stop_acquiring, measured))
            acquirer.start()
            # Running and warm before the attack starts (the answer is not counted).
            measured.get(timeout=ACQUIRE_TIMEOUT_S + 5)
            cpu_before = cpu_seconds(proxy.pid)
            started = time.monotonic()
            flood.start()
            peak = before
            while not flood.done() and time.monotonic() - started < ATTACK_TIMEOUT_S:
                peak = max(peak, rss_kib(proxy.pid))
                time.sleep(SAMPLE_S)
            # The attack is complete; the worker gets one more try while it stands.
            last_try = acquire_ms(port, 10**6)
            attack_s = time.monotonic() - started
            cpu_during = cpu_seconds(proxy.pid) - cpu_before
            stop_acquiring.set()
            latencies = [*drain(measured, acquirer), last_try]
            peak = max(peak, rss_kib(proxy.pid))
            result = flood.stop()
            settled_at = time.monotonic() + settle_s
            while time.monotonic() < settled_at:
                peak = max(peak, rss_kib(proxy.pid))
                time.sleep(SAMPLE_S)
            after = rss_kib(proxy.pid)
            proxy.terminate()
    answered = [latency for latency in latencies if latency is not None]
    return Figures(
        fenceproxy=fenceproxy,
        connections=connections,
        headers=headers,
        reconnect_s=reconnect_s,
        connections_opened=result.connections,
        sent_mib=round(result.bytes_sent / 2**20, 1),
        attack_s=round(attack_s, 2),
        rss_before_mib=round(before / 1024, 1),
        rss_peak_mib=round(peak / 1024, 1),
        rss_after_mib=round(after / 1024, 1),
        proxy_cpu_s=round(cpu_during, 2),
        acquires_during=len(latencies),
        acquire_failures=len(latencies) - len(answered),
        acquire_latencies_ms=[round(latency, 1) for latency in answered],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fenceproxy", default=str(Path(sys.executable).with_name("fenceproxy")))
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--headers", type=int, default=250)
    parser.add_argument("--reconnect-s", type=float, default=0.0)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = run(args.fenceproxy, args.connections, args.headers, args.reconnect_s, args.settle_s)
    if args.json:
        print(json.dumps(asdict(figures), indent=2))
        return
    latencies = figures.acquire_latencies_ms
    print(f"fenceproxy: {figures.fenceproxy}")
    print(
        f"attack: {figures.connections} connections x {figures.headers} headers of 60 KiB, "
        f"{figures.sent_mib} MiB sent in {figures.attack_s} s "
        f"over {figures.connections_opened} connections; the proxy used "
        f"{figures.proxy_cpu_s} s of CPU meanwhile"
    )
    print(
        f"RSS: before {figures.rss_before_mib} MiB, peak {figures.rss_peak_mib} MiB "
        f"(+{figures.rss_peak_mib - figures.rss_before_mib:.1f}), "
        f"{figures.rss_after_mib} MiB {args.settle_s:g} s after"
    )
    if latencies:
        print(
            f"acquires during the attack: {len(latencies)} answered, "
            f"{figures.acquire_failures} failed; median {statistics.median(latencies):.1f} ms, "
            f"max {max(latencies):.1f} ms"
        )
    else:
        print(f"acquires during the attack: none answered ({figures.acquire_failures} failed)")


if __name__ == "__main__":
    main()
