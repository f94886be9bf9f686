"""`make bench`'s latency round against the real processes it measures: one worker
sends the same request, in turn, to the upstream directly, through the plain proxy and
through fenceproxy (`bench.workload.measure_alternately`), so each target's p50 is
taken under the same load and a proxy's added latency is its p50 less the direct one."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path

from bench.report import DIRECT_C1, FENCED_C1, PLAIN_C1, added_latency
from bench.run import UPSTREAM_DELAY
from bench.targets import FENCED, PLAIN, TARGETS, start_targets
from bench.workload import LatencyTarget, measure_alternately


def test_the_three_targets_take_turns_and_every_fenced_request_is_admitted(
    tmp_path: Path,
) -> None:
    with ExitStack() as processes:
        running = start_targets(processes, tmp_path, list(TARGETS), "FULL")
        measured = asyncio.run(
            measure_alternately(
                [
                    LatencyTarget(DIRECT_C1, running.upstream_url, fenced=False),
                    LatencyTarget(PLAIN_C1, running.base_urls[PLAIN], fenced=False),
                    LatencyTarget(FENCED_C1, running.base_urls[FENCED], fenced=True),
                ],
                warmup_s=0.3,
                duration_s=1.5,
                extra_headers=UPSTREAM_DELAY,
            )
        )

    assert [m.target for m in measured] == [DIRECT_C1, PLAIN_C1, FENCED_C1]
    assert all(m.concurrency == 1 for m in measured)
    # A fenced request without its lease's token or a fresh key would be refused (4xx):
    # an error, not a request.
    assert [m.errors for m in measured] == [0, 0, 0]
    # One at a time, in turn: the window's start and its end each cut a turn short, so
    # a target is at most two requests ahead of another.
    counts = [m.requests for m in measured]
    assert min(counts) >= 5 and max(counts) - min(counts) <= 2
    # The upstream's delay is in every figure, the direct one included.
    assert all(m.p50_ms is not None and m.p50_ms >= 20 for m in measured)
    added = added_latency(measured)
    assert added is not None and added["direct"] == measured[0].p50_ms
