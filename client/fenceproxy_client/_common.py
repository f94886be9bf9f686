"""What the sync and the asyncio client share: reading the proxy's answers, the lease's
state and the renewal schedule. Nothing here does I/O or reads a clock by itself: the
callers pass the time, so the rules can be tested without a proxy.
"""

from __future__ import annotations

import email.utils
import logging
import os
import secrets
import ssl
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from enum import Enum, auto
from typing import Any

import httpx

from fenceproxy_client import errors

logger = logging.getLogger("fenceproxy_client")

API = "/_fence/v1"
# The proxy's own problems have this `type`; an upstream's problem+json does not, so it
# is relayed as the upstream's answer (UpstreamError), never mistaken for a refusal.
PROBLEM_TYPE_BASE = "https://fenceproxy.dev/problems/"

# Refusals that say "not yet" rather than "no": acquiring with wait_s tries again.
# `rate_limited` is named by its code so that a proxy that sends it is waited out too.
RETRIED_WHEN_WAITING = frozenset({"lease_held", "resource_blocked", "rate_limited"})
# Renewal refusals that mean the lease is gone for good; any other refusal (a store
# that did not answer, an overloaded proxy) is tried again while the lease lasts.
# forbidden / forbidden_resource on a renew: the lease's client was removed from the
# proxy's auth: or no longer covers the resource; renewing will not work again.
LEASE_GONE = frozenset(
    {
        "stale_epoch",
        "lease_expired",
        "invalid_token",
        "wrong_resource",
        "forbidden",
        "forbidden_resource",
    }
)
# What an effect in doubt ends as (NOT_SENT is settled too, though never from UNKNOWN).
SETTLED_STATES = frozenset({"COMMITTED", "NOT_COMMITTED", "NOT_SENT"})

FIRST_RETRY_S = 0.05
MAX_BACKOFF_S = 1.0
# Renewal after a failed attempt: soon, but not in a tight loop.
RENEW_RETRY_S = 0.5
# The lease calls whose round trips say how long a request takes to reach the proxy.
TRIPS_KEPT = 8
SETTLE_POLL_S = 0.2


def new_key() -> str:
    """A random idempotency key (128 bits), for a caller that stores it with its job
    before sending, so that a retry of the same job sends the same key."""
    return secrets.token_urlsafe(16)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """`Retry-After` in seconds from `now` (Unix time): delay-seconds or an HTTP-date
    (RFC 9110 10.2.3); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def refusal_of(response: httpx.Response, now: float) -> errors.FenceError | None:
    """The proxy's own problem+json answer as its typed error; None for anything else."""
    content_type = response.headers.get("content-type", "")
    if not content_type.startswith("application/problem+json"):
        return None
    try:
        problem = response.json()
    except ValueError:
        return None
    if not isinstance(problem, dict):
        return None
    code = problem.get("code")
    if not isinstance(code, str) or problem.get("type") != PROBLEM_TYPE_BASE + code:
        return None
    error_class = errors.BY_CODE.get(code, errors.FenceError)
    retry_after_s = parse_retry_after(response.headers.get("retry-after"), now)
    return error_class(response.status_code, problem, retry_after_s)


def checked(response: httpx.Response, raise_for_status: bool, now: float) -> httpx.Response:
    """Raise the proxy's refusal, or the upstream's non-2xx answer unless the caller
    asked for it; otherwise the response."""
    refusal = refusal_of(response, now)
    if refusal is not None:
        raise refusal
    if raise_for_status and not response.is_success:
        raise errors.UpstreamError(response)
    return response


def retry_delay(refusal: errors.FenceError, attempt: int) -> float:
    """How long to wait before acquiring again: the proxy's Retry-After when it gave
    one, else a doubling backoff."""
    if refusal.retry_after_s is not None:
        return max(refusal.retry_after_s, FIRST_RETRY_S)
    return float(min(FIRST_RETRY_S * 2**attempt, MAX_BACKOFF_S))


def fenced_headers(
    token: str, idempotency_key: str | None, headers: Mapping[str, str] | None
) -> dict[str, str]:
    sent = dict(headers or {})
    sent["Fence-Token"] = token
    if idempotency_key is not None:
        sent["Idempotency-Key"] = idempotency_key
    return sent


def bearer(key: str | None) -> dict[str, str]:
    """The client key's header for a lease call (none without a key)."""
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def reader_headers(admin_token: str | None, api_key: str | None) -> dict[str, str]:
    """Reading an effect without a lease: the admin token, else the client key (whose
    client needs the `read` right on the effect's resource)."""
    key = admin_token if admin_token is not None else api_key
    if key is None:
        raise ValueError(
            "reading an effect without a lease needs the client's admin_token or api_key"
        )
    return bearer(key)


