"""Where the fenced path's CPU goes against the plain proxy's, per request, on SQLite.

    .venv/bin/python -m bench.fenced_profile [--duration 20] [--concurrency 64] [--rate 1000]

Starts `make bench`'s processes (the demo upstream, the plain proxy, fenceproxy on a
SQLite store), and loads each proxy in turn (plain, then fenced) while `py-spy record
--gil` samples it (the thread holding the GIL: the process's Python, on the event loop
and the SQLite thread) and /proc counts its CPU. Each group's samples are scaled so
that the groups add up to the process's CPU per request over the same window, and
printed side by side in µs per request. py-spy must be on PATH or in the virtualenv
(`pip install py-spy`); it needs the right to read the process (root, or
ptrace_scope 0). The raw samples are kept with --keep DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.targets import FENCED, PLAIN, start_targets
from bench.workload import measure

# The first that matches a sample's innermost Python frame (its file) names its group.
GROUPS = (
    (
        r"__init__ \(<string>|^replace \(dataclasses",
        "records built (dataclass __init__, replace)",
    ),
    (r"\(aiohttp/(client|connector)", "aiohttp client: the upstream request and answer"),
    (r"\(aiohttp/", "aiohttp server: parsing, routing, the response"),
    (r"\((asyncio/|selectors\.py|_weakrefset)", "asyncio: loop, handles, tasks, futures, select"),
    (r"\((store/sqlite|aiosqlite/)", "SQLite connector: statements, thread hand-over"),
    (r"\(store/", "store: admission and receipt operations"),
    (r"\(proxy/forwarding", "proxy/forwarding.py: headers both ways, URL, dispatch"),
    (r"\(proxy/fenced", "proxy/fenced.py: handler, dispatch, answer"),
    (
        r"\((proxy/(requests|connections|tokens)|core/request_heads|secrets)",
        "checks: headers, body, fingerprint, head counter, guard, token",
    ),
    (r"\((prometheus_client|proxy/metrics|core/telemetry|enum)", "metrics and telemetry"),
    (
        r"\((proxy/(app|auth|runtime)|policies/|aiosignal)",
        "middlewares, route match, template, credentials",
    ),
    (r"\((core/|json/)", "lifecycle plan, outcomes, JSON of the kept answer"),
    (r"\(bench/plain_proxy", "the plain proxy's handler"),
)
_FILE = re.compile(r"\(([^)]*\.py)")


def group(stack: list[str]) -> str:
    innermost = next((frame for frame in reversed(stack) if _FILE.search(frame)), "")
    for pattern, name in GROUPS:
        if re.search(pattern, stack[-1]) or re.search(pattern, innermost):
            return name
    return "other"


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile(
    pid: int, url: str, fenced: bool, args: argparse.Namespace, out: Path
) -> dict[str, float]:
    """µs of CPU per request, by group, over `args.duration` seconds of load."""
    target = FENCED if fenced else PLAIN
    asyncio.run(measure(target, url, args.concurrency, 1, 3, fenced=fenced))  # warm-up
    spy = subprocess.Popen(
        [
            args.py_spy,
            "record",
            "--gil",
            "-r",
            str(args.rate),
            "-p",
            str(pid),
            "-f",
            "raw",
            "-o",
            str(out),
            "-d",
            str(int(args.duration) + 3),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    before, started = cpu_s(pid), time.monotonic()
    measured = asyncio.run(
        measure(target, url, args.concurrency, 0.5, args.duration, fenced=fenced)
    )
    used, took = cpu_s(pid) - before, time.monotonic() - started
    spy.wait()
    requests = measured.req_per_s * took
    counts: collections.Counter[str] = collections.Counter()
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            counts[group(stack.split(";"))] += int(n)
    samples = sum(counts.values())
    per_request_us = used / requests * 1e6
    shares = {name: n / samples * per_request_us for name, n in counts.items()}
    shares["total"] = per_request_us
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fenced_profile", description=__doc__)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples a second")
    parser.add_argument("--keep", type=Path, help="a directory for py-spy's raw samples")
    parser.add_argument(
        "--py-spy",
        default=shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
    )
    args = parser.parse_args()
    with ExitStack() as processes, tempfile.TemporaryDirectory() as workdir:
        keep = args.keep or Path(workdir)
        keep.mkdir(parents=True, exist_ok=True)
        running = start_targets(processes, Path(workdir), [PLAIN, FENCED], "FULL")
        pids = {process.name: process.pid for process in running.processes}
        plain = profile(
            pids["plain-proxy"], running.base_urls[PLAIN], False, args, keep / "plain.txt"
        )
        fenced = profile(
            pids["fenceproxy"], running.base_urls[FENCED], True, args, keep / "fenced.txt"
        )
    print(f"µs of CPU per request at c={args.concurrency}, {args.duration:g} s each")
    print("| where | fenced | plain | fenced - plain |")
    print("|---|---|---|---|")
    names = sorted(set(fenced) | set(plain), key=lambda n: plain.get(n, 0) - fenced.get(n, 0))
    for name in [n for n in names if n != "total"] + ["total"]:
        f, p = fenced.get(name, 0.0), plain.get(name, 0.0)
        print(f"| {name} | {f:.0f} | {p:.0f} | {f - p:+.0f} |")


if __name__ == "__main__":
    main()
