"""µs per request head of the connection guard's head counter (core/request_heads.py).

Feeds `HeadCounter.feed` a fenced write of the benchmark (bench/workload.py: aiohttp's
head, with its JSON body, as the proxy's connection receives it) over and over, and
prints the median µs of CPU per head of the rounds. With `--against FILE`, a request_heads.py
of another checkout is timed too, round by round in turn with this one's, so that both
see the same load:

    git show main:core/request_heads.py > /tmp/request_heads_main.py
    .venv/bin/python -m bench.head_counter --against /tmp/request_heads_main.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import timeit
from pathlib import Path
from types import ModuleType

from core import request_heads
from proxy.connections import HEAD_LIMITS

BODY = b'{"sku": "widget-7", "quantity": 3}'
# What aiohttp's client sends for bench/workload.py's fenced write.
HEAD = (
    b"POST /orders/place HTTP/1.1\r\n"
    b"Host: 127.0.0.1:18080\r\n"
    b"Content-Type: application/json\r\n"
    b"Fence-Token: fpt_1_6Qm3d0k9ZyZ0o4c1b8vQ2w7uXq5rT3sJ9pL0aN4eH2g\r\n"
    b"Idempotency-Key: 9f86d081884c4d14a5f1e2b3c7d8e9fa\r\n"
    b"Accept: */*\r\n"
    b"Accept-Encoding: gzip, deflate\r\n"
    b"User-Agent: Python/3.12 aiohttp/3.11.11\r\n"
    b"Content-Length: %d\r\n"
    b"\r\n" % len(BODY)
)
REQUEST = HEAD + BODY


def load(path: Path) -> ModuleType:
    name = f"request_heads_from_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def us_per_head(module: ModuleType, heads: int) -> float:
    counter = module.HeadCounter(HEAD_LIMITS)
    feed = counter.feed
    # The thread's CPU time, not the wall clock: on a loaded machine, other processes'
    # turns on the cores would count.
    seconds = timeit.timeit(lambda: feed(REQUEST), timer=time.thread_time, number=heads)
    assert counter.refusal is None and counter.heads_completed == heads
    return seconds / heads * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout's request_heads.py")
    parser.add_argument("--heads", type=int, default=50_000, help="heads per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    versions = {"this checkout": request_heads}
    if args.against is not None:
        versions[str(args.against)] = load(args.against)
    times: dict[str, list[float]] = {name: [] for name in versions}
    for _ in range(args.rounds):
        for name, module in versions.items():
            times[name].append(us_per_head(module, args.heads))
    print(f"{len(REQUEST)} bytes per request ({len(HEAD)} of head), {args.heads} heads a round")
    for name, rounds in times.items():
        spread = ", ".join(f"{t:.2f}" for t in rounds)
        print(f"{name}: median {statistics.median(rounds):.2f} µs per head ({spread})")


if __name__ == "__main__":
    main()