# What `verify=` and `cert=` take, as httpx spells them: a CA bundle (file or folder),
# an SSLContext or a bool; a client certificate as a PEM file holding the key too, or
# (certificate, key) or (certificate, key, password).
Verify = ssl.SSLContext | str | os.PathLike[str] | bool
Cert = str | os.PathLike[str] | tuple[str, str] | tuple[str, str, str]


def tls_settings(verify: Verify, cert: Cert | None, trust_env: bool) -> ssl.SSLContext | bool:
    """What httpx is given as `verify`. httpx deprecates a path in `verify` and
    `cert=` itself (a DeprecationWarning on every client), so both are turned into
    an SSLContext here."""
    if cert is None and (isinstance(verify, ssl.SSLContext | bool)):
        return verify
    if isinstance(verify, ssl.SSLContext):
        raise ValueError("with verify=<SSLContext>, load the client certificate into it")
    if isinstance(verify, bool):
        context = httpx.create_ssl_context(verify=verify, trust_env=trust_env)
    elif os.path.isdir(verify):
        context = ssl.create_default_context(capath=verify)
    else:
        context = ssl.create_default_context(cafile=verify)
    if isinstance(cert, tuple):
        context.load_cert_chain(*cert)
    elif cert is not None:
        context.load_cert_chain(cert)
    return context


@dataclass(frozen=True)
class EffectStatus:
    """An effect as the proxy's record has it now (`GET /_fence/v1/effects/{id}`).

    `next_probe_at` (the proxy's clock, Unix seconds) is when the proxy asks the
    upstream next; None while the effect is in doubt means no probe is scheduled (the
    route has none, or it gave up), so only an operator settles it."""

    id: str
    state: str
    settled_by: str | None
    probe_attempts: int
    next_probe_at: float | None

    @property
    def settled(self) -> bool:
        return self.state in SETTLED_STATES

    @classmethod
    def read(cls, body: Any) -> EffectStatus:
        if not isinstance(body, dict):
            raise ValueError("the proxy's effect answer is not a JSON object")
        next_probe_at = body.get("next_probe_at")
        settled_by = body.get("settled_by")
        return cls(
            id=str(body["id"]),
            state=str(body["state"]),
            settled_by=None if settled_by is None else str(settled_by),
            probe_attempts=int(body.get("probe_attempts") or 0),
            next_probe_at=None if next_probe_at is None else float(next_probe_at),
        )


@dataclass(frozen=True)
class Grant:
    """An acquire or renew answer, with the local (monotonic) time its ttl ends."""

    resource: str
    holder: str
    epoch: int
    expires_at: float
    ttl_s: float
    local_expiry: float

    @classmethod
    def read(cls, body: Any, sent_at: float) -> Grant:
        """`sent_at` is the monotonic time the request was sent: the lease was granted
        after it, so the lease ends no earlier than `sent_at + ttl_s` by this clock."""
        if not isinstance(body, dict):
            raise ValueError("the proxy's lease answer is not a JSON object")
        ttl_s = float(body["ttl_s"])
        return cls(
            resource=str(body["resource"]),
            holder=str(body["holder"]),
            epoch=int(body["epoch"]),
            expires_at=float(body["expires_at"]),
            ttl_s=ttl_s,
            local_expiry=sent_at + ttl_s,
        )


class LeaseNeeds:
    """How long a lease must have left for a fenced request to be admitted, as the
    proxy said in `lease_too_short` (`needed_s`: the route's upstream timeout), per
    method and path. Shared by a client's leases, so the next lease on the same path
    renews before its write instead of being refused first. Bounded: the oldest
    entry is forgotten first (and learnt again from one refusal)."""

    MAX_REMEMBERED = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._needed_s: dict[tuple[str, str], float] = {}

    def learn(self, method: str, path: str, refusal: errors.FenceError) -> float | None:
        needed = refusal.problem.get("needed_s")
        if not isinstance(needed, int | float) or isinstance(needed, bool):
            return None  # a proxy too old to say
        key = (method.upper(), path)
        with self._lock:
            self._needed_s.pop(key, None)
            if len(self._needed_s) >= self.MAX_REMEMBERED:
                del self._needed_s[next(iter(self._needed_s))]
            self._needed_s[key] = float(needed)
        return float(needed)

    def needed(self, method: str, path: str) -> float | None:
        with self._lock:
            return self._needed_s.get((method.upper(), path))


class Step(Enum):
    RENEW = auto()
    WAIT = auto()
    LOST = auto()  # just learned: the renewer calls on_lost, then ends
    DONE = auto()


