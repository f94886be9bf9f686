"""The fenced request path: admit, forward once, record the receipt, answer truly.

Before admission anything may refuse the request: nothing has been recorded or
sent. After admission the effect is DISPATCHING in the store, and from then on
the worker's answer comes from the effect lifecycle (core/lifecycle.py), never
from a guess: "nothing was forwarded" is said only when no byte left.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from typing import Any

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from core import failpoints, telemetry
from core.codes import ErrorCode
from core.fencing import Replay
from core.lifecycle import BLOCKING, Answer, Event
from core.outcomes import Answered, DispatchResult, Lost, NotSent, TooLateToSend, receipt_event
from core.probing import Conclusion
from core.records import (
    EffectRecord,
    EffectState,
    IdempotencyRecord,
    Refusal,
    StoredResponse,
    fence_headers,
)
from core.send_deadline import SendDeadline
from policies import RESOURCE_RE, Route, RouteMatch
from proxy import forwarding, periodic
from proxy.auth import take_credentials
from proxy.problems import problem, refusal_response
from proxy.requests import (
    fingerprint,
    idempotency_key,
    read_body,
    refuse_unissued_token_before_inviting,
    single_header,
)
from proxy.runtime import UPSTREAMS, Runtime, Upstreams
from proxy.tokens import token_hash, well_formed
from reconcile import prober
from store import AdmissionInDoubt, Admitted, NewEffect, Receipt, StoreError, UnknownKey

log = logging.getLogger("fenceproxy")


async def handle(request: web.Request, match: RouteMatch, runtime: Runtime) -> web.StreamResponse:
    route = match.route
    assert route.resource is not None
    if any(segment in ("", ".", "..") for segment in request.path.split("/")[1:]):
        # One object, one resource: "a/../b", "./b" and "b" must not be fenced apart.
        raise Refusal(
            ErrorCode.INVALID_REQUEST,
            "the path of a fenced route may not have empty, '.' or '..' segments",
            {"route": route.name},
        )
    if "\x00" in request.path:
        # The effect keeps its path (the probe's parameters are read from it), and
        # PostgreSQL's text cannot hold a NUL: refused on every store alike.
        raise Refusal(
            ErrorCode.INVALID_REQUEST,
            "the path of a fenced route may not hold a NUL (%00)",
            {"route": route.name},
        )
    refused = route.resource.refused_value(match.params)
    if refused is not None:
        # A value that holds the template's own separators could pass for another
        # resource's structure, in or out of a client's globs (policies/templates.py).
        name, char = refused
        raise Refusal(
            ErrorCode.INVALID_REQUEST,
            f"path parameter {{{name}}} may not contain {char!r}: it separates the parts "
            f"of resource {route.resource.raw!r}",
            {"route": route.name, "parameter": name},
        )
    resource = route.resource.render(match.params)
    telemetry.about(resource=resource)
    if not RESOURCE_RE.match(resource):
        raise Refusal(
            ErrorCode.INVALID_REQUEST, "the path names no valid resource", {"route": route.name}
        )
    try:
        token = single_header(request, "Fence-Token")
        if token is None:
            raise Refusal(ErrorCode.MISSING_TOKEN, f"route {route.name} needs a Fence-Token header")
        if not well_formed(token):
            raise Refusal(ErrorCode.INVALID_TOKEN, "the Fence-Token is not one this proxy issued")
        key = idempotency_key(request)
        if key is None and route.idempotency.required:
            raise Refusal(
                ErrorCode.MISSING_IDEMPOTENCY_KEY,
                f"route {route.name} needs an Idempotency-Key header",
            )
        await refuse_unissued_token_before_inviting(request, token, runtime.store)
        body = await read_body(request, route.max_body_bytes)
    except Refusal as exc:
        exc.context.update(route=route.name, resource=resource)
        raise
    new = NewEffect(
        route=route.name,
        resource=resource,
        idempotency_key=key,
        fingerprint=fingerprint(request.method, request.path, request.query_string, body),
        method=request.method,
        path=request.path,
        max_in_flight=route.max_in_flight,
        upstream_timeout_s=route.upstream.timeout_s,
        retain_s=route.idempotency.retain_s,
        upstream_idempotent=route.upstream_idempotent,
        send_window_s=route.upstream.send_window_s,
    )
    standing = take_credentials(request).standing
    # Started before the admission's transaction begins: the effect's stored deadline
    # counts from a moment inside it, so this budget always ends first.
    send_by = SendDeadline.start(route.upstream.send_window_s, forwarding.SEND_CLOCK)
    # This handler cancelled while its admission runs in a batch: nothing will be sent.
    left = functools.partial(_settle_left_admission, runtime)
    try:
        decision = await telemetry.step(
            "admission", runtime.store.admit(token_hash(token), new, standing, left=left)
        )
        if isinstance(decision, UnknownKey):
            assert key is not None  # only a key is unknown
            unknown = await _ask_about_unknown_key(
                runtime,
                request.config_dict[UPSTREAMS],
                route,
                resource,
                request.path,
                key,
                decision,
            )
            if unknown is not None:
                runtime.metrics.count_request(route.name, "refused")
                return unknown
            send_by = SendDeadline.start(route.upstream.send_window_s, forwarding.SEND_CLOCK)
            decision = await telemetry.step(
                "admission",
                runtime.store.admit(token_hash(token), new, standing, key_cleared=True, left=left),
            )
            assert not isinstance(decision, UnknownKey)
    except AdmissionInDoubt as lost:
        return await _settle_lost_admission(runtime, route, lost)
    if isinstance(decision, Admitted):
        return await _dispatch_admitted(request, match, runtime, decision, body, send_by)
    if isinstance(decision, Replay):
        runtime.metrics.count_request(route.name, "replayed")
        return _replay(decision.record)
    runtime.metrics.count_request(route.name, "refused")
    runtime.metrics.count_refusal(decision.code)  # recorded by the admission itself
    return refusal_response(decision)


# After a lost admission answer the store is asked again at once, then, if it does not
# answer, in the background with pauses growing from this one (proxy/periodic.py)
# until it does.
UNSENT_RETRY_FIRST_S = 0.2


async def _settle_lost_admission(
    runtime: Runtime, route: Route, lost: AdmissionInDoubt
) -> web.Response:
    """The admission's COMMIT was sent and its answer lost: the effect may be recorded
    DISPATCHING, but this request was never forwarded. Find out and settle it NOT_SENT
    (freeing its key) so that the worker's retry goes through, and tell the worker
    only what is true: nothing was sent, and whether the record is settled yet."""
    log.warning("the answer to the admission of %s was lost: %s", lost.effect_id, lost)
    # Counted as every store_unavailable is (the middleware counts the others).
    runtime.metrics.count_refusal(ErrorCode.STORE_UNAVAILABLE)
    lost_answer = f"the store's answer to the admission was lost ({lost})"
    try:
        effect = await _settle_unsent(runtime, lost)
    except StoreError as exc:
        log.warning("%s is not settled yet: %s; trying again in the background", lost, exc)
        runtime.settle_in_background(_settle_until_done(runtime, lost), lost.effect_id)
        runtime.metrics.count_request(route.name, "unrecorded")
        return problem(
            ErrorCode.STORE_UNAVAILABLE,
            f"{lost_answer}, and the store does not answer now ({exc}): nothing was sent "
            f"to the upstream. The admission may have been recorded as in flight (effect "
            f"{lost.effect_id}); this proxy keeps settling it as not sent, and until then "
            "that record stands in the way of a retry with the same Idempotency-Key "
            "(request_in_progress, or resource_blocked once a sweep finds it past its "
            f"deadline) and counts as in flight on {lost.resource}",
            effect_id=lost.effect_id,
            resource=lost.resource,
            settled=False,
        )
    runtime.metrics.count_request(route.name, "not_sent")
    if effect is None:
        return problem(
            ErrorCode.STORE_UNAVAILABLE,
            f"{lost_answer}: nothing was sent to the upstream, and the admission was not "
            "recorded; the operation can be retried",
            resource=lost.resource,
            settled=True,
        )
    if effect.state is EffectState.NOT_SENT:
        return problem(
            ErrorCode.STORE_UNAVAILABLE,
            f"{lost_answer}: nothing was sent to the upstream; the admission had been "
            f"recorded (effect {effect.id}) and is now settled NOT_SENT, so the operation "
            "can be retried",
            effect_id=effect.id,
            resource=effect.resource,
            settled=True,
            state=effect.state.value,
        )
    # Someone else decided first (an operator, a probe, a conflict): their word stands.
    by = f" (settled by {effect.settled_by})" if effect.settled_by else ""
    return problem(
        ErrorCode.STORE_UNAVAILABLE,
        f"{lost_answer}: nothing was sent to the upstream; the admission had been recorded "
        f"(effect {effect.id}), which is {effect.state.value}{by}",
        effect_id=effect.id,
        resource=effect.resource,
        settled=effect.state not in BLOCKING,
        state=effect.state.value,
    )


def _lost_answer(lost: AdmissionInDoubt) -> str:
    return f"the store's answer to its admission was lost ({lost}); its request was never sent"


async def _settle_unsent(
    runtime: Runtime, lost: AdmissionInDoubt, reason: str | None = None
) -> EffectRecord | None:
    return await runtime.store.settle_unsent(
        lost.effect_id, lost.resource, reason if reason is not None else _lost_answer(lost)
    )


async def _settle_until_done(
    runtime: Runtime, lost: AdmissionInDoubt, reason: str | None = None, wait_first: bool = True
) -> None:
    async def settle() -> None:
        effect = await _settle_unsent(runtime, lost, reason)
        state = "not recorded" if effect is None else effect.state.value
        log.info("the effect %s of an unsent admission is settled: %s", lost.effect_id, state)

    # Neither a store that does not answer nor a bug ends it: the record would wait for
    # the sweep.
    await periodic.Periodic(
        periodic.SETTLE_UNSENT,
        settle,
        UNSENT_RETRY_FIRST_S,
        runtime.metrics.count_background_failure,
        wait_first=wait_first,
        until_done=True,
        about=f" of {lost.effect_id}",
    ).run()


def _settle_left_admission(runtime: Runtime, left: AdmissionInDoubt) -> None:
    """The handler was cancelled (`serve` past a stop's grace, a test server whose
    client went away) while its admission ran in a batch, which recorded the effect
    DISPATCHING, or may have: no byte of it will be sent. Settled NOT_SENT now, in the
    background (the batch is over: the store's answer is final), as after a lost
    admission answer, not left for the sweep to find UNKNOWN and block the resource."""
    reason = f"{left}: the request's handler was cancelled before it was sent"
    runtime.settle_in_background(
        _settle_until_done(runtime, left, reason, wait_first=False), left.effect_id
    )


# Without a probe, the recovery window stays open until an operator closes it: a worker
# asks again at this pace meanwhile.
RECOVERY_RETRY_AFTER_S = 30


async def _ask_about_unknown_key(
    runtime: Runtime,
    upstreams: Upstreams,
    route: Route,
    resource: str,
    path: str,
    key: str,
    unknown: UnknownKey,
) -> web.Response | None:
    """In the recovery window, a key the store does not know may have been applied by the
    old primary before the failover. Ask the route's probe: applied, the worker is told
    that a request with this key was applied, never that this one was (not a replay: the
    store lost the fingerprint, so another payload under the key, refused
    `idempotency_key_reused` before the failover, cannot be told from this one); not
    applied, and believed (the settle window counted from the opening of the recovery
    window, after anything the old primary sent), None: the key is new and is forwarded.
    Otherwise, or with no probe, refused with `recovery_window`."""
    window = unknown.window
    if route.reconcile is None:
        runtime.metrics.count_refusal(ErrorCode.RECOVERY_WINDOW)
        return problem(
            ErrorCode.RECOVERY_WINDOW,
            f"the store lost history ({window.reason}); idempotency key {key!r} is not in "
            "it and may have been applied before the failover, and route "
            f"{route.name} has no probe to ask: refused until an operator closes the "
            "recovery window (`fenceproxy store close-recovery`)",
            headers={"Retry-After": str(RECOVERY_RETRY_AFTER_S)},
            route=route.name,
            resource=resource,
            recovery_opened_at=window.opened_at,
        )
    verdict = await prober.probe_unknown_key(
        runtime.store, upstreams.session, route, resource, path, key, window.opened_at
    )
    if verdict.conclusion is Conclusion.NOT_COMMITTED:
        return None
    if verdict.conclusion is Conclusion.COMMITTED:
        runtime.metrics.count_refusal(ErrorCode.KEY_APPLIED_REQUEST_UNKNOWN)
        return problem(
            ErrorCode.KEY_APPLIED_REQUEST_UNKNOWN,
            f"the store lost history ({window.reason}); the upstream's probe says a request "
            f"with idempotency key {key!r} was applied before the failover "
            f"({verdict.detail}), but the store lost that request's record and payload, so "
            "the proxy cannot tell whether it was this request: do not take this request as "
            "applied, check the upstream's own record of the key; nothing was forwarded",
            route=route.name,
            resource=resource,
            recovery_opened_at=window.opened_at,
        )
    wait_s = max(1, math.ceil(verdict.settle_left_s))
    runtime.metrics.count_refusal(ErrorCode.RECOVERY_WINDOW)
    return problem(
        ErrorCode.RECOVERY_WINDOW,
        f"the store lost history ({window.reason}); idempotency key {key!r} is not in it "
        f"and may have been applied before the failover, and the probe cannot tell yet "
        f"({verdict.detail}): nothing was forwarded, ask again",
        headers={"Retry-After": str(wait_s)},
        route=route.name,
        resource=resource,
        recovery_opened_at=window.opened_at,
    )


async def _dispatch_admitted(
    request: web.Request,
    match: RouteMatch,
    runtime: Runtime,
    admitted: Admitted,
    body: bytes,
    send_by: SendDeadline,
) -> web.StreamResponse:
    failpoints.reach(failpoints.ADMITTED)
    route = match.route
    effect = admitted.effect
    telemetry.about(effect_id=effect.id, epoch=effect.epoch)
    fence = fence_headers(effect.resource, epoch=effect.epoch, effect_id=effect.id)
    answer: forwarding.UpstreamResponse | None = None
    cancelled: asyncio.Task[Any] | None = None
    try:
        # Anything that fails before the request is handed to the client is certain
        # not to have sent a byte: the effect is settled NOT_SENT at once.
        url: URL = forwarding.upstream_url(route.upstream, request)
        headers: CIMultiDict[str] = forwarding.upstream_headers(
            request,
            fence if route.forward_fence_headers else None,
            take_credentials(request),
        )
    except Exception as exc:
        log.exception("could not build the upstream request for %s", effect.id)
        result: DispatchResult = NotSent(f"the upstream request could not be built: {exc}")
    else:
        started = time.monotonic()
        try:
            result, answer = await telemetry.step(
                "upstream",
                forwarding.dispatch(
                    request.config_dict[UPSTREAMS].pools.fenced(route.upstream),
                    route.upstream,
                    request.method,
                    url,
                    headers,
                    forwarding.upstream_body(request, body),
                    send_by,
                ),
                headers,
                _dispatched,
            )
        except asyncio.CancelledError:
            # The dispatch runs in the handler's own task: a shield would cost a task on
            # every request, for a cancellation that `serve`'s server makes only once a
            # stop's grace is over (it never cancels a handler whose client went away;
            # aiohttp's test server does, and ends the send here too). Either way the
            # request may have left: the receipt says so (UNKNOWN), and is written
            # before the cancellation goes on.
            cancelled = asyncio.current_task()
            failpoints.reach(failpoints.CANCELLED)
            result = Lost(
                "the proxy shut down (grace period over) before the answer arrived"
                if runtime.stopping
                else "the request's handler was cancelled before the answer arrived"
            )
        if isinstance(result, TooLateToSend):
            # This replica was slow (paused, overloaded) between its admission and its
            # send: another may already have taken the effect for never sent.
            log.warning("%s not sent: %s", effect.id, result.reason)
            runtime.metrics.count_send_deadline_passed(route.name)
        else:
            runtime.metrics.observe_upstream(route.name, time.monotonic() - started)
            failpoints.reach(failpoints.SENT)
    if isinstance(result, Lost) and runtime.shutting_down:
        result = Lost("the proxy shut down (grace period over) before the answer arrived")
    event, reason = receipt_event(result, route.outcomes)
    stored = None
    if event is Event.ANSWERED_COMMITTED and answer is not None:
        # A body over the replay limit is not kept at all: a replay says so, and never
        # serves a part of it as if it were the answer.
        kept = not answer.over_limit and len(answer.body) <= forwarding.REPLAY_BODY_LIMIT
        stored = StoredResponse(
            answer.status,
            forwarding.replayable(answer.headers),
            answer.body if kept else b"",
            reason=answer.reason,
            body_kept=kept,
        )
    upstream_status = result.status if isinstance(result, Answered) else None
    if cancelled is not None:
        # Once DISPATCHING, an effect is not left for the sweep while its receipt can
        # still be written: the cancellation goes on once it is (a second one, while
        # writing it, leaves it to the sweep).
        cancelled.uncancel()
    try:
        receipt = await telemetry.step(
            "receipt",
            runtime.store.finish_effect(
                effect.id, event, upstream_status, reason, stored, admitted.resends, effect
            ),
        )
    except Exception:
        # Whatever failed (the store, a driver, a bug), the request may have left: the
        # effect stays DISPATCHING, its sweep makes it UNKNOWN, and the worker is told
        # exactly that, never "nothing was forwarded".
        log.exception("the receipt of %s could not be recorded", effect.id)
        runtime.metrics.count_request(route.name, "unrecorded")
        if cancelled is not None:
            raise asyncio.CancelledError() from None
        return _unrecorded(effect, reason, upstream_status, fence)
    runtime.metrics.count_request(route.name, receipt.effect.state.value.lower())
    runtime.metrics.count_receipt(receipt)
    if receipt.effect.state is EffectState.UNKNOWN:
        log.warning(
            "%s on %s: %s; the resource is blocked until it is reconciled",
            effect.id,
            effect.resource,
            reason,
        )
        if runtime.reconciler is not None:
            runtime.reconciler.wake.set()
    if cancelled is not None:
        raise asyncio.CancelledError()
    return _answer(receipt, reason, upstream_status, answer, fence)


def _dispatched(
    dispatched: tuple[DispatchResult, forwarding.UpstreamResponse | None],
) -> dict[str, telemetry.Value]:
    """The upstream step's attributes: the answer's status, or why there was none."""
    result = dispatched[0]
    if isinstance(result, Answered):
        return {"http.response.status_code": result.status}
    return {"error": result.reason}


def _answer(
    receipt: Receipt,
    reason: str,
    upstream_status: int | None,
    answer: forwarding.UpstreamResponse | None,
    fence: dict[str, str],
) -> web.StreamResponse:
    """The worker's answer, as the lifecycle table says for this receipt."""
    effect = receipt.effect
    kind = receipt.transition.answer
    if kind is Answer.RESPONSE and answer is not None and answer.over_limit:
        applied = (
            "the write was applied upstream"
            if effect.state is EffectState.COMMITTED
            else f"the effect is {effect.state.value}"
        )
        return problem(
            ErrorCode.UPSTREAM_ANSWER_TOO_LARGE,
            f"{reason}: {applied}, but its answer was over "
            f"{forwarding.UPSTREAM_BODY_LIMIT} bytes, so it was neither passed on nor kept "
            "and cannot be replayed; do not send the operation again",
            headers=fence,
            effect_id=effect.id,
            state=effect.state.value,
            upstream_status=upstream_status,
            limit=forwarding.UPSTREAM_BODY_LIMIT,
        )
    if kind is Answer.RESPONSE and answer is not None:
        # The upstream's headers are done with (what is kept for replays was taken
        # before the receipt): the fence goes into them, not into a copy of them.
        answer.headers.update(fence)
        return web.Response(
            status=answer.status, reason=answer.reason, headers=answer.headers, body=answer.body
        )
    if kind is Answer.NOT_SENT:
        return problem(
            ErrorCode.UPSTREAM_UNREACHABLE,
            f"{reason}; nothing was sent, the operation can be retried",
            headers=fence,
            effect_id=effect.id,
        )
    if kind is Answer.UNKNOWN:
        return problem(
            ErrorCode.OUTCOME_UNKNOWN,
            f"{reason}; {effect.resource} is blocked until the effect is reconciled",
            headers=fence,
            effect_id=effect.id,
            resource=effect.resource,
            epoch=effect.epoch,
            upstream_status=upstream_status,
        )
    if kind is Answer.CONFLICT:
        return problem(
            ErrorCode.CONFLICTING_EVIDENCE,
            f"{reason}, which contradicts what was established before; "
            f"{effect.resource} is blocked until an operator resolves {effect.id}",
            headers=fence,
            effect_id=effect.id,
            resource=effect.resource,
            upstream_status=upstream_status,
            key_holder=receipt.key_holder,
        )
    if kind is Answer.SETTLED and effect.state is EffectState.COMMITTED:
        return _committed_by_reconciliation(
            effect.id, effect.state, effect.settled_by, fence, replayed=False
        )
    # Settled not committed while the answer was on its way, and the answer was lost.
    return problem(
        ErrorCode.EFFECT_SETTLED,
        f"{reason}; meanwhile the effect was settled {effect.state.value} "
        f"(by {effect.settled_by or 'its receipt'}): it did not take effect",
        headers=fence,
        effect_id=effect.id,
        state=effect.state.value,
    )


def _unrecorded(
    effect: EffectRecord, reason: str, upstream_status: int | None, fence: dict[str, str]
) -> web.Response:
    return problem(
        ErrorCode.STORE_UNAVAILABLE,
        f"{reason}, but the receipt could not be recorded; the request may have taken "
        f"effect, and {effect.resource} stays blocked until the effect is reconciled",
        headers=fence,
        effect_id=effect.id,
        resource=effect.resource,
        upstream_status=upstream_status,
    )


def _committed_by_reconciliation(
    effect_id: str,
    state: EffectState,
    settled_by: str | None,
    headers: dict[str, str],
    replayed: bool = True,
) -> web.Response:
    return web.json_response(
        {
            "replayed": replayed,
            "effect_id": effect_id,
            "state": state.value,
            "settled_by": settled_by,
            "detail": "the operation was committed, as established by reconciliation; "
            "the upstream's response was never seen, so there is none to replay",
        },
        status=200,
        headers=headers,
    )


def _replay(record: IdempotencyRecord) -> web.Response:
    telemetry.about(effect_id=record.effect_id, epoch=record.epoch)
    fence = fence_headers(record.resource, epoch=record.epoch, effect_id=record.effect_id)
    fence[forwarding.REPLAYED] = "true"
    stored = record.response
    if stored is None:
        # Settled by a probe or an operator: committed, but no response was ever seen.
        return _committed_by_reconciliation(
            record.effect_id, record.effect_state, record.settled_by, fence
        )
    if not stored.body_kept:
        return web.json_response(
            {
                "replayed": True,
                "effect_id": record.effect_id,
                "state": record.effect_state.value,
                "upstream_status": stored.status,
                "answer_kept": False,
                "detail": f"the operation was committed: the upstream answered {stored.status}; "
                f"its answer was over the replay limit ({forwarding.REPLAY_BODY_LIMIT} bytes) "
                "and was not kept, so it cannot be replayed",
            },
            status=200,
            headers=fence,
        )
    headers = CIMultiDict(stored.headers)
    headers.update(fence)
    return web.Response(
        status=stored.status, reason=stored.reason, headers=headers, body=stored.body
    )
