"""Prometheus metrics: counters kept in the process, gauges read from the store.

Gauges about effects in doubt come from the store at scrape time, not from counters
in memory: the store is the authority, and a replica or a restart must not skew them.
They read only the effects in doubt (a partial index), never the settled history,
so a scrape costs the same however large the store grows; settled effects are
counted as this process's receipts settle them (`fenceproxy_effects_settled_total`).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from core import telemetry
from core.leasing_advice import OTHER_GROUP, Ending, group_of
from core.lifecycle import BLOCKING, Record
from core.records import EffectState
from proxy import periodic
from store import CAME_BACK, Purged, Receipt, Store
from store.postgres import PostgresConnector

# The `record` label of fenceproxy_retention_deleted_total: a field of Purged each.
RETENTION_RECORDS = ("effects", "rejections", "leases", "resources")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A turn (grant to release) lasts from milliseconds to the longest leases allowed.
TURN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
# Lease groups past the routes' templates, by resource prefix (`job:*`): anyone may
# take a lease on any name, so past this many prefixes the rest are counted as "*".
MAX_PREFIX_LABELS = 20
LEASE_ENDINGS = (Ending.RELEASED, Ending.REVOKED, Ending.SUPERSEDED)
# The `how` label of fenceproxy_connections_shed_total (proxy/connections.py).
SHED_HOW = ("evicted", "unverified", "refused")


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
        self.policy = Gauge(
            "fenceproxy_policy_info",
            "1, labelled with the sha256 of the policy file this process serves (its "
            "bytes): replicas with different digests serve different policies",
            ["digest"],
            registry=self.registry,
        )
        self.reloads = Counter(
            "fenceproxy_policy_reloads",
            "Policy reloads (SIGHUP, POST /_fence/v1/admin/reload), by result: reloaded "
            "or refused (nothing changed)",
            ["result"],
            registry=self.registry,
        )
        for result in ("reloaded", "refused"):
            self.reloads.labels(result)
        self.background_failures = Counter(
            "fenceproxy_background_failures",
            "Rounds of a background loop (proxy/periodic.py) that failed unexpectedly",
            ["loop"],
            registry=self.registry,
        )
        for loop in periodic.LOOPS:
            self.background_failures.labels(loop)
        self.upstream_latency = Histogram(
            "fenceproxy_upstream_latency_seconds",
            "Time from sending a request upstream to its complete answer",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.effects = Gauge(
            "fenceproxy_effects",
            "Effects in doubt in the store, by state (DISPATCHING, UNKNOWN, CONFLICTING)",
            ["state"],
            registry=self.registry,
        )
        self.settled = Counter(
            "fenceproxy_effects_settled",
            "Effects this process's dispatch receipts settled, by the state they settled in",
            ["state"],
            registry=self.registry,
        )
        self.retention_deleted = Counter(
            "fenceproxy_retention_deleted",
            "Records the retention collector deleted (effects with their history, rejections,"
            " leases, resources)",
            ["record"],
            registry=self.registry,
        )
        for state in EffectState:
            if state not in BLOCKING:
                self.settled.labels(state.value)
        for record in RETENTION_RECORDS:
            self.retention_deleted.labels(record)
        self.blocked = Gauge(
            "fenceproxy_blocked_resources",
            "Resources with an UNKNOWN or CONFLICTING effect (waiting for reconciliation)",
            registry=self.registry,
        )
        self.turns = Histogram(
            "fenceproxy_lease_turn_seconds",
            "Grant to release of the leases their holders released, by resource group",
            ["group"],
            buckets=TURN_BUCKETS,
            registry=self.registry,
        )
        self.leases_ended = Counter(
            "fenceproxy_leases_ended",
            "Leases this process ended, by resource group and how (released, revoked, "
            "superseded: expired and taken over)",
            ["group", "how"],
            registry=self.registry,
        )
        self.false_expiries = Counter(
            "fenceproxy_lease_false_expiries",
            "Leases whose holder came back after they expired (measured false expiries)",
            ["group"],
            registry=self.registry,
        )
        # The fenced routes' resource templates as globs (`rule:*`), set by watch_leases.
        self.route_groups: tuple[str, ...] = ()
        self._prefix_groups: set[str] = set()
        self.oldest_in_doubt = Gauge(
            "fenceproxy_oldest_in_doubt_age_seconds",
            "Age of the oldest DISPATCHING, UNKNOWN or CONFLICTING effect (0 when none)",
            registry=self.registry,
        )
        # PostgreSQL's round trips (store/postgres.py RoundTrips), brought up to date
        # at each scrape: the bench divides them by the requests of a round.
        self.store_round_trips = Counter(
            "fenceproxy_store_round_trips",
            "Statements, BEGINs and COMMITs this process sent to PostgreSQL (0 on SQLite)",
            registry=self.registry,
        )
        self._round_trips_seen = 0
        self.writes_queued = Gauge(
            "fenceproxy_store_writes_queued",
            "Store writes waiting for a free write lane (group commit: they run together "
            "in the next batch)",
            registry=self.registry,
        )
        self.open_connections = Gauge(
            "fenceproxy_open_connections",
            "Client connections open on the proxy's listener (against limits.max_connections)",
            registry=self.registry,
        )
        self.connections_shed = Counter(
            "fenceproxy_connections_shed",
            "Client connections closed to stay within limits.max_connections, by how "
            "(evicted: the one waiting longest for a request head; unverified: the one "
            "waiting longest on a request with no verified credential; "
            "refused: a new one)",
            ["how"],
            registry=self.registry,
        )
        for how in SHED_HOW:
            self.connections_shed.labels(how)
        self.send_deadline_passed = Counter(
            "fenceproxy_send_deadline_passed",
            "Admitted fenced writes not sent because their send deadline had passed (the "
            "replica was slow between admission and send), by route",
            ["route"],
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
        # Counted once per request, as it ends: its span and log lines say the same.
        telemetry.about(outcome=outcome)
        self._child(self.requests, route, outcome).inc()

    def count_refusal(self, code: str) -> None:
        telemetry.about(refusal=code)
        self._child(self.refusals, code).inc()

    def count_send_deadline_passed(self, route: str) -> None:
        self._child(self.send_deadline_passed, route).inc()

    def count_probe(self, conclusion: str) -> None:
        self._child(self.probes, conclusion).inc()

    def serve_policy(self, digest: str | None) -> None:
        """The policy served from now on; a policy built in memory has no digest."""
        self.policy.clear()
        if digest is not None:
            self.policy.labels(digest).set(1)

    def count_reload(self, result: str) -> None:
        self.reloads.labels(result).inc()

    def count_background_failure(self, loop: str) -> None:
        self._child(self.background_failures, loop).inc()

    def count_receipt(self, receipt: Receipt) -> None:
        """Count the effect as settled if this receipt is what settled it (not a late
        receipt that found it settled already, nor one that left it in doubt)."""
        if receipt.transition.record is Record.SETTLED and receipt.effect.state not in BLOCKING:
            self._child(self.settled, receipt.effect.state.value).inc()

    def count_retention(self, purged: Purged) -> None:
        deleted = {
            "effects": purged.effects,
            "rejections": purged.rejections,
            "leases": purged.leases,
            "resources": purged.resources,
        }
        for record, n in deleted.items():
            self._child(self.retention_deleted, record).inc(n)

    def watch_leases(self, store: Store, route_groups: tuple[str, ...]) -> None:
        """Count how the store's leases end, grouped by the fenced routes' templates."""
        self.route_groups = route_groups
        for group in route_groups:
            self._child(self.false_expiries, group)
            for how in LEASE_ENDINGS:
                self._child(self.leases_ended, group, how)
        store.lease_observer = self.observe_lease

    def lease_group(self, resource: str) -> str:
        """A bounded label: a route template's glob, or one of the first prefixes seen."""
        group = group_of(resource, self.route_groups)
        if group in self.route_groups or group in self._prefix_groups:
            return group
        if len(self._prefix_groups) >= MAX_PREFIX_LABELS:
            return OTHER_GROUP
        self._prefix_groups.add(group)
        return group

    def observe_lease(self, resource: str, how: str, turn_s: float | None) -> None:
        group = self.lease_group(resource)
        if how == CAME_BACK:
            self._child(self.false_expiries, group).inc()
            return
        self._child(self.leases_ended, group, how).inc()
        if turn_s is not None:
            self._child(self.turns, group).observe(turn_s)

    def observe_upstream(self, route: str, seconds: float) -> None:
        self._child(self.upstream_latency, route).observe(seconds)

    async def render(self, store: Store) -> bytes:
        in_doubt, blocked, oldest_age = await store.counts()
        for state in EffectState:
            if state in BLOCKING:
                self.effects.labels(state.value).set(in_doubt.get(state.value, 0))
        self.blocked.set(blocked)
        self.oldest_in_doubt.set(oldest_age)
        self.writes_queued.set(store.connector.writes_queued)
        if isinstance(store.connector, PostgresConnector):
            sent = store.connector.round_trips.count
            self.store_round_trips.inc(sent - self._round_trips_seen)
            self._round_trips_seen = sent
        return generate_latest(self.registry)
