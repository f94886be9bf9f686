"""The error codes a client can see, each with its HTTP status, title and meaning.

`ErrorCode` names the codes; `_PROBLEMS` is the one table that gives each its
status, the problem document's `title`, and when it is answered. The problem
responses, the OpenAPI document and the docs' error codes page all come
from (or are tested against) this table, so a code cannot exist in one and not
the others. `when` is that page's cell verbatim (Markdown), which OpenAPI
descriptions accept as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"
    MISSING_IDEMPOTENCY_KEY = "missing_idempotency_key"
    MISSING_TOKEN = "missing_token"
    UNAUTHORIZED = "unauthorized"
    INVALID_TOKEN = "invalid_token"
    FORBIDDEN = "forbidden"
    FORBIDDEN_RESOURCE = "forbidden_resource"
    WRONG_RESOURCE = "wrong_resource"
    NO_ROUTE = "no_route"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    STALE_EPOCH = "stale_epoch"
    LEASE_EXPIRED = "lease_expired"
    LEASE_HELD = "lease_held"
    EFFECT_IN_FLIGHT = "effect_in_flight"
    EFFECT_SETTLED = "effect_settled"
    REQUEST_IN_PROGRESS = "request_in_progress"
    LEASE_TOO_SHORT = "lease_too_short"
    CONFLICTING_EVIDENCE = "conflicting_evidence"
    NO_PROBE = "no_probe"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    HEADERS_TOO_LARGE = "headers_too_large"
    URI_TOO_LONG = "uri_too_long"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    RESOURCE_BLOCKED = "resource_blocked"
    RATE_LIMITED = "rate_limited"
    INTERNAL_ERROR = "internal_error"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    UPSTREAM_ANSWER_TOO_LARGE = "upstream_answer_too_large"
    STORE_UNAVAILABLE = "store_unavailable"
    OUTCOME_UNKNOWN = "outcome_unknown"
    REQUEST_TIMEOUT = "request_timeout"
    OVERLOADED = "overloaded"
    EXPECTATION_FAILED = "expectation_failed"
    RECOVERY_WINDOW = "recovery_window"
    KEY_APPLIED_REQUEST_UNKNOWN = "key_applied_request_unknown"
    RELOAD_REFUSED = "reload_refused"

    @property
    def status(self) -> int:
        return _PROBLEMS[self].status

    # Not `title`: that name is str.title(), which a StrEnum must keep.
    @property
    def problem_title(self) -> str:
        return _PROBLEMS[self].title

    @property
    def when(self) -> str:
        return _PROBLEMS[self].when


@dataclass(frozen=True)
class _Problem:
    status: int
    title: str
    when: str


_PROBLEMS = {
    ErrorCode.INVALID_REQUEST: _Problem(
        400,
        "Invalid request",
        "malformed JSON, unknown field, bad resource or holder, ttl out of bounds, duplicated "
        "`Fence-Token`/`Idempotency-Key`, malformed `Idempotency-Key`, a request target that "
        "is not a path, a `Connection` header naming `Idempotency-Key`, `Fence-*`, "
        "`Content-Length` or `Transfer-Encoding`, a fenced path with empty, `.` or `..` "
        "segments or a NUL (`%00`), JSON nested too deeply",
    ),
    ErrorCode.MISSING_IDEMPOTENCY_KEY: _Problem(
        400, "Idempotency-Key required", "the route requires one"
    ),
    ErrorCode.MISSING_TOKEN: _Problem(
        401, "Fence-Token required", "fenced route, no `Fence-Token`"
    ),
    ErrorCode.UNAUTHORIZED: _Problem(
        401,
        "Credential required",
        "admin call without a valid admin token (or the admin API is off); with `auth:`, "
        "an acquire, lease view or read without a client's key (or the admin token)",
    ),
    ErrorCode.INVALID_TOKEN: _Problem(
        403,
        "Fence-Token not issued here",
        "malformed, unknown or forged token; looked up before a body still on its way is "
        "waited for (renew and release: before any), the connection then closed",
    ),
    ErrorCode.FORBIDDEN: _Problem(
        403,
        "Right not granted",
        "with `auth:`, the client's `may` does not include what the call needs; on renew "
        "or a fenced write, the lease's client is no longer configured (or the lease was "
        "taken without `auth:`)",
    ),
    ErrorCode.FORBIDDEN_RESOURCE: _Problem(
        403,
        "Resource outside the client's scope",
        "with `auth:`, the resource (or the effect's) matches none of the client's "
        "`resources` globs (on renew or a fenced write: the globs configured now)",
    ),
    ErrorCode.WRONG_RESOURCE: _Problem(
        403, "Token guards another resource", "the token's lease guards another resource"
    ),
    ErrorCode.NO_ROUTE: _Problem(404, "No route", "nothing in the policy matches; never forwarded"),
    ErrorCode.NOT_FOUND: _Problem(404, "Not found", "no such effect"),
    ErrorCode.METHOD_NOT_ALLOWED: _Problem(
        405, "Method not allowed", "wrong method on a control endpoint"
    ),
    ErrorCode.STALE_EPOCH: _Problem(
        409,
        "Lease no longer current",
        "the token's lease is no longer current: superseded, revoked or released",
    ),
    ErrorCode.LEASE_EXPIRED: _Problem(
        409, "Lease expired", "the lease is current but past `expires_at`"
    ),
    ErrorCode.LEASE_HELD: _Problem(
        409, "Resource already leased", "acquire while a lease is live (`Retry-After` set)"
    ),
    ErrorCode.EFFECT_IN_FLIGHT: _Problem(
        409,
        "Effect in flight",
        "`max_in_flight` effects are in flight (being forwarded, or being settled as not "
        "sent after a lost admission answer); or probe or resolve of an effect whose "
        "request may still be in flight",
    ),
    ErrorCode.EFFECT_SETTLED: _Problem(
        409,
        "Effect already settled",
        "probe or resolve on an effect that is no longer in doubt; a lost answer to a request "
        "whose effect was meanwhile settled not committed",
    ),
    ErrorCode.REQUEST_IN_PROGRESS: _Problem(
        409,
        "Request in progress",
        "the same idempotency key is in flight: being forwarded, or being settled as not "
        "sent after the store's answer to its admission was lost",
    ),
    ErrorCode.LEASE_TOO_SHORT: _Problem(
        409,
        "Lease too short for the upstream timeout",
        "the lease would expire before the upstream timeout ends: renew first (`needed_s`: "
        "the timeout, `remaining_s`: what was left)",
    ),
    ErrorCode.CONFLICTING_EVIDENCE: _Problem(
        409,
        "Conflicting evidence about an effect",
        "an effect's evidence contradicts its settled state; the resource is blocked until an "
        "operator resolves it (a probe of it is refused)",
    ),
    ErrorCode.RELOAD_REFUSED: _Problem(
        409,
        "Policy reload refused",
        "the policy file read again is invalid, changes a key that needs a restart, or "
        "would take the route or probe of an effect in doubt away: nothing was changed, "
        "the proxy serves the policy it served (`detail` says why)",
    ),
    ErrorCode.NO_PROBE: _Problem(
        409,
        "Route has no probe",
        "probe of an effect whose route has no `reconcile` block: nothing can be asked, "
        "an operator resolves it; nothing is recorded",
    ),
    ErrorCode.REQUEST_TIMEOUT: _Problem(
        408,
        "Request body too slow",
        "the body did not arrive within `limits.body_timeout_s`; nothing was recorded or "
        "forwarded, and the connection is closed",
    ),
    ErrorCode.PAYLOAD_TOO_LARGE: _Problem(413, "Payload too large", "body over the route's limit"),
    ErrorCode.HEADERS_TOO_LARGE: _Problem(
        431,
        "Request headers too large",
        "one header over 8 KiB or all over 32 KiB, or (counted as sent) a header block "
        "over 40 KiB or 256 lines; the connection is closed",
    ),
    ErrorCode.URI_TOO_LONG: _Problem(
        414,
        "Request target too long",
        "the request target (path and query) is over 8 KiB; the connection is closed",
    ),
    ErrorCode.IDEMPOTENCY_KEY_REUSED: _Problem(
        422,
        "Idempotency-Key reused for another request",
        "same key, different request fingerprint (method, path, query, body hash)",
    ),
    ErrorCode.RESOURCE_BLOCKED: _Problem(
        423,
        "Resource blocked by an effect in doubt",
        "an effect on the resource is in doubt or conflicting (acquire and mutate both)",
    ),
    ErrorCode.RATE_LIMITED: _Problem(
        429,
        "Quota exceeded",
        "acquire over the quota subject's `quotas.acquires_per_s` (after its `burst`), or while "
        "it holds `quotas.live_leases` live leases; nothing was granted (`Retry-After` set)",
    ),
    ErrorCode.INTERNAL_ERROR: _Problem(500, "Internal error", "a bug; nothing was forwarded"),
    ErrorCode.UPSTREAM_UNREACHABLE: _Problem(
        502,
        "Upstream unreachable",
        "nothing was sent (the upstream could not be reached, or the send deadline passed "
        "first); effect `NOT_SENT`",
    ),
    ErrorCode.UPSTREAM_ANSWER_TOO_LARGE: _Problem(
        502,
        "Upstream answer too large",
        "a fenced write's answer was over 16 MiB: the effect is recorded by its status "
        "(`upstream_status`; committed: the write was applied), the answer was neither "
        "passed on nor kept and cannot be replayed",
    ),
    ErrorCode.STORE_UNAVAILABLE: _Problem(
        503,
        "Store unavailable",
        "the store did not answer, refused a write, or cannot be trusted (its SQLite file was "
        "deleted or replaced): before dispatch nothing was decided; after it the receipt was "
        "not recorded and the effect stays in doubt; if the answer to the admission itself "
        "was lost, nothing was sent, and `settled` says whether the admission's record "
        "(`effect_id`), if written, is settled `NOT_SENT` yet (true: the operation can be "
        "retried; false: the proxy keeps settling it) (`Retry-After` set)",
    ),
    ErrorCode.OVERLOADED: _Problem(
        503,
        "Proxy overloaded",
        "`limits.max_requests` proxied requests are being handled, or the connection was "
        "the one waiting longest on a request with no verified credential (for its "
        "token's lookup or its body) and its room was needed (`limits.max_connections`, "
        "`limits.max_unverified_waits`); "
        "nothing was recorded or forwarded (`Retry-After` set, the connection is closed)",
    ),
    ErrorCode.RECOVERY_WINDOW: _Problem(
        503,
        "Key unknown after a failover",
        "the store lost history (a failover to an asynchronous standby) and the recovery "
        "window is open: the idempotency key is not in the store, the old primary may have "
        "applied it, and the route's probe cannot tell yet (or it has none): nothing was "
        "recorded or forwarded (`Retry-After` set)",
    ),
    ErrorCode.KEY_APPLIED_REQUEST_UNKNOWN: _Problem(
        409,
        "Key applied before a failover; its request unknown",
        "in the recovery window, the route's probe says a request with this idempotency key "
        "was applied before the failover; the store lost its record and the request's "
        "fingerprint with it, so whether it was this request (this payload) cannot be told: "
        "not a replay, and nothing was recorded or forwarded",
    ),
    ErrorCode.OUTCOME_UNKNOWN: _Problem(
        504,
        "Outcome unknown",
        "sent, outcome unknown: no complete answer, or one whose head the proxy does not read "
        "(a header field over 64 KiB, over 256 fields); effect `UNKNOWN`, resource now "
        "blocked; on a pass-through route, the same without an effect (none is recorded "
        "there)",
    ),
    ErrorCode.EXPECTATION_FAILED: _Problem(
        417,
        "Expectation not supported",
        "an `Expect` header other than `100-continue`; nothing was read or forwarded",
    ),
}