class LeaseState:
    """A held lease as the client knows it: when it ends by the local clock, whether it
    is being renewed, when `progress()` was last called, whether it is known lost.

    Shared by the caller's thread and the renewer, hence the lock. `lost_now` and
    `next_step` answer whether the caller must be told once (`on_lost`).
    """

    def __init__(
        self,
        grant: Grant,
        ttl_s: float,
        renew: bool,
        progress_timeout_s: float | None,
        now: float,
    ) -> None:
        self._lock = threading.Lock()
        self.grant = grant
        self.ttl_s = ttl_s
        self.renewing = renew
        self.progress_timeout_s = progress_timeout_s
        self.last_progress = now
        self.next_renewal = now + ttl_s / 3
        self.lost = False
        self.why_lost = ""
        self.released = False
        self._trips: deque[float] = deque(maxlen=TRIPS_KEPT)
        self._trip(grant, now)

    def _trip(self, grant: Grant, answered: float) -> None:
        """The lease call that brought `grant`, from its sending to its answer."""
        self._trips.append(max(0.0, answered - (grant.local_expiry - grant.ttl_s)))

    def is_lost(self, now: float) -> bool:
        with self._lock:
            return self.lost or (not self.released and now >= self.grant.local_expiry)

    def check(self, now: float) -> None:
        """Raise LeaseLost if the lease is known to be gone."""
        with self._lock:
            lost, why = self.lost, self.why_lost
            if not lost and not self.released and now >= self.grant.local_expiry:
                lost, why = True, "it expired without a renewal"
            grant = self.grant
        if lost:
            raise errors.LeaseLost(grant.resource, grant.epoch, why)

    def progress(self, now: float) -> None:
        with self._lock:
            self.last_progress = now

    def should_renew_for(self, needed_s: float | None, now: float) -> bool:
        """Whether to renew before a request whose route needs `needed_s` left on the
        lease when the proxy admits it: when less would be left by then by the local
        clock (which ends the lease no later than the proxy's), and a renewal to this
        lease's ttl would give enough. "By then" is twice the slowest of the recent
        lease calls' round trips: a request takes about as long to reach its
        admission, as variably on a loaded machine."""
        if needed_s is None:
            return False
        with self._lock:
            on_the_way = 2 * max(self._trips)
            return self.grant.local_expiry - now < needed_s + on_the_way and needed_s <= self.ttl_s

    def renewed(self, grant: Grant, now: float) -> None:
        with self._lock:
            self.grant = grant
            self._trip(grant, now)
            self.next_renewal = now + self.ttl_s / 3

    def renewal_failed(self, now: float) -> None:
        with self._lock:
            self.next_renewal = now + min(self.ttl_s / 6, RENEW_RETRY_S)

    def release(self) -> None:
        with self._lock:
            self.released = True

    def lose(self, why: str) -> bool:
        """Mark the lease lost; True the first time (the caller then calls on_lost)."""
        with self._lock:
            if self.lost or self.released:
                return False
            self.lost = True
            self.why_lost = why
        logger.warning(
            "lease on %s (holder %s, epoch %d) lost: %s",
            self.grant.resource,
            self.grant.holder,
            self.grant.epoch,
            why,
        )
        return True

    def next_step(self, now: float) -> tuple[Step, float]:
        """What the renewer does next, and after how long a wait (for WAIT)."""
        with self._lock:
            if self.lost or self.released:
                return Step.DONE, 0.0
            expiry = self.grant.local_expiry
            stalled_at = (
                None
                if self.progress_timeout_s is None
                else self.last_progress + self.progress_timeout_s
            )
            if self.renewing and stalled_at is not None and now >= stalled_at:
                self.renewing = False
                logger.warning(
                    "lease on %s (epoch %d): no progress() for %g s, renewal stopped; "
                    "the lease is left to expire",
                    self.grant.resource,
                    self.grant.epoch,
                    self.progress_timeout_s,
                )
            if now < expiry and self.renewing and now >= self.next_renewal:
                return Step.RENEW, 0.0
        if now >= expiry:
            return (Step.LOST if self.lose("it expired without a renewal") else Step.DONE), 0.0
        with self._lock:
            wake = expiry
            if self.renewing:
                wake = min(wake, self.next_renewal)
                if stalled_at is not None:
                    wake = min(wake, stalled_at)
            return Step.WAIT, wake - now

    def describe(self) -> str:
        grant = self.grant
        return (
            f"resource={grant.resource!r}, holder={grant.holder!r}, epoch={grant.epoch}, "
            f"expires_at={grant.expires_at}"
        )
