"""Probing the upstream for effects whose outcome is unknown, and for idempotency keys a
store that lost history (a failover's recovery window) does not know.

The I/O shell around `core.probing`: render the route's probe request,
send it, let `judge_probe` say what the answer proves, and record it. The
background loop never touches the admission path: it claims due effects in
the store (so one prober works on an effect at a time, across replicas), and
the schedule lives in the store, so probing resumes after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from yarl import URL

from core import telemetry
from core.lifecycle import Event
from core.probing import Conclusion, judge_probe, next_probe_at
from core.records import EffectRecord, fence_headers
from core.send_deadline import sent_by
from policies import Policy, Route
from policies.tls import upstream_context
from store import Store

log = logging.getLogger("fenceproxy.reconcile")

POLL_INTERVAL_S = 0.2
CLAIM_BATCH = 16
SWEEP_INTERVAL_S = 1.0
# How often an instance writes its row in `replicas` (the status page's service panel):
# one small write every few seconds per replica, whatever the traffic.
REPLICA_BEAT_INTERVAL_S = 5.0


@dataclass(frozen=True)
class ProbeResult:
    effect: EffectRecord | None
    conclusion: str
    detail: str


def probe_path(route: Route, path: str, key: str | None) -> str:
    """The probe request's path, from a request's own path parameters and key."""
    assert route.reconcile is not None
    values = dict(route.path.match(path) or {})
    values["idempotency_key"] = key or ""
    return route.reconcile.probe.path.render(values, url_quote=True)


async def ask_upstream(
    session: aiohttp.ClientSession, route: Route, effect: EffectRecord
) -> tuple[int | None, str | None]:
    """(status, None) if the upstream answered, (None, why) if it did not."""
    headers = fence_headers(effect.resource, effect_id=effect.id)
    return await ask_upstream_about(
        session, route, probe_path(route, effect.path, effect.idempotency_key), headers
    )


async def ask_upstream_about(
    session: aiohttp.ClientSession, route: Route, path: str, headers: dict[str, str]
) -> tuple[int | None, str | None]:
    """The probe of `route` at `path` (from `probe_path`): (status, None) if the upstream
    answered, (None, why) if it did not."""
    assert route.reconcile is not None
    upstream = route.upstream
    # Encoded as rendered (every value quoted): a plain string would let the client
    # resolve dot segments and re-quote, and the upstream see another path.
    url = URL(upstream.url + path, encoded=True)
    # A copy: the step gives it the upstream call's `traceparent`.
    sent = dict(headers)
    return await telemetry.step("upstream", _ask(session, route, url, sent), sent, _described)


async def _ask(
    session: aiohttp.ClientSession, route: Route, url: URL, headers: dict[str, str]
) -> tuple[int | None, str | None]:
    assert route.reconcile is not None
    upstream = route.upstream
    timeout = aiohttp.ClientTimeout(total=upstream.timeout_s, connect=upstream.connect_timeout_s)
    try:
        async with session.request(
            route.reconcile.probe.method,
            url,
            headers=headers,
            timeout=timeout,
            allow_redirects=False,
            # The session is shared by every upstream: each is verified with its own CAs.
            ssl=upstream_context(upstream),
        ) as response:
            await response.read()
            return response.status, None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _described(asked: tuple[int | None, str | None]) -> dict[str, telemetry.Value]:
    """The upstream step's attributes: the answer's status, or why there was none."""
    status, error = asked
    if status is None:
        return {"error": error or "no answer"}
    return {"http.response.status_code": status}


@dataclass(frozen=True)
class KeyProbe:
    """What the probe says of an idempotency key the store does not know."""

    conclusion: Conclusion
    detail: str
    # How long, from the asking, until a "not applied" is believed (its settle window
    # over); zero or less: it already is.
    settle_left_s: float


async def probe_unknown_key(
    store: Store,
    session: aiohttp.ClientSession,
    route: Route,
    resource: str,
    path: str,
    key: str,
    since: float,
) -> KeyProbe:
    """Ask `route`'s probe whether a request with `key` on `path` was applied, with the
    settle window counted from `since` (on the store's clock): a "not applied" is
    believed only once anything sent before `since` has had time to land. A probe asks
    by key alone: "applied" says nothing of which payload was (the store lost it)."""
    assert route.reconcile is not None
    with telemetry.scope("probe", route=route.name, resource=resource):
        asked_at = await store.now()
        status, error = await ask_upstream_about(
            session, route, probe_path(route, path, key), fence_headers(resource)
        )
        verdict = judge_probe(status, error, route.reconcile, since, asked_at)
        telemetry.about(conclusion=verdict.conclusion.value, upstream_status=status)
        # Not the key itself: an idempotency key is the worker's, as a token is.
        log.info("recovery window: the probe of a key unknown on %s: %s", resource, verdict.detail)
    settle_left_s = since + route.reconcile.settle_s - asked_at
    return KeyProbe(verdict.conclusion, verdict.detail, settle_left_s)


async def probe_effect(
    store: Store,
    session: aiohttp.ClientSession,
    policy: Policy,
    effect: EffectRecord,
    actor: str | None = None,
    note: str | None = None,
) -> ProbeResult:
    """Probe once and record what it proved; `actor` is who asked (None: the schedule),
    `note` why, kept after the detail of the answer."""
    with telemetry.scope(
        "probe",
        route=effect.route,
        resource=effect.resource,
        effect_id=effect.id,
        epoch=effect.epoch,
    ):
        telemetry.about(actor=actor)
        result = await _probe_effect(store, session, policy, effect, actor, note)
        telemetry.about(conclusion=result.conclusion)
        return result


async def _probe_effect(
    store: Store,
    session: aiohttp.ClientSession,
    policy: Policy,
    effect: EffectRecord,
    actor: str | None,
    note: str | None,
) -> ProbeResult:
    def noted(detail: str) -> str:
        return detail if note is None else f"{detail} (asked because: {note})"

    route = policy.route_named(effect.route)
    if route is None or route.reconcile is None:
        detail = noted("the route has no reconcile block: an operator must resolve this effect")
        recorded = await store.record_probe(
            effect.id,
            Event.PROBE_INCONCLUSIVE,
            None,
            detail,
            None,
            # Nothing was asked: no attempt is counted and probing did not "give up".
            counted=False,
            conclusion="no_probe",
            actor=actor,
        )
        return ProbeResult(recorded, "no_probe", detail)
    # The settle window is judged at the time of asking, on the authority's clock.
    asked_at = await store.now()
    status, error = await ask_upstream(session, route, effect)
    telemetry.about(upstream_status=status)
    # The settle window counts from the latest moment the request can have been sent.
    sent = sent_by(effect.created_at, effect.deadline, route.upstream.timeout_s, effect.finished_at)
    verdict = judge_probe(status, error, route.reconcile, sent, asked_at)
    retry_at = None
    counted = not verdict.early
    if verdict.conclusion is Conclusion.INCONCLUSIVE:
        attempts = effect.probe_attempts + (1 if counted else 0)
        retry_at = next_probe_at(attempts, route.reconcile, sent, await store.now())
    detail = noted(verdict.detail)
    recorded = await store.record_probe(
        effect.id, verdict.event, status, detail, retry_at, counted=counted, actor=actor
    )
    log.info("probe of %s (%s): %s", effect.id, effect.resource, detail)
    return ProbeResult(recorded, verdict.conclusion.value, detail)


class Reconciler:
    """Background work: turn overdue DISPATCHING effects into UNKNOWN, probe UNKNOWN ones."""

    def __init__(
        self,
        store: Store,
        session: aiohttp.ClientSession,
        policy: Policy,
        deadline_margin_s: float,
        on_probe: Callable[[str], None] = lambda conclusion: None,
        version: str = "unknown",
        started: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        policy_digest: str | None = None,
    ) -> None:
        """`started` is when the process started on `clock` (a monotonic one): the
        replica's row gives it, and the last sweep and probe, on the store's clock."""
        self.store = store
        self.session = session
        self.policy = policy
        # Written in this replica's row; a reload changes it with `policy`.
        self.policy_digest = policy_digest
        self.deadline_margin_s = deadline_margin_s
        self.on_probe = on_probe
        self.wake = asyncio.Event()
        self.version = version
        self.clock = clock
        self.started = clock() if started is None else started
        self.last_sweep: float | None = None
        self.last_probe: float | None = None
        self.last_beat: float | None = None

    async def round(self) -> None:
        """One round of the loop (proxy/periodic.py runs it every POLL_INTERVAL_S, or
        at once when `wake` is set): the sweep when due, the probes due, the beat."""
        now = self.clock()
        if self.last_sweep is None or now - self.last_sweep >= SWEEP_INTERVAL_S:
            swept = await self.store.recover(None, self.deadline_margin_s)
            self.last_sweep = now
            if swept:
                log.warning("effects past their deadline now UNKNOWN: %s", swept)
        await self.probe_due()
        await self.beat()

    async def probe_due(self) -> None:
        # Claim long enough for a probe to finish, so no other prober takes it meanwhile.
        longest = max((u.timeout_s for u in self.policy.upstreams.values()), default=5.0)
        due = await self.store.claim_due_probes(CLAIM_BATCH, claim_s=longest + 5.0)
        if due:
            self.last_probe = self.clock()
        results = await asyncio.gather(
            *(probe_effect(self.store, self.session, self.policy, e) for e in due),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, ProbeResult):
                self.on_probe(result.conclusion)
            elif isinstance(result, Exception):
                log.error("probe failed: %s", result)

    async def beat(self) -> None:
        """Write this instance's row in `replicas`, and read the recovery window again
        (an operator may have closed it through another replica), at most once per
        REPLICA_BEAT_INTERVAL_S."""
        now = self.clock()
        if self.last_beat is not None and now - self.last_beat < REPLICA_BEAT_INTERVAL_S:
            return

        def age(instant: float | None) -> float | None:
            return None if instant is None else now - instant

        await self.store.record_replica(
            self.version,
            now - self.started,
            age(self.last_sweep),
            age(self.last_probe),
            self.policy_digest,
        )
        await self.store.refresh_recovery()
        self.last_beat = now
