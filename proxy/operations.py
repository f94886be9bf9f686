"""What an operator can ask of the proxy, written once for the admin API and the CLI.

Each operation takes plain arguments (raw text is validated here, not by the
caller) and a Store, and returns a typed result or raises a `Refusal`
with the `ErrorCode` a client sees. `proxy/control.py` turns a refusal into
problem+json and `proxy/cli.py` into its one-line message; neither checks
anything of its own, so the two cannot disagree about what is allowed.

Reconciliation itself (what is in doubt, a probe now, an operator's decision) is
reconcile/operations.py's; what is here of it only checks the operator's words first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import aiohttp

from core.codes import ErrorCode
from core.leasing_advice import (
    DEFAULT_MARGIN,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_TARGETS,
    Advice,
    AdviceRequest,
    RouteSpec,
    advise,
    template_glob,
)
from core.records import EffectEvent, EffectRecord, EffectState, Refusal, Rejection
from policies import RESOURCE_RE, Policy
from policies.keys import DAY_S
from policies.model import MAX_RESOURCE_CHARS, RESOURCE_CHARS
from policies.store_backends import store_backend
from proxy.presentation import lease_entry_json, replica_json
from reconcile import operations as reconciliation
from reconcile.prober import ProbeResult
from store import LeaseView, RecentLeases, Replica, Store, StoreError

DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000
# An operator's reason is kept in the effect's history and printed in tables: a
# sentence, not a document.
MAX_TEXT_CHARS = 500
# ASCII digits only: str.isdigit() also accepts "²", which int() then refuses.
_WHOLE_NUMBER = re.compile(r"[0-9]+\Z")
# How much of a bad value a refusal repeats: enough to recognise it, never a whole body.
_SHOWN_CHARS = 80

# The CLI's --outcome spells it with a hyphen, JSON with an underscore; both are taken.
OUTCOMES = {
    "committed": EffectState.COMMITTED,
    "not_committed": EffectState.NOT_COMMITTED,
    "not-committed": EffectState.NOT_COMMITTED,
}


def _invalid(detail: str) -> Refusal:
    return Refusal(ErrorCode.INVALID_REQUEST, detail)


def _shown(value: str) -> str:
    return repr(value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "…")


# --- validating what an operator or a client sent -----------------------------------------


def resource_name(value: object) -> str:
    rule = "resource must be 1-256 characters of A-Z a-z 0-9 . _ : @ / + = -"
    if not isinstance(value, str):
        raise _invalid(rule)
    if not RESOURCE_RE.match(value):
        raise _invalid(f"{_shown(value)} is not a valid resource name: {rule}")
    return value


def _resource_filter(value: str | None) -> str | None:
    return None if value is None else resource_name(value)


def required_text(value: object, field: str) -> str:
    """A reason or an operator's name: kept with the decision, so it must say something."""
    if not isinstance(value, str):
        raise _invalid(f"{field} must be a string")
    text = value.strip()
    if not text:
        raise _invalid(f"{field} must not be empty")
    if len(text) > MAX_TEXT_CHARS:
        raise _invalid(f"{field} must be at most {MAX_TEXT_CHARS} characters")
    return text


def list_limit(raw: str | None) -> int:
    """How many rows a listing returns; None is the default."""
    if raw is None:
        return DEFAULT_LIST_LIMIT
    if not _WHOLE_NUMBER.match(raw) or not 1 <= int(raw) <= MAX_LIST_LIMIT:
        raise _invalid(f"limit must be a whole number 1-{MAX_LIST_LIMIT}")
    return int(raw)


def effect_state(raw: str | None) -> EffectState | None:
    if raw is None:
        return None
    if raw not in EffectState.__members__:
        raise _invalid(f"state must be one of {', '.join(EffectState.__members__)}")
    return EffectState[raw]


def outcome(raw: object) -> EffectState:
    decided = OUTCOMES.get(raw) if isinstance(raw, str) else None
    if decided is None:
        raise _invalid("outcome must be committed or not_committed")
    return decided


def _not_found(effect_id: str) -> Refusal:
    return reconciliation.no_effect(effect_id)


# --- leases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Revoked:
    resource: str
    revoked_epoch: int
    epoch: int
    reason: str


async def lease_view(store: Store, resource: object) -> LeaseView:
    return await store.lease_view(resource_name(resource))


async def revoke(
    store: Store, resource: object, reason: object, actor: str | None = None
) -> Revoked:
    """Advance the resource's epoch; `actor` (the admin API's client) is kept with it."""
    name = resource_name(resource)
    why = required_text(reason, "reason")
    old, new = await store.revoke(name, why, actor)
    return Revoked(name, old, new, why)


# --- receipts and refusals ---------------------------------------------------------------


@dataclass(frozen=True)
class EffectHistory:
    """An effect and every decision about it."""

    effect: EffectRecord
    events: tuple[EffectEvent, ...]

    def as_json(self) -> dict[str, Any]:
        return {**self.effect.as_json(), "events": [event.as_json() for event in self.events]}


