"""What the client raises: the proxy's refusals, typed by their code, and the upstream's
own error answers.

Every problem+json answer of the proxy raises a `FenceError` subclass named after its
`code` in CamelCase (`stale_epoch` → `StaleEpoch`); a code this version does not know
(a newer proxy) raises `FenceError` itself. The list is checked against the proxy's
code table by the server's tests (tests/client/test_errors_match_contract.py), so a code
cannot be added there without its class here. No message here ever carries the lease's
token: the proxy never echoes it, and the client never puts it in one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx


class FenceError(Exception):
    """A refusal (or an answer in doubt) from the proxy itself, as problem+json.

    `status` is the HTTP status, `code` the stable code, `detail` the proxy's sentence,
    `problem` the whole problem document, `retry_after_s` the `Retry-After` header in
    seconds when there was one.
    """

    code: str = ""

    def __init__(
        self, status: int, problem: Mapping[str, Any], retry_after_s: float | None = None
    ) -> None:
        self.status = status
        self.problem: dict[str, Any] = dict(problem)
        self.code = str(self.problem.get("code", ""))
        self.detail = str(self.problem.get("detail", ""))
        self.retry_after_s = retry_after_s
        super().__init__(f"{status} {self.code}: {self.detail}")


class UpstreamError(Exception):
    """A non-2xx answer relayed from the upstream itself (not a refusal of the proxy).

    The proxy forwarded the request and the upstream answered it: `response` is that
    answer. Pass `raise_for_status=False` to `request` to get it returned instead.
    """

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status = response.status_code
        super().__init__(
            f"the upstream answered {response.status_code} to "
            f"{response.request.method} {response.request.url.path}"
        )


class LeaseLost(Exception):
    """Raised by the client itself, not by a refusal: the lease is known to be gone
    (a renewal or a request was refused as stale or expired, or its ttl ran out
    without a renewal). `lease.check()` raises it in sync code; in an
    `async with client.lease(..., cancel_on_lost=True)` block the block is cancelled
    and this is raised from the `async with` in its place."""

    def __init__(self, resource: str, epoch: int, why: str) -> None:
        self.resource = resource
        self.epoch = epoch
        self.why = why
        super().__init__(f"the lease on {resource} at epoch {epoch} is lost: {why}")


class InvalidRequest(FenceError):
    code = "invalid_request"


class MissingIdempotencyKey(FenceError):
    code = "missing_idempotency_key"


class MissingToken(FenceError):
    code = "missing_token"


class Unauthorized(FenceError):
    code = "unauthorized"


class InvalidToken(FenceError):
    code = "invalid_token"


class WrongResource(FenceError):
    code = "wrong_resource"


class NoRoute(FenceError):
    code = "no_route"


class NotFound(FenceError):
    code = "not_found"


class MethodNotAllowed(FenceError):
    code = "method_not_allowed"


class StaleEpoch(FenceError):
    """Your lease is no longer current: stop, your work was taken over."""

    code = "stale_epoch"


class LeaseExpired(FenceError):
    """Your lease is still current but past its expiry: renew it, or stop."""

    code = "lease_expired"


class LeaseHeld(FenceError):
    """Someone else holds a live lease on the resource (`retry_after_s` says how long)."""

    code = "lease_held"


class EffectInFlight(FenceError):
    code = "effect_in_flight"


class EffectSettled(FenceError):
    code = "effect_settled"


class RequestInProgress(FenceError):
    code = "request_in_progress"


class LeaseTooShort(FenceError):
    code = "lease_too_short"


class ConflictingEvidence(FenceError):
    code = "conflicting_evidence"


class NoProbe(FenceError):
    code = "no_probe"


class PayloadTooLarge(FenceError):
    code = "payload_too_large"


class HeadersTooLarge(FenceError):
    code = "headers_too_large"


class UriTooLong(FenceError):
    code = "uri_too_long"


class IdempotencyKeyReused(FenceError):
    code = "idempotency_key_reused"


class ResourceBlocked(FenceError):
    """An effect on the resource is in doubt (someone's, maybe yours): `effect_ids`
    names them. Wait for their settlement; nothing can be done on the resource before."""

    code = "resource_blocked"

    @property
    def effect_ids(self) -> list[str]:
        ids = self.problem.get("effect_ids")
        return [str(effect_id) for effect_id in ids] if isinstance(ids, list) else []


class InternalError(FenceError):
    code = "internal_error"


class UpstreamUnreachable(FenceError):
    """Nothing was sent to the upstream; the request can be sent again."""

    code = "upstream_unreachable"


class UpstreamAnswerTooLarge(FenceError):
    """The upstream answered a fenced write with more than 16 MiB: the effect is
    recorded by that answer's status (`upstream_status`; a committed one means the
    write was applied), and the answer itself is gone: it cannot be replayed. Never
    send the operation again under a new idempotency key."""

    code = "upstream_answer_too_large"

    @property
    def upstream_status(self) -> int | None:
        status = self.problem.get("upstream_status")
        return status if isinstance(status, int) else None


class StoreUnavailable(FenceError):
    code = "store_unavailable"


class OutcomeUnknown(FenceError):
    """The request was sent and nobody knows whether it took effect.

    Wait for the proxy to settle `effect_id` (`wait_settled`); never resend the
    operation under a new idempotency key, or it may happen twice.
    """

    code = "outcome_unknown"

    @property
    def effect_id(self) -> str:
        return str(self.problem.get("effect_id", ""))


class RequestTimeout(FenceError):
    code = "request_timeout"


class Overloaded(FenceError):
    code = "overloaded"


class Forbidden(FenceError):
    """Your client key lacks the right this call needs (`auth:` `may`)."""

    code = "forbidden"


class ForbiddenResource(FenceError):
    """The resource is outside your client key's `resources` globs."""

    code = "forbidden_resource"


class RateLimited(FenceError):
    """Your quota of live leases or acquires per second is used up (`retry_after_s`
    says when to ask again); acquiring with `wait_s` waits it out."""

    code = "rate_limited"


class ExpectationFailed(FenceError):
    """The request carried an `Expect` header other than `100-continue`."""

    code = "expectation_failed"


class RecoveryWindow(FenceError):
    """The store lost history in a failover and this idempotency key is not in it: it may
    have been applied before. Nothing was sent. Retry after `retry_after_s`; on a route
    without a probe, until an operator closes the recovery window."""

    code = "recovery_window"


class KeyAppliedRequestUnknown(FenceError):
    """After a failover lost the store's history, the route's probe says a request with
    this idempotency key was applied before; the store lost its payload, so whether it
    was this request cannot be told. Nothing was sent. Do not take it as this request
    applied (another payload under the same key would have been refused
    `idempotency_key_reused`): check the upstream's own record of the key."""

    code = "key_applied_request_unknown"


class ReloadRefused(FenceError):
    """An operator's policy reload was refused (an invalid file, a key that needs a
    restart, or a route or probe taken from effects in doubt): nothing changed, and the
    replica serves the policy it served before. Not a worker's error; the class exists
    so that every code of the contract has one."""

    code = "reload_refused"


def _by_code() -> dict[str, type[FenceError]]:
    return {cls.code: cls for cls in FenceError.__subclasses__()}


BY_CODE: Mapping[str, type[FenceError]] = _by_code()
"""Each code the client knows, with the class it raises."""
