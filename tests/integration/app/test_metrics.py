"""Health versus progress: /_fence/healthz, /_fence/readyz and Prometheus metrics.

The metrics are parsed with prometheus_client's own parser, and every value is the
one the test's traffic implies (a commit, refusals, two UNKNOWNs, probes).
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from store import StoreUnavailable
from tests.integration.app.conftest import (
    PROBE_BY_KEY,
    Fence,
    FenceFactory,
    Json,
    assert_problem,
    json_body,
    poll_until,
)

ROUTE = "place-order"
Labels = frozenset[tuple[str, str]]


def labels(**pairs: str) -> Labels:
    return frozenset(pairs.items())


async def scrape(fence: Fence) -> dict[str, dict[Labels, float]]:
    """Sample name → {label set → value}, from the Prometheus text the proxy serves."""
    response = await fence.client.get("/_fence/metrics")  # no admin token needed
    text = await response.text()
    assert response.status == 200, text
    assert response.content_type == "text/plain"
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


async def effect_when(fence: Fence, effect_id: str, what: str, state: str | None = None) -> Json:
    """The effect once it has a probe event (and, if given, is in `state`)."""
    seen: list[Json] = []

    async def ready() -> bool:
        seen[:] = [await fence.effect(effect_id)]
        effect = seen[0]
        has_probe = any(event["kind"] == "probe" for event in effect["events"])
        return has_probe and (state is None or effect["state"] == state)

    await poll_until(ready, f"{effect_id}: {what}")
    return seen[0]


async def test_metrics_report_the_traffic(make_fence: FenceFactory) -> None:
    fence = await make_fence(reconcile=PROBE_BY_KEY)
    widget = await fence.acquire("supplier:widget", "worker-a", ttl_s=30)
    gadget = await fence.acquire("supplier:gadget", "worker-a", ttl_s=30)
    gizmo = await fence.acquire("supplier:gizmo", "worker-a", ttl_s=30)

    # A commit, then refusals: one in the admission decision, one before it.
    committed = await fence.order("widget", widget["token"], "k-1", {"qty": 1})
    assert committed.status == 201
    reused = await fence.order("widget", widget["token"], "k-1", {"qty": 9})
    await assert_problem(reused, 422, "idempotency_key_reused")
    await assert_problem(await fence.order("widget", None, "k-2"), 401, "missing_token")

    # An UNKNOWN that nothing upstream committed: probes stay inconclusive until settle_s.
    failed = await fence.order("gadget", gadget["token"], "g-1", headers={"Demo-Status": "503"})
    stuck = (await assert_problem(failed, 504, "outcome_unknown"))["effect_id"]
    blocked = await fence.order("gadget", gadget["token"], "g-2")
    await assert_problem(blocked, 423, "resource_blocked")
    # An UNKNOWN whose write did happen: the background probe settles it committed.
    lost = await fence.order("gizmo", gizmo["token"], "z-1", headers={"Demo-Drop-Response": "1"})
    found = (await assert_problem(lost, 504, "outcome_unknown"))["effect_id"]
    await effect_when(fence, found, "settled committed", "COMMITTED")
    await effect_when(fence, stuck, "a first probe")
    admin_probe = await fence.client.post(f"/_fence/v1/effects/{stuck}/probe", headers=fence.admin)
    assert (await json_body(admin_probe))["conclusion"] == "inconclusive"

    # 1.5 s after the stuck effect's dispatch, by the store's clock: still inside the
    # settle window, so no further probe. (On SQLite the clock has not moved since the
    # dispatch; PostgreSQL's has flowed on meanwhile.)
    dispatched_at = (await fence.effect(stuck))["created_at"]
    fence.clock.advance(1.5 - (await fence.store.now() - dispatched_at))
    metrics = await scrape(fence)

    assert metrics["fenceproxy_requests_total"] == {
        labels(route=ROUTE, outcome="committed"): 1,
        labels(route=ROUTE, outcome="refused"): 2,
        labels(route=ROUTE, outcome="unknown"): 2,
    }
    assert metrics["fenceproxy_refusals_total"] == {
        labels(code="idempotency_key_reused"): 1,
        labels(code="missing_token"): 1,
        labels(code="resource_blocked"): 1,
    }
    # The gauge reads only the effects in doubt from the store; settled ones are counted
    # as this process's receipts settle them (the probe's settlement is a probe attempt).
    assert metrics["fenceproxy_effects"] == {
        labels(state="DISPATCHING"): 0,
        labels(state="UNKNOWN"): 1,
        labels(state="CONFLICTING"): 0,
    }
    assert metrics["fenceproxy_effects_settled_total"] == {
        labels(state="COMMITTED"): 1,
        labels(state="NOT_COMMITTED"): 0,
        labels(state="NOT_SENT"): 0,
    }
    assert metrics["fenceproxy_blocked_resources"] == {labels(): 1}
    assert metrics["fenceproxy_oldest_in_doubt_age_seconds"][labels()] == fence.clock.approx(1.5)
    assert metrics["fenceproxy_probe_attempts_total"] == {
        labels(conclusion="committed"): 1,
        labels(conclusion="inconclusive"): 2,
    }
    # Three requests reached the upstream: the commit and the two UNKNOWNs.
    latency = labels(route=ROUTE)
    assert metrics["fenceproxy_upstream_latency_seconds_count"] == {latency: 3}
    assert metrics["fenceproxy_upstream_latency_seconds_sum"][latency] > 0
    buckets = metrics["fenceproxy_upstream_latency_seconds_bucket"]
    assert buckets[labels(route=ROUTE, le="+Inf")] == 3
    counts = [value for key, value in buckets.items() if dict(key)["route"] == ROUTE]
    assert len(counts) > 2
    assert counts == sorted(counts)  # cumulative


async def test_metrics_read_effects_from_the_store_after_a_restart(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence()
    lease = await fence.acquire("supplier:widget", "worker-a", ttl_s=30)
    failed = await fence.order("widget", lease["token"], "k-1", headers={"Demo-Status": "503"})
    await assert_problem(failed, 504, "outcome_unknown")

    restarted = await fence.restart()
    metrics = await scrape(restarted)

    # What is in doubt is the store's to say, not a counter in the old process's memory.
    assert metrics["fenceproxy_effects"][labels(state="UNKNOWN")] == 1
    assert metrics["fenceproxy_blocked_resources"] == {labels(): 1}


async def test_no_in_doubt_effect_means_zero_age_and_nothing_blocked(fence: Fence) -> None:
    metrics = await scrape(fence)
    assert metrics["fenceproxy_blocked_resources"] == {labels(): 0}
    assert metrics["fenceproxy_oldest_in_doubt_age_seconds"] == {labels(): 0}
    assert set(metrics["fenceproxy_effects"].values()) == {0}
    assert set(metrics["fenceproxy_effects_settled_total"].values()) == {0}
    assert metrics["fenceproxy_retention_deleted_total"] == {
        labels(record="effects"): 0,
        labels(record="rejections"): 0,
        labels(record="leases"): 0,
        labels(record="resources"): 0,
    }


async def test_settled_effects_are_counted_by_the_receipt_that_settled_them(
    fence: Fence,
) -> None:
    lease = await fence.acquire("supplier:widget", "worker-a", ttl_s=30)
    assert (await fence.order("widget", lease["token"], "k-1")).status == 201
    replay = await fence.order("widget", lease["token"], "k-1")
    assert replay.headers["Idempotent-Replayed"] == "true"
    rejected = await fence.order("widget", lease["token"], "k-2", headers={"Demo-Status": "409"})
    assert rejected.status == 409

    metrics = await scrape(fence)

    # A replay settles nothing; nothing settled stays in the store-read gauge.
    assert metrics["fenceproxy_effects_settled_total"] == {
        labels(state="COMMITTED"): 1,
        labels(state="NOT_COMMITTED"): 1,
        labels(state="NOT_SENT"): 0,
    }
    assert set(metrics["fenceproxy_effects"]) == {
        labels(state="DISPATCHING"),
        labels(state="UNKNOWN"),
        labels(state="CONFLICTING"),
    }


async def test_healthz_and_readyz_answer(fence: Fence) -> None:
    for path in ("/_fence/healthz", "/_fence/readyz"):
        response = await fence.client.get(path)
        body = await json_body(response)
        assert response.status == 200, (path, body)
        assert body["status"] in ("ok", "ready")


async def test_a_store_that_does_not_answer_is_counted_as_a_refusal(
    fence: Fence, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What an operator alerts on (examples/deploy/prometheus/alerts.yaml): workers told
    # 503 store_unavailable show in the metrics, not only in /readyz.
    async def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the database is read-only")

    monkeypatch.setattr(fence.store, "acquire", unavailable)
    answer = await fence.acquire_response("supplier:widget", "worker-a", ttl_s=30)
    await assert_problem(answer, 503, "store_unavailable")
    monkeypatch.undo()
    metrics = await scrape(fence)
    assert metrics["fenceproxy_refusals_total"][labels(code="store_unavailable")] == 1
