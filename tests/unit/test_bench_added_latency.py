"""`make bench` reports the p50 latency a fenced write adds to a 20 ms upstream: over
the upstream's own 20 ms, and over the plain proxy's, and judges the first against
its target."""

from __future__ import annotations

from bench.report import (
    FENCED_20MS,
    P50_ADDED_MS,
    PLAIN_20MS,
    added_latency,
    report_table,
    targets,
)
from bench.workload import Measurement


def _round(target: str, p50_ms: float) -> Measurement:
    return Measurement(target, 16, 10.0, 1000, 100.0, p50_ms, p50_ms + 5, 0, {})


def test_the_added_latency_is_over_the_upstreams_20_ms_and_over_the_plain_proxy() -> None:
    rounds = [_round(PLAIN_20MS, 20.5), _round(FENCED_20MS, 21.25)]

    assert added_latency(rounds) == {"fenced": 1.25, "plain": 0.5, "over_plain": 0.75}
    assert any("fenceproxy 1.25 ms, plain proxy 0.50 ms" in line for line in report_table(rounds))
    judged = [t for t in targets(rounds, None) if "fenced p50 - 20 ms" in t[0]]
    assert judged == [
        (f"20 ms upstream, c=16: fenced p50 - 20 ms <= {P50_ADDED_MS:g} ms", "1.2", True)
    ]


def test_an_added_latency_above_the_target_is_not_met() -> None:
    rounds = [_round(PLAIN_20MS, 20.5), _round(FENCED_20MS, 20.0 + P50_ADDED_MS + 0.1)]

    assert [met for name, _, met in targets(rounds, None) if "fenced p50 - 20 ms" in name] == [
        False
    ]


def test_without_both_20_ms_rounds_nothing_is_reported() -> None:
    rounds = [_round(FENCED_20MS, 21.0)]

    assert added_latency(rounds) is None
    assert not any("added to the upstream" in line for line in report_table(rounds))
