"""The aiohttp application: control API under /_fence/, everything else by route."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from core.codes import ErrorCode
from core.fencing import Replay
from core.outcomes import Answered, Lost, NotSent, settle_dispatch
from core.probing import DEADLINE_MARGIN_S
from core.records import EffectState, IdempotencyRecord, StoredResponse
from policies import RESOURCE_RE, Policy, RouteMatch
from proxy import control, forwarding
from proxy.problems import ProblemError, problem, refusal_response
from proxy.requests import (
    check_header_sizes,
    fingerprint,
    idempotency_key,
    read_body,
    single_header,
)
from proxy.runtime import RUNTIME, Runtime, runtime_of
from proxy.tokens import token_hash, well_formed
from reconcile.prober import Reconciler
from store import Admitted, NewEffect, Store, StoreUnavailable, open_store

log = logging.getLogger("fenceproxy")

GC_INTERVAL_S = 60.0


def new_instance_id() -> str:
    """A name for a process that dispatches nothing (the CLI)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def default_instance_id(policy: Policy) -> str:
    """The same name across restarts, so a restarted proxy knows which DISPATCHING
    effects were its own (and can no longer be in flight)."""
    configured = os.environ.get("FENCEPROXY_INSTANCE_ID")
    return configured or f"{socket.gethostname()}:{policy.listen.port}"