async def list_effects(
    store: Store, resource: str | None, state: str | None, limit: str | None
) -> list[EffectRecord]:
    """Effect receipts, newest first."""
    wanted = effect_state(state)
    return await store.effects(
        _resource_filter(resource), wanted.value if wanted else None, list_limit(limit)
    )


async def effect_history(store: Store, effect_id: str) -> EffectHistory:
    effect, events = await store.effect_with_events(effect_id)
    if effect is None:
        raise _not_found(effect_id)
    return EffectHistory(effect, tuple(events))


async def list_rejections(store: Store, resource: str | None, limit: str | None) -> list[Rejection]:
    """Refused requests, newest first."""
    return await store.rejections(_resource_filter(resource), list_limit(limit))


# --- reconciliation: the operator's words, parsed, then reconcile/operations.py -------------


async def probe(
    store: Store,
    session: aiohttp.ClientSession,
    policy: Policy,
    effect_id: str,
    actor: str | None = None,
    reason: object = None,
) -> ProbeResult:
    """reconcile.operations.probe, with the operator's `reason` checked first."""
    note = None if reason is None else required_text(reason, "reason")
    result = await reconciliation.probe(store, session, policy, effect_id, actor, note)
    if isinstance(result, Refusal):
        raise result
    return result


async def resolve(
    store: Store, effect_id: str, decided: object, reason: object, operator: object
) -> EffectRecord:
    """reconcile.operations.resolve, with the outcome, reason and operator checked first."""
    settled_as = outcome(decided)
    why = required_text(reason, "reason")
    who = required_text(operator, "operator")
    result = await reconciliation.resolve(store, effect_id, settled_as, why, who)
    if isinstance(result, Refusal):
        raise result
    return result


# --- lease sizing --------------------------------------------------------------

# A resource glob: resource characters and fnmatch's * ? [ ] !
GLOB_CHARS = r"*?\[\]!" + RESOURCE_CHARS
GLOB_RE = re.compile(rf"[{GLOB_CHARS}]{{1,{MAX_RESOURCE_CHARS}}}\Z")
# Digits, a point, an exponent: no "nan", "inf", "1_0" or spaces, which float() takes.
_NUMBER = re.compile(r"[0-9.eE+-]{1,32}\Z")
MAX_MARGIN = 100.0
MAX_POLL_INTERVAL_S = DAY_S
MAX_TARGETS = 20
MAX_GRID_POINTS = 100
MAX_GRID_LEASE_S = DAY_S * 365


def _number(raw: str, field: str, rule: str) -> float:
    if _NUMBER.match(raw):
        try:
            value = float(raw)
        except ValueError:
            pass
        else:
            if math.isfinite(value):
                return value
    raise _invalid(f"{field}: {_shown(raw)} is not a number ({rule})")


def _bounded_number(
    raw: str | None, field: str, low: float, high: float, default: float, low_open: bool = False
) -> float:
    rule = f"{'more than' if low_open else 'at least'} {low:g}"
    if math.isfinite(high):
        rule += f" and at most {high:g}"
    if raw is None:
        return default
    value = _number(raw, field, rule)
    if value < low or (low_open and value == low) or value > high:
        raise _invalid(f"{field} must be {rule}")
    return value


def _numbers(raw: str, field: str, low: float, high: float, most: int) -> tuple[float, ...]:
    rule = f"comma-separated numbers from {low:g} to {high:g}, at most {most}"
    parts = raw.split(",")
    if len(parts) > most:
        raise _invalid(f"{field}: {rule}")
    values = tuple(_bounded_number(part, field, low, high, 0.0) for part in parts)
    return tuple(dict.fromkeys(values))


def resource_glob(raw: str | None) -> str | None:
    if raw is None:
        return None
    if not GLOB_RE.match(raw):
        raise _invalid(
            f"resource: {_shown(raw)} is not a resource glob: 1-{MAX_RESOURCE_CHARS} "
            "characters of A-Z a-z 0-9 . _ : @ / + = - and * ? [ ] !"
        )
    return raw


def advice_request(
    policy: Policy,
    resource: str | None,
    since: str | None,
    margin: str | None,
    poll_interval: str | None,
    targets: str | None,
    leases: str | None,
) -> AdviceRequest:
    """The advice's parameters from text (a query string's, the CLI's): each refused
    with `invalid_request` naming it, before anything is read."""
    since_s = None
    if since is not None:
        since_s = _bounded_number(since, "since", 0.0, math.inf, 0.0, low_open=True)
    grid = None
    if leases is not None:
        # 0 is a point like any other: a 0 s lease cuts every turn short.
        grid = tuple(sorted(_numbers(leases, "leases", 0.0, MAX_GRID_LEASE_S, MAX_GRID_POINTS)))
    bounds = policy.leases
    return AdviceRequest(
        resource=resource_glob(resource),
        since_s=since_s,
        margin=_bounded_number(margin, "margin", 1.0, MAX_MARGIN, DEFAULT_MARGIN),
        poll_interval_s=_bounded_number(
            poll_interval, "poll_interval", 0.0, MAX_POLL_INTERVAL_S, DEFAULT_POLL_INTERVAL_S
        ),
        targets=DEFAULT_TARGETS
        if targets is None
        else _numbers(targets, "targets", 0.0, 1.0, MAX_TARGETS),
        leases=grid,
        min_ttl_s=bounds.min_ttl_s,
        max_ttl_s=bounds.max_ttl_s,
        default_ttl_s=bounds.default_ttl_s,
    )


