"""Prometheus metrics: counters kept in the process, gauges read from the store.

Gauges about effects come from the store at scrape time, not from counters in
memory: the store is the authority, and a replica or a restart must not skew them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from core.records import EffectState
from store import Store

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "fenceproxy_requests",
            "Requests on routes, by route and outcome",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "fenceproxy_refusals", "Refused requests by code", ["code"], registry=self.registry
        )
        self.probes = Counter(
            "fenceproxy_probe_attempts",
            "Probe attempts by conclusion",
            ["conclusion"],
            registry=self.registry,
        )
        self.background_failures = Counter(
            "fenceproxy_background_failures",
            "Rounds of a background loop (reconciler, collector) that failed unexpectedly",
            ["loop"],
            registry=self.registry,
        )
        self.upstream_latency = Histogram(
            "fenceproxy_upstream_latency_seconds",
            "Time from sending a request upstream to its complete answer",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.effects = Gauge(
            "fenceproxy_effects", "Effects in the store by state", ["state"], registry=self.registry
        )
        self.blocked = Gauge(
            "fenceproxy_blocked_resources",
            "Resources with an UNKNOWN or CONFLICTING effect (waiting for reconciliation)",
            registry=self.registry,
        )
        self.oldest_in_doubt = Gauge(
            "fenceproxy_oldest_in_doubt_age_seconds",
            "Age of the oldest DISPATCHING, UNKNOWN or CONFLICTING effect (0 when none)",
            registry=self.registry,
        )

        # prometheus-client's labels() takes a lock and builds a key on every call;
        # the label sets are few (routes x outcomes, codes), so keep the children.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _child(self, metric: Counter | Histogram, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count_request(self, route: str, outcome: str) -> None:
        self._child(self.requests, route, outcome).inc()

    def count_refusal(self, code: str) -> None:
        self._child(self.refusals, code).inc()

    def count_probe(self, conclusion: str) -> None:
        self._child(self.probes, conclusion).inc()

    def count_background_failure(self, loop: str) -> None:
        self._child(self.background_failures, loop).inc()

    def observe_upstream(self, route: str, seconds: float) -> None:
        self._child(self.upstream_latency, route).observe(seconds)

    async def render(self, store: Store) -> bytes:
        by_state, blocked, oldest_age = await store.counts()
        for state in EffectState:
            self.effects.labels(state.value).set(by_state.get(state.value, 0))
        self.blocked.set(blocked)
        self.oldest_in_doubt.set(oldest_age)
        return generate_latest(self.registry)
