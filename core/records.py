"""Records the store keeps, and the refusals the decisions produce."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from core.codes import ErrorCode
from core.frozen import quick_init


class EffectState(StrEnum):
    DISPATCHING = "DISPATCHING"
    COMMITTED = "COMMITTED"
    NOT_COMMITTED = "NOT_COMMITTED"
    NOT_SENT = "NOT_SENT"
    UNKNOWN = "UNKNOWN"
    # Evidence contradicts how the effect was settled: an operator must decide.
    CONFLICTING = "CONFLICTING"


class Refusal(Exception):
    """A request the proxy will not carry out, and why: the one carrier of a refusal.

    The rules and the store return it as a decision; request parsing and the
    operations raise it. Either way it is answered the same: a problem+json document
    (proxy/problems.py) with the code's status, or on the command line its detail and
    code. `context` holds the document's extra members (None values are left out)."""

    def __init__(
        self, code: ErrorCode, detail: str, context: Mapping[str, Any] | None = None
    ) -> None:
        # Typed for mypy; checked here too, so that a string from an untyped caller is a
        # bug caught where it is made, not a response nobody can map to a status.
        if not isinstance(code, ErrorCode):
            raise TypeError(f"a refusal's code is an ErrorCode, not {code!r}")
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.context: dict[str, Any] = dict(context or {})

    def __repr__(self) -> str:
        return f"Refusal({self.code!r}, {self.detail!r}, {self.context!r})"


@quick_init
@dataclass(frozen=True)
class LeaseRecord:
    resource: str
    epoch: int
    holder: str
    granted_at: float
    expires_at: float
    ended_at: float | None
    end_reason: str | None
    # The authenticated client that took it (None: the policy had no `auth:` block).
    client: str | None = None

    def live(self, now: float) -> bool:
        return self.ended_at is None and now < self.expires_at


@dataclass(frozen=True)
class OpenEffect:
    """An effect of a resource that is not settled: DISPATCHING, UNKNOWN or CONFLICTING."""

    id: str
    state: EffectState
    epoch: int
    idempotency_key: str | None
    fingerprint: str


@quick_init
@dataclass(frozen=True)
class ResourceState:
    """What the store knows of one resource at the start of a transaction."""

    resource: str
    epoch: int  # the highest epoch ever issued for it; 0 if never leased
    lease: LeaseRecord | None  # the lease at `epoch`, if that epoch was a grant
    open_effects: tuple[OpenEffect, ...] = ()  # in creation order
    # No epoch at or below this is ever issued (raised by fence-restore).
    epoch_floor: int = 0

    def current_lease(self) -> LeaseRecord | None:
        return self.lease if self.lease and self.lease.ended_at is None else None

    def next_epoch(self) -> int:
        return max(self.epoch, self.epoch_floor) + 1

    def in_state(self, state: EffectState) -> tuple[OpenEffect, ...]:
        return tuple(effect for effect in self.open_effects if effect.state is state)

    def blocking(self, holder_epoch: int | None = None) -> tuple[str, ...]:
        """The one definition of "blocked": the effects that keep anyone new from acting
        on the resource. A write in doubt or in dispute may have landed; a write being
        forwarded may still land. The lease holder at `holder_epoch` is not blocked by its
        own requests in flight (`max_in_flight` bounds those)."""
        return tuple(
            effect.id
            for effect in self.open_effects
            if effect.state is not EffectState.DISPATCHING or effect.epoch != holder_epoch
        )


@quick_init
@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    # The reason phrase as the upstream sent it (None: the status's standard one).
    reason: str | None = None
    # False: the body was over the replay limit and is not kept (`body` is empty);
    # a replay states that, rather than serve a body that is not the answer.
    body_kept: bool = True


@quick_init
@dataclass(frozen=True)
class IdempotencyRecord:
    resource: str
    key: str
    fingerprint: str
    effect_id: str
    effect_state: EffectState
    epoch: int
    # Retention runs from settlement: None while the effect is not settled.
    expires_at: float | None
    response: StoredResponse | None
    # Who settled the effect when no response was ever seen ("probe", "operator:NAME").
    settled_by: str | None = None