def fenced_routes(policy: Policy) -> tuple[RouteSpec, ...]:
    return tuple(
        RouteSpec(route.name, template_glob(route.resource.raw), route.upstream.timeout_s)
        for route in policy.routes
        if route.fenced and route.resource is not None
    )


async def lease_advice(
    store: Store,
    policy: Policy,
    resource: str | None = None,
    since: str | None = None,
    margin: str | None = None,
    poll_interval: str | None = None,
    targets: str | None = None,
    leases: str | None = None,
) -> Advice:
    """TTLs from the measured turns of recorded leases (core/leasing_advice.py): what
    `fenceproxy lease-advice` prints and GET /_fence/v1/lease-advice answers."""
    request = advice_request(policy, resource, since, margin, poll_interval, targets, leases)
    recorded = await store.lease_lives(request.since_s)
    return advise(recorded.lives, recorded.latencies, fenced_routes(policy), request, recorded.now)


# --- the status page ----------------------------------------------------------

# Replicas listed on the status page: those that wrote their row in the last few minutes
# (each writes one every reconcile.prober.REPLICA_BEAT_INTERVAL_S).
REPLICAS_WINDOW_S = 300.0
# Expired and ended leases shown: those granted in the last hour.
RECENT_LEASES_WINDOW_S = 3600.0
RECENT_LEASES_LIMIT = 200


def proxy_version() -> str:
    try:
        return metadata.version("fenceproxy")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


@dataclass(frozen=True)
class ThisInstance:
    """The answering process, as only it knows itself (ages in seconds)."""

    instance_id: str
    version: str
    uptime_s: float
    last_sweep_age_s: float | None
    last_probe_age_s: float | None
    policy_digest: str | None = None

    def as_json(self) -> dict[str, Any]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 3)

        return {
            "instance_id": self.instance_id,
            "version": self.version,
            "uptime_s": round(self.uptime_s, 3),
            "last_sweep_age_s": rounded(self.last_sweep_age_s),
            "last_probe_age_s": rounded(self.last_probe_age_s),
            "policy_digest": self.policy_digest,
        }


@dataclass(frozen=True)
class ServiceStatus:
    """Whether the service is up, apart from whether work is stuck: the store may not
    answer, and this is still an answer (never a refusal)."""

    instance: ThisInstance | None  # None: asked by the CLI, which serves nothing
    backend: str
    store_answers: bool
    store_problem: str | None
    now: float | None  # the store's clock, when it answered
    replicas: tuple[Replica, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "instance": self.instance.as_json() if self.instance else None,
            "store": {
                "backend": self.backend,
                "answers": self.store_answers,
                "problem": self.store_problem,
                "now": self.now,
            },
            "replicas_window_s": REPLICAS_WINDOW_S,
            "replicas": [replica_json(replica) for replica in self.replicas],
            # More than one: the replicas do not serve the same policy file.
            "policy_digests": policy_digests(self.replicas),
        }


def disagreeing(replicas: Iterable[Replica], digest: str | None) -> list[Replica]:
    """The replicas that say they serve another policy than `digest`; one that does not
    say (an older version, a proxy built without a file) is not counted."""
    if digest is None:
        return []
    return [r for r in replicas if r.policy_digest is not None and r.policy_digest != digest]


def policy_digests(replicas: Iterable[Replica]) -> list[str]:
    """The distinct policies the replicas say they serve: more than one is a mismatch."""
    return sorted({r.policy_digest for r in replicas if r.policy_digest is not None})


async def service_status(
    store: Store, store_url: str, instance: ThisInstance | None = None
) -> ServiceStatus:
    backend = store_backend(store_url)
    backend_name = backend.value if backend is not None else "unknown"
    try:
        now = await store.now()
        replicas = await store.replicas(REPLICAS_WINDOW_S)
    except StoreError as exc:
        return ServiceStatus(instance, backend_name, False, str(exc), None, ())
    return ServiceStatus(instance, backend_name, True, None, now, replicas)


async def recent_leases(store: Store) -> RecentLeases:
    """Live leases, and those expired or ended in the last RECENT_LEASES_WINDOW_S."""
    return await store.recent_leases(RECENT_LEASES_WINDOW_S, RECENT_LEASES_LIMIT)


def recent_leases_json(leases: RecentLeases) -> dict[str, Any]:
    return {
        "now": leases.now,
        "window_s": RECENT_LEASES_WINDOW_S,
        "live": [
            {**lease_entry_json(lease), "ttl_left_s": round(lease.expires_at - leases.now, 3)}
            for lease in leases.live
        ],
        "recently_ended": [lease_entry_json(lease) for lease in leases.ended],
    }
