"""`make bench` judges the SQLite targets: fenced/plain req/s and fenceproxy's CPU per
fenced request, each at concurrency 16 and 64, the median of the rounds."""

from __future__ import annotations

from bench.cpu import CpuUsage
from bench.report import FENCED_OVER_PLAIN_GOAL, SQLITE_PROXY_CPU_GOAL_MS, targets
from bench.targets import FENCED, PLAIN
from bench.workload import Measurement


def _round(target: str, concurrency: int, req_per_s: float, proxy_percent: float) -> Measurement:
    cpu = CpuUsage(10.0, {"fenceproxy": proxy_percent}, 100.0, 2)
    return Measurement(
        target, concurrency, 10.0, int(req_per_s * 10), req_per_s, 5.0, 9.0, 0, {}, cpu=cpu
    )


def _judged(measurements: list[Measurement]) -> dict[str, tuple[str, bool]]:
    return {name: (measured, met) for name, measured, met in targets(measurements, None)}


def test_the_proxy_cpu_per_fenced_request_is_judged_at_each_concurrency() -> None:
    # 1000 req/s at 70 % of a core: 0.70 ms per request; at 80 %: 0.80 ms.
    rounds = [_round(FENCED, 16, 1000.0, 70.0), _round(FENCED, 64, 1000.0, 80.0)]

    judged = _judged(rounds)

    name = f"SQLite fenceproxy CPU ms per fenced request <= {SQLITE_PROXY_CPU_GOAL_MS:g}"
    assert judged[f"{name} at concurrency 16"] == ("0.70", True)
    assert judged[f"{name} at concurrency 64"] == ("0.80", False)


def test_fenced_over_plain_is_judged_against_half_of_plain() -> None:
    rounds = [
        _round(PLAIN, 16, 2000.0, 40.0),
        _round(FENCED, 16, 1000.0, 60.0),
        _round(PLAIN, 64, 2000.0, 40.0),
        _round(FENCED, 64, 980.0, 60.0),
    ]

    judged = _judged(rounds)

    assert FENCED_OVER_PLAIN_GOAL == 0.5
    assert judged["SQLite fenced/plain >= 0.5 at concurrency 16"] == ("0.50", True)
    assert judged["SQLite fenced/plain >= 0.5 at concurrency 64"] == ("0.49", False)
