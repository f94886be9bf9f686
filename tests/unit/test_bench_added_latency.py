"""`make bench` reports the p50 latency a fenced write adds to a 20 ms upstream: in the
latency round at concurrency 1, over the same request sent to the upstream directly,
for the plain proxy and for fenceproxy, and judges fenceproxy's against its target."""

from __future__ import annotations

from bench.report import (
    DIRECT_C1,
    FENCED_20MS,
    FENCED_C1,
    P50_ADDED_MS,
    PLAIN_20MS,
    PLAIN_C1,
    added_latency,
    json_figures,
    report_table,
    targets,
)
from bench.workload import Measurement

JUDGED = f"20 ms upstream, c=1: fenced p50 - direct p50 <= {P50_ADDED_MS:g} ms"


def _round(target: str, p50_ms: float, concurrency: int = 1) -> Measurement:
    return Measurement(target, concurrency, 10.0, 1000, 100.0, p50_ms, p50_ms + 5, 0, {})


def _latency_round(direct_ms: float, plain_ms: float, fenced_ms: float) -> list[Measurement]:
    return [_round(DIRECT_C1, direct_ms), _round(PLAIN_C1, plain_ms), _round(FENCED_C1, fenced_ms)]


def test_the_added_latency_is_over_the_upstream_asked_directly_not_over_its_nominal_20_ms() -> None:
    rounds = _latency_round(22.0, 22.5, 23.25)

    assert added_latency(rounds) == {
        "direct": 22.0,
        "fenced": 1.25,
        "plain": 0.5,
        "over_plain": 0.75,
    }
    assert any(
        "(22.00 ms, asked directly in turn): fenceproxy 1.25 ms, plain proxy 0.50 ms; "
        "fenced - plain 0.75 ms" in line
        for line in report_table(rounds)
    )
    assert [t for t in targets(rounds, None) if t[0] == JUDGED] == [(JUDGED, "1.25", True)]
    assert json_figures(2, 10, "", rounds, None)["p50_added_ms_at_20ms_upstream"] == {
        "direct": 22.0,
        "fenced": 1.25,
        "plain": 0.5,
        "over_plain": 0.75,
    }


def test_an_added_latency_above_the_target_is_not_met() -> None:
    rounds = _latency_round(22.0, 22.5, 22.0 + P50_ADDED_MS + 0.1)

    assert [met for name, _, met in targets(rounds, None) if name == JUDGED] == [False]


def test_the_rounds_at_concurrency_16_do_not_stand_for_the_latency_round() -> None:
    rounds = [_round(PLAIN_20MS, 20.5, 16), _round(FENCED_20MS, 21.0, 16)]

    assert added_latency(rounds) is None
    assert not any("added at concurrency 1" in line for line in report_table(rounds))
    assert not any(name == JUDGED for name, _, _ in targets(rounds, None))


def test_without_the_direct_figure_nothing_is_reported() -> None:
    rounds = [_round(PLAIN_C1, 22.5), _round(FENCED_C1, 23.0)]

    assert added_latency(rounds) is None
    assert not any("added at concurrency 1" in line for line in report_table(rounds))
