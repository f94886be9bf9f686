"""The values the Store's operations take and answer (no I/O, no presentation: the
admin API's JSON of them is proxy/presentation.py's)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core.frozen import quick_init
from core.leasing_advice import LeaseLife
from core.lifecycle import Transition
from core.records import EffectRecord
from policies.route_keys import RETAIN_S
from store.history import RecoveryWindow


@quick_init
@dataclass(frozen=True)
class NewEffect:
    """What the proxy knows of a mutation before it asks to forward it."""

    route: str
    resource: str
    idempotency_key: str | None
    fingerprint: str
    method: str
    path: str
    max_in_flight: int
    upstream_timeout_s: float
    retain_s: float
    upstream_idempotent: bool = False
    # How long after its admission the request may still be sent (core/send_deadline.py):
    # the effect is taken for in flight that much longer. 0: it is sent at once, or
    # never (callers that send nothing themselves: tests, benchmarks).
    send_window_s: float = 0.0


@quick_init
@dataclass(frozen=True)
class Admitted:
    effect: EffectRecord
    resends: tuple[str, ...] = ()


@dataclass(frozen=True)
class UnknownKey:
    """In the recovery window (store/history.py): the admission would forward a key the
    store does not know, which the old primary may have applied. Nothing was recorded;
    admit again with `key_cleared` once the upstream says it has not seen the key."""

    window: RecoveryWindow


@quick_init
@dataclass(frozen=True)
class Receipt:
    """What recording a dispatch's outcome did: the lifecycle step taken, and the
    effect as it stands after it (the worker's answer follows from both)."""

    transition: Transition
    effect: EffectRecord
    # Another effect that holds the operation's key now (named in a conflict).
    key_holder: str | None = None


@dataclass(frozen=True)
class LeaseView:
    resource: str
    epoch: int
    holder: str | None
    expires_at: float | None
    live: bool
    blocked: bool
    in_doubt: tuple[str, ...]
    client: str | None = None
    # What the next acquire or revoke gets: above `epoch`, and after fence-restore above
    # the floor too, so a resource never leased shows epoch 0 yet starts above the floor.
    next_epoch: int = 1


@dataclass(frozen=True)
class Purged:
    """What one retention pass deleted."""

    effects: int
    rejections: int
    leases: int = 0
    resources: int = 0

    def full(self, batch: int) -> bool:
        """A full batch of any kind: there may be more to delete right away."""
        return max(self.effects, self.rejections, self.leases, self.resources) >= batch

    def __add__(self, other: Purged) -> Purged:
        return Purged(
            self.effects + other.effects,
            self.rejections + other.rejections,
            self.leases + other.leases,
            self.resources + other.resources,
        )

    def __bool__(self) -> bool:
        return any((self.effects, self.rejections, self.leases, self.resources))


@dataclass(frozen=True)
class StoreIdentity:
    """Who the store is: a random id created with its schema, when (by the store's
    clock), and when `store fence-restore` last advanced every epoch (None: never)."""

    store_id: str
    created_at: float
    fenced_at: float | None


# Effects admitted before retention ran from settlement did not record their route's.
DEFAULT_RETAIN_S = RETAIN_S.default
# What one lease-advice read takes at most of each (the newest): bounded whatever the
# store holds, and plenty for percentiles.
MAX_ADVICE_ROWS = 100_000
# How many replicas the status page lists: far more than any deployment runs.
MAX_REPLICAS = 100

# Told, once its transaction committed, how a lease ended (an Ending, or "came_back":
# its holder showed it was alive after the lease expired), with the turn's length for
# a release: the proxy's metrics (proxy/metrics.py) count them.
LeaseObserver = Callable[[str, str, float | None], None]
CAME_BACK = "came_back"


@dataclass(frozen=True)
class LeaseLives:
    """What lease-advice reads, as of one moment of the store's clock."""

    lives: tuple[LeaseLife, ...]
    latencies: tuple[tuple[str, float], ...]  # (route, admission to receipt, seconds)
    now: float


@dataclass(frozen=True)
class Replica:
    """A proxy instance as its last row in `replicas` tells (store clock seconds)."""

    instance_id: str
    version: str
    started_at: float
    seen_at: float
    last_sweep_at: float | None
    last_probe_at: float | None
    # The sha256 of the policy file it serves; None from a replica that does not say.
    policy_digest: str | None = None


@dataclass(frozen=True)
class LeaseEntry:
    resource: str
    epoch: int
    holder: str
    client: str | None
    granted_at: float
    expires_at: float
    ended_at: float | None
    end_reason: str | None
    # The holder showed it was alive after the lease expired: a false expiry.
    came_back_at: float | None


@dataclass(frozen=True)
class RecentLeases:
    live: tuple[LeaseEntry, ...]  # latest expiry first
    ended: tuple[LeaseEntry, ...]  # expired or ended lately, latest expiry first
    now: float