@quick_init
@dataclass(frozen=True)
class EffectRecord:
    id: str
    route: str
    resource: str
    holder: str
    epoch: int
    idempotency_key: str | None
    fingerprint: str
    method: str
    path: str
    state: EffectState
    instance_id: str
    created_at: float
    deadline: float
    finished_at: float | None
    upstream_status: int | None
    reason: str | None
    probe_attempts: int = 0
    next_probe_at: float | None = None
    settled_by: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "route": self.route,
            "resource": self.resource,
            "holder": self.holder,
            "epoch": self.epoch,
            "idempotency_key": self.idempotency_key,
            "fingerprint": self.fingerprint,
            "method": self.method,
            "path": self.path,
            "state": self.state.value,
            "instance_id": self.instance_id,
            "created_at": self.created_at,
            "deadline": self.deadline,
            "finished_at": self.finished_at,
            "upstream_status": self.upstream_status,
            "reason": self.reason,
            "probe_attempts": self.probe_attempts,
            "next_probe_at": self.next_probe_at,
            "settled_by": self.settled_by,
        }


# A stored path is cut to this many characters, then marked: a request target may be
# up to 8 KiB (proxy/requests.py MAX_TARGET) and every refusal stores its path, so an
# untruncated path would let each refused request write kilobytes.
STORED_PATH_CHARS = 256
TRUNCATED_MARK = "…"


def stored_path(path: str) -> str:
    """`path` as a rejection stores it: at most STORED_PATH_CHARS, then the mark. A NUL
    (from `%00`) is kept as it came, `%00`: PostgreSQL's text cannot hold one (the
    batch of counts would fail with it) and SQLite's cuts the path there."""
    path = path.replace("\x00", "%00")
    if len(path) <= STORED_PATH_CHARS:
        return path
    return path[:STORED_PATH_CHARS] + TRUNCATED_MARK


@dataclass(frozen=True)
class Rejection:
    """A refused request, or on the record (store/refusals.py) one kind of them.
    Never a body, a token or an Authorization header.

    `at` is set by the store's clock when the rejection is recorded."""

    code: str
    method: str
    path: str
    route: str | None = None
    resource: str | None = None
    holder: str | None = None
    epoch: int | None = None
    fingerprint: str | None = None
    at: float = 0.0
    # On the record, a kind stands for `count` requests seen from `first_seen` to `at`
    # (the latest), and method, path and fingerprint are the latest request's.
    count: int = 1
    first_seen: float | None = None
    # The authenticated client that was refused, or the client of the lease it names.
    client: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "first_seen": self.at if self.first_seen is None else self.first_seen,
            "count": self.count,
            "code": self.code,
            "method": self.method,
            "path": self.path,
            "route": self.route,
            "resource": self.resource,
            "holder": self.holder,
            "epoch": self.epoch,
            "fingerprint": self.fingerprint,
            "client": self.client,
        }


@dataclass(frozen=True)
class EffectEvent:
    """One decision about an effect: a recovery, a probe attempt, a resolution."""

    at: float
    kind: str
    actor: str
    upstream_status: int | None
    conclusion: str
    detail: str

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "kind": self.kind,
            "actor": self.actor,
            "upstream_status": self.upstream_status,
            "conclusion": self.conclusion,
            "detail": self.detail,
        }


def fence_headers(
    resource: str, *, epoch: int | None = None, effect_id: str | None = None
) -> dict[str, str]:
    """The headers that name a fenced write, built here only: on its answer to the
    worker (and a replay of it), upstream with it (`forward_fence_headers`), and on a
    probe asking about it (an effect's, or, in the recovery window, a key's with no
    effect known: the resource alone). A part left None is left out."""
    headers = {}
    if epoch is not None:
        headers["Fence-Epoch"] = str(epoch)
    headers["Fence-Resource"] = resource
    if effect_id is not None:
        headers["Fence-Effect-Id"] = effect_id
    return headers