def build_app(
    policy: Policy,
    store: Store | None = None,
    admin_token: str | None = None,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    if store is None:
        pool = (policy.store_pool.min_size, policy.store_pool.max_size)
        store = open_store(policy.store, clock, default_instance_id(policy), pool)
    app = web.Application(middlewares=[problem_middleware])
    runtime = Runtime(policy, store, admin_token)
    app[RUNTIME] = runtime
    app.cleanup_ctx.extend([_store_ctx, _client_ctx, _garbage_collector_ctx, _reconciler_ctx])
    control.add_routes(app)
    app.router.add_route("*", "/{tail:.*}", proxy_handler)
    return app


async def _store_ctx(app: web.Application) -> AsyncIterator[None]:
    runtime = app[RUNTIME]
    store = runtime.store
    await store.open()
    # Before the listener opens: whatever this instance had in flight when it last
    # stopped has an unknown fate now, and its resources must stay blocked.
    recovered = await store.recover(store.instance_id, DEADLINE_MARGIN_S)
    if recovered:
        log.warning("effects in flight at the last stop are now UNKNOWN: %s", recovered)
    yield
    await store.close()


async def _client_ctx(app: web.Application) -> AsyncIterator[None]:
    session = forwarding.new_client_session()
    app[RUNTIME].session = session
    yield
    # The grace period is over: requests still upstream are cut off here, and their
    # receipts must say so rather than blame the upstream.
    app[RUNTIME].shutting_down = True
    await session.close()


async def _garbage_collector_ctx(app: web.Application) -> AsyncIterator[None]:
    async def collect_forever() -> None:
        while True:
            try:
                removed = await app[RUNTIME].store.collect_garbage()
                if removed:
                    log.info("removed %d expired idempotency records", removed)
            except StoreUnavailable as exc:
                log.warning("idempotency garbage collection failed: %s", exc)
            await asyncio.sleep(GC_INTERVAL_S)

    task = asyncio.create_task(collect_forever(), name="idempotency-gc")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _reconciler_ctx(app: web.Application) -> AsyncIterator[None]:
    runtime = app[RUNTIME]
    assert runtime.session is not None
    reconciler = Reconciler(
        runtime.store,
        runtime.session,
        runtime.policy,
        DEADLINE_MARGIN_S,
        on_probe=runtime.metrics.count_probe,
    )
    runtime.reconciler = reconciler
    task = asyncio.create_task(reconciler.run(), name="reconciler")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal is problem+json; an unexpected error is still one, never a bare 500."""
    try:
        check_header_sizes(request)
        return await handler(request)
    except ProblemError as exc:
        await runtime_of(request).record_rejection(
            request,
            exc.code,
            route=exc.context.get("route"),
            resource=exc.context.get("resource"),
        )
        return exc.response()
    except StoreUnavailable as exc:
        log.error("store unavailable: %s", exc)
        return problem(
            ErrorCode.STORE_UNAVAILABLE, "the lease store did not answer; nothing was done"
        )
    except web.HTTPException as exc:
        if exc.status == 405:
            return problem(ErrorCode.METHOD_NOT_ALLOWED, f"{request.method} is not allowed here")
        if exc.status == 404:
            return problem(ErrorCode.NOT_FOUND, f"nothing at {request.path}")
        if exc.status == 413:
            return problem(ErrorCode.PAYLOAD_TOO_LARGE, "the body is too large")
        raise
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return problem(
            ErrorCode.INTERNAL_ERROR, "the proxy failed unexpectedly; nothing was forwarded"
        )


async def proxy_handler(request: web.Request) -> web.StreamResponse:
    runtime = runtime_of(request)
    if request.path.startswith("/_fence/"):
        raise ProblemError(
            ErrorCode.NO_ROUTE, f"no control endpoint {request.method} {request.path}"
        )
    match = runtime.policy.match(request.method, request.path)
    if match is None:
        raise ProblemError(ErrorCode.NO_ROUTE, f"no route matches {request.method} {request.path}")
    if match.route.fenced:
        return await _fenced(request, match, runtime)
    return await _pass_through(request, match, runtime)


async def _pass_through(
    request: web.Request, match: RouteMatch, runtime: Runtime
) -> web.StreamResponse:
    route = match.route
    body = await read_body(request, route.max_body_bytes)
    assert runtime.session is not None
    try:
        async with runtime.session.request(
            request.method,
            forwarding.upstream_url(route.upstream, request),
            headers=forwarding.upstream_headers(request, None),
            data=body,
            timeout=forwarding.client_timeout(route.upstream),
            allow_redirects=False,
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                reason=upstream.reason,
                headers=forwarding.downstream_headers(upstream.headers),
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_chunked(65536):
                await response.write(chunk)
            await response.write_eof()
            runtime.metrics.count_request(route.name, "passed_through")
            return response
    except (aiohttp.ClientError, TimeoutError) as exc:
        runtime.metrics.count_request(route.name, "upstream_unreachable")
        return problem(
            ErrorCode.UPSTREAM_UNREACHABLE,
            f"{route.upstream.name} did not answer: {exc}",
            route=route.name,
        )


async def _fenced(request: web.Request, match: RouteMatch, runtime: Runtime) -> web.StreamResponse:
    route = match.route
    assert route.resource is not None
    resource = route.resource.render(match.params)
    if not RESOURCE_RE.match(resource):
        raise ProblemError(
            ErrorCode.INVALID_REQUEST, "the path names no valid resource", route=route.name
        )
    try:
        token = single_header(request, "Fence-Token")
        if token is None:
            raise ProblemError(
                ErrorCode.MISSING_TOKEN, f"route {route.name} needs a Fence-Token header"
            )
        if not well_formed(token):
            raise ProblemError(
                ErrorCode.INVALID_TOKEN, "the Fence-Token is not one this proxy issued"
            )
        key = idempotency_key(request)
        if key is None and route.idempotency.required:
            raise ProblemError(
                ErrorCode.MISSING_IDEMPOTENCY_KEY,
                f"route {route.name} needs an Idempotency-Key header",
            )
        body = await read_body(request, route.max_body_bytes)
    except ProblemError as exc:
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
    )
    decision = await runtime.store.admit(token_hash(token), new)
    if isinstance(decision, Admitted):
        # Shielded: once recorded as DISPATCHING, the send and its receipt must run to the
        # end even if this handler is cancelled, or the effect would sit in doubt needlessly.
        return await asyncio.shield(_dispatch_admitted(request, match, runtime, decision, body))
    if isinstance(decision, Replay):
        runtime.metrics.count_request(route.name, "replayed")
        return _replay(decision.record)
    runtime.metrics.count_request(route.name, "refused")
    runtime.metrics.count_refusal(decision.code)  # recorded by the admission itself
    return refusal_response(decision)


async def _dispatch_admitted(
    request: web.Request, match: RouteMatch, runtime: Runtime, admitted: Admitted, body: bytes
) -> web.StreamResponse:
    route = match.route
    effect = admitted.effect
    fence = {
        "Fence-Epoch": str(effect.epoch),
        "Fence-Resource": effect.resource,
        "Fence-Effect-Id": effect.id,
    }
    assert runtime.session is not None
    started = time.monotonic()
    result, answer = await forwarding.dispatch(
        runtime.session,
        route.upstream,
        request.method,
        forwarding.upstream_url(route.upstream, request),
        forwarding.upstream_headers(request, fence if route.forward_fence_headers else None),
        body,
    )
    runtime.metrics.observe_upstream(route.name, time.monotonic() - started)
    if isinstance(result, Lost) and runtime.shutting_down:
        result = Lost("the proxy shut down (grace period over) before the answer arrived")
    state, reason = settle_dispatch(result, route.outcomes)
    runtime.metrics.count_request(route.name, state.value.lower())
    stored = None
    if state is EffectState.COMMITTED and answer is not None:
        kept = answer.body if len(answer.body) <= forwarding.REPLAY_BODY_LIMIT else b""
        stored = StoredResponse(answer.status, forwarding.replayable(answer.headers), kept)
    upstream_status = result.status if isinstance(result, Answered) else None
    try:
        await runtime.store.finish_effect(
            effect.id, state, upstream_status, reason, stored, admitted.resends
        )
    except StoreUnavailable:
        # The effect stays DISPATCHING in the store and is treated as in doubt; the
        # worker must not be told an outcome the store does not hold.
        return problem(
            ErrorCode.STORE_UNAVAILABLE,
            "the upstream answered but the receipt could not be recorded; "
            "the effect is in doubt until reconciled",
            headers=fence,
            effect_id=effect.id,
        )
    if state is EffectState.UNKNOWN:
        if runtime.reconciler is not None:
            runtime.reconciler.wake.set()
        return problem(
            ErrorCode.OUTCOME_UNKNOWN,
            f"{reason}; {effect.resource} is blocked until the effect is reconciled",
            headers=fence,
            effect_id=effect.id,
            resource=effect.resource,
            epoch=effect.epoch,
            upstream_status=upstream_status,
        )
    if isinstance(result, NotSent) or answer is None:
        return problem(
            ErrorCode.UPSTREAM_UNREACHABLE,
            f"{reason}; nothing was sent, the operation can be retried",
            headers=fence,
            effect_id=effect.id,
        )
    headers = answer.headers.copy()
    headers.update(fence)
    return web.Response(status=answer.status, headers=headers, body=answer.body)


def _replay(record: IdempotencyRecord) -> web.Response:
    fence = {
        "Fence-Epoch": str(record.epoch),
        "Fence-Resource": record.resource,
        "Fence-Effect-Id": record.effect_id,
        "Idempotent-Replayed": "true",
    }
    if record.response is None:
        # Settled by a probe or an operator: committed, but no response was ever seen.
        return web.json_response(
            {
                "replayed": True,
                "effect_id": record.effect_id,
                "state": record.effect_state.value,
                "settled_by": record.settled_by,
                "detail": "the operation was committed, as established by reconciliation; "
                "the upstream's response was never seen, so there is none to replay",
            },
            status=200,
            headers=fence,
        )
    headers = dict(record.response.headers)
    headers.update(fence)
    return web.Response(status=record.response.status, headers=headers, body=record.response.body)
