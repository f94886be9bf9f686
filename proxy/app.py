"""The aiohttp application: control API under /_fence/, everything else by route."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any

import aiohttp
from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from core import telemetry
from core.codes import ErrorCode
from core.lifecycle import DEADLINE_MARGIN_S
from core.records import Refusal
from policies import Policy, RouteMatch
from proxy import control, fenced, forwarding, operations, periodic, reloading, ui
from proxy import telemetry as proxy_telemetry
from proxy.auth import KEYRING, Credentials, Keyring, take_credentials
from proxy.identity import IdentityCheck, check_store_identity
from proxy.logredact import redaction_ctx
from proxy.problems import http_error_problem, problem, refusal_response
from proxy.requests import (
    BODY_TIMEOUT,
    CLOSE_AFTER_ANSWER,
    check_header_encoding,
    check_header_sizes,
    check_target_size,
    defer_continue,
    read_body,
)
from proxy.retention import INTERVAL_S as RETENTION_INTERVAL_S
from proxy.retention import RetentionCollector
from proxy.runtime import RUNTIME, UPSTREAMS, Runtime, Upstreams, runtime_of
from reconcile import operations as reconciliation
from reconcile.prober import POLL_INTERVAL_S, Reconciler
from store import CommitUnknown, Store, StoreUnavailable, open_store

log = logging.getLogger("fenceproxy")

GC_INTERVAL_S = 60.0
# How stale the stored counts of refusals may be (store/refusals.py).
REFUSAL_FLUSH_INTERVAL_S = 1.0


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
    identity: IdentityCheck | None = None,
    admin_token_next: str | None = None,
    environ: Mapping[str, str] | None = None,
    policy_file: str | None = None,
    policy_digest: str | None = None,
) -> web.Application:
    """The proxy. `admin_token_next` is a second admin token accepted alongside the
    first (rotation); `environ` is where `auth.clients[].key_env` are read (the
    process's environment by default). `policy_file` is what a reload reads again
    (SIGHUP, POST /_fence/v1/admin/reload), `policy_digest` the sha256 of the bytes
    `policy` was read from. Raises `KeyProblem` for a client without a key."""
    admin_tokens = tuple(token for token in (admin_token, admin_token_next) if token)
    environ = os.environ if environ is None else environ
    keyring = Keyring(Credentials.of(policy, admin_tokens, environ), admin_tokens, environ)
    if store is None:
        store = open_store(policy.store, clock, default_instance_id(policy), policy.store_pool)
    middlewares: list[Middleware] = [capacity_middleware, problem_middleware]
    if telemetry.requests_scoped():  # else no request pays for a scope nobody reads
        middlewares.insert(0, proxy_telemetry.scope_middleware)
    app = web.Application(middlewares=middlewares)
    runtime = Runtime(
        policy,
        store,
        keyring=keyring,
        identity=identity,
        policy_file=policy_file,
        policy_digest=policy_digest,
    )
    runtime.metrics.serve_policy(policy_digest)
    runtime.metrics.watch_leases(
        store, tuple(route.resource_glob for route in operations.fenced_routes(policy))
    )
    app[RUNTIME] = runtime
    app[KEYRING] = keyring
    app[BODY_TIMEOUT] = policy.limits.body_timeout_s
    app.cleanup_ctx.extend(
        [
            redaction_ctx,
            _store_ctx,
            _settling_ctx,
            _client_ctx,
            _garbage_collector_ctx,
            _refusal_counts_ctx,
            _retention_ctx,
            _reconciler_ctx,
            _reload_signal_ctx,
        ]
    )
    if policy.metrics_listen is not None:
        app.cleanup_ctx.append(_metrics_listener_ctx)
    app.on_shutdown.append(_log_stop)
    app.on_response_prepare.append(_http_errors_as_problems)
    control.add_routes(app, metrics=policy.metrics_listen is None)
    ui.add_routes(app)
    # Everything but the control API: a control path with a wrong method is then the
    # router's own 405 (with Allow), an unknown one its 404, instead of "no route".
    # `[\s\S]`, not `.`: the router matches the decoded path, where `%0A` is a newline.
    app.router.add_route(
        "*", r"/{tail:(?!_fence/)[\s\S]*}", proxy_handler, expect_handler=defer_continue
    )
    return app


async def _http_errors_as_problems(request: web.Request, response: web.StreamResponse) -> None:
    """An error aiohttp raises where no middleware runs (its own Expect handler, on the
    routes that keep it and on the router's 404 and 405) goes out as the exception
    itself, a text/plain answer. It is rewritten here into the problem document of its
    status: its headers are computed but not yet sent, so the length is set anew."""
    if not isinstance(response, web.HTTPException) or response.status < 400:
        return
    replacement = http_error_problem(response)
    if replacement.status != response.status:
        # No code has this status; only 417 is raised there today, and the status of
        # an answer being prepared can no longer change.
        return
    body = replacement.body
    assert isinstance(body, bytes)
    response.body = body
    response.headers[hdrs.CONTENT_TYPE] = "application/problem+json"
    response.headers[hdrs.CONTENT_LENGTH] = str(len(body))


async def _log_stop(app: web.Application) -> None:
    """The listener has just closed: say what the stop waits for, and for how long."""
    runtime = app[RUNTIME]
    runtime.stopping = True
    log.info(
        "stopping: listener closed; %d proxied request(s) in flight, waiting up to %g s "
        "for them to finish",
        runtime.requests_in_flight,
        runtime.grace_s,
    )


async def _store_ctx(app: web.Application) -> AsyncIterator[None]:
    runtime = app[RUNTIME]
    store = runtime.store
    await store.open()
    if runtime.identity is not None:
        # Before anything is written: a store this instance does not know could hand
        # out epochs below ones it acknowledged (proxy/identity.py).
        try:
            previous = await check_store_identity(store, runtime.identity, runtime.policy.store)
        except BaseException:
            await store.close()
            raise
        if previous is not None:
            log.warning(
                "this instance last used store %s; starting on this one, which was "
                "fence-restored since or accepted with --new-store",
                previous.store_id,
            )
    try:
        # Before it serves: a schema or a running replica this release cannot work with
        # (core/releases.py).
        await store.check_release(operations.proxy_version())
    except BaseException:
        await store.close()
        raise
    replication = store.replication
    warning = None if replication is None else replication.warning()
    if warning is not None:
        log.warning("%s", warning)
    recovered = await reconciliation.recover_after_restart(store)
    if recovered:
        log.warning("effects in flight at the last stop are now UNKNOWN: %s", recovered)
    yield
    await store.close()


async def _settling_ctx(app: web.Application) -> AsyncIterator[None]:
    """Nothing of the settling of lost admission answers outlives the app, nor its store."""
    yield
    await app[RUNTIME].stop_settling()


async def _metrics_listener_ctx(app: web.Application) -> AsyncIterator[None]:
    """Metrics on a listener of their own (`metrics_listen`), where they need no key:
    whoever can reach that address is trusted to read them."""
    runtime = app[RUNTIME]
    listen = runtime.policy.metrics_listen
    assert listen is not None
    metrics_app = web.Application(middlewares=[problem_middleware])
    metrics_app[RUNTIME] = runtime
    control.add_metrics_route(metrics_app)
    runner = web.AppRunner(metrics_app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, listen.host, listen.port).start()
    except BaseException:
        await runner.cleanup()
        raise
    yield
    await runner.cleanup()


@contextlib.asynccontextmanager
async def _running(work: Coroutine[Any, Any, None], name: str) -> AsyncIterator[None]:
    """`work` as a task while the block runs (an app's life, in a cleanup context), then
    cancelled and awaited, so nothing of it outlives the app."""
    task = asyncio.create_task(work, name=name)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _client_ctx(app: web.Application) -> AsyncIterator[None]:
    runtime = app[RUNTIME]
    session = forwarding.new_client_session()
    pools = forwarding.UpstreamPools(runtime.policy.upstreams.values())
    app[UPSTREAMS] = Upstreams(session, pools)
    yield
    # The grace period is over: requests still upstream are cut off here, and their
    # receipts must say so rather than blame the upstream.
    runtime.shutting_down = True
    for task in list(runtime.draining):
        task.cancel()
    await asyncio.gather(*runtime.draining, return_exceptions=True)
    await pools.close()
    await session.close()


@contextlib.asynccontextmanager
async def _supervised(
    app: web.Application,
    name: str,
    work: Callable[[], Awaitable[object]],
    interval_s: float,
    *,
    wake: asyncio.Event | None = None,
    wait_first: bool = False,
) -> AsyncIterator[None]:
    """`work` as a background loop of proxy/periodic.py while the block runs (its task
    named as the loop), its unexpected failures counted in the app's metrics."""
    loop = periodic.Periodic(
        name,
        work,
        interval_s,
        app[RUNTIME].metrics.count_background_failure,
        wake=asyncio.Event() if wake is None else wake,
        wait_first=wait_first,
    )
    async with _running(loop.run(), name):
        yield


async def _garbage_collector_ctx(app: web.Application) -> AsyncIterator[None]:
    async def collect() -> None:
        removed = await app[RUNTIME].store.collect_garbage()
        if removed:
            log.info("removed %d expired idempotency records", removed)

    async with _supervised(app, periodic.COLLECTOR, collect, GC_INTERVAL_S):
        yield


async def _refusal_counts_ctx(app: web.Application) -> AsyncIterator[None]:
    """Write the refusals counted in memory (store/refusals.py) every second; the store
    writes what is left when it closes."""
    flush = app[RUNTIME].store.flush_refusal_counts
    async with _supervised(
        app, periodic.REFUSAL_COUNTS, flush, REFUSAL_FLUSH_INTERVAL_S, wait_first=True
    ):
        yield


async def _retention_ctx(app: web.Application) -> AsyncIterator[None]:
    runtime = app[RUNTIME]
    collector = RetentionCollector(
        runtime.store, runtime.policy.retention, on_deleted=runtime.metrics.count_retention
    )
    if not collector.enabled:  # everything is kept forever
        yield
        return
    runtime.retention = collector
    async with _supervised(
        app, periodic.RETENTION, collector.round, RETENTION_INTERVAL_S, wake=collector.wake
    ):
        yield


async def _reconciler_ctx(app: web.Application) -> AsyncIterator[None]:
    runtime = app[RUNTIME]
    reconciler = Reconciler(
        runtime.store,
        app[UPSTREAMS].session,
        runtime.policy,
        DEADLINE_MARGIN_S,
        on_probe=runtime.metrics.count_probe,
        version=operations.proxy_version(),
        started=runtime.started,
        policy_digest=runtime.policy_digest,
    )
    runtime.reconciler = reconciler
    async with _supervised(
        app, periodic.RECONCILER, reconciler.round, POLL_INTERVAL_S, wake=reconciler.wake
    ):
        yield


async def _reload_signal_ctx(app: web.Application) -> AsyncIterator[None]:
    """SIGHUP reads the policy file again (proxy/reloading.py), as the admin API's
    reload does; its answer is only logged. Only a proxy started from a file listens."""
    runtime = app[RUNTIME]
    if runtime.policy_file is None:
        yield
        return
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[None]] = set()

    async def reload() -> None:
        # Refused: already logged, and nothing changed.
        with contextlib.suppress(reloading.ReloadRefused):
            await reloading.reload_policy(runtime, app[UPSTREAMS])

    def on_hangup() -> None:
        task = asyncio.create_task(reload(), name="reload")
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    yield
    loop.remove_signal_handler(signal.SIGHUP)
    for task in list(reloads):
        task.cancel()
    await asyncio.gather(*reloads, return_exceptions=True)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def capacity_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """At most `limits.max_requests` proxied requests at once; the next is refused at
    once with 503 rather than queued behind them. The control API is not counted: an
    operator must still be able to look at an overloaded proxy."""
    if request.path.startswith("/_fence/"):
        return await handler(request)
    runtime = runtime_of(request)
    most = runtime.policy.limits.max_requests
    if runtime.requests_in_flight >= most:
        # Counted, not recorded in the store: under overload it is the store's
        # writes that must be spared.
        runtime.metrics.count_refusal(ErrorCode.OVERLOADED)
        response = problem(
            ErrorCode.OVERLOADED,
            f"{most} requests are being handled; try again shortly",
            headers={"Retry-After": "1"},
            limit=most,
        )
        # Closed after the answer: a client that opens connections in a loop does
        # not keep this one too.
        response.force_close()
        return response
    generation = runtime.begin_request()
    try:
        return await handler(request)
    except asyncio.CancelledError:
        if runtime.stopping:
            log.warning(
                "stopping: the %g s grace is over; %s %s was cut off (a write it had sent "
                "is in doubt: UNKNOWN, its resource blocked)",
                runtime.grace_s,
                request.method,
                _logged(request),
            )
        raise
    finally:
        runtime.end_request(generation)


# A head refused by the exact checks on what the parser made of it closes its connection.
_HEAD_REFUSALS = frozenset({ErrorCode.HEADERS_TOO_LARGE, ErrorCode.URI_TOO_LONG})


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal is problem+json; an unexpected error is still one, never a bare 500."""
    try:
        check_target_size(request)
        check_header_sizes(request)
        return await handler(request)
    except Refusal as exc:
        await runtime_of(request).record_rejection(
            request,
            exc.code,
            route=exc.context.get("route"),
            resource=exc.context.get("resource"),
            client=exc.context.get("client"),
        )
        response = refusal_response(exc)
        if request.get(CLOSE_AFTER_ANSWER):
            # The body is not coming, or not wanted: draining it would hold the connection.
            return await _answer_and_close(request, response)
        if exc.code in _HEAD_REFUSALS:
            # As when the head counter refuses it (proxy/connections.py): Connection:
            # close, the unread body read and dropped (aiohttp's lingering), then closed.
            response.force_close()
        return response
    except StoreUnavailable as exc:
        log.error("store unavailable: %s", exc)
        # Counted, not recorded: the store is what does not answer.
        runtime_of(request).metrics.count_refusal(ErrorCode.STORE_UNAVAILABLE)
        if isinstance(exc, CommitUnknown):
            return problem(
                ErrorCode.STORE_UNAVAILABLE,
                "the lease store's answer was lost after the write was sent: it may or may "
                "not have been done (look before doing it again)",
            )
        return problem(
            ErrorCode.STORE_UNAVAILABLE,
            "the lease store did not answer or refused (try again); nothing was done",
        )
    except web.HTTPException as exc:
        if exc.status == 405:
            await runtime_of(request).record_rejection(request, ErrorCode.METHOD_NOT_ALLOWED)
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return problem(
                ErrorCode.METHOD_NOT_ALLOWED, f"{request.method} is not allowed here", allow
            )
        if exc.status == 404 and request.path.startswith("/_fence/"):
            await runtime_of(request).record_rejection(request, ErrorCode.NO_ROUTE)
            return problem(
                ErrorCode.NO_ROUTE, f"no control endpoint {request.method} {request.path}"
            )
        if exc.status == 404:
            return problem(ErrorCode.NOT_FOUND, f"nothing at {request.path}")
        if exc.status == 413:
            return problem(ErrorCode.PAYLOAD_TOO_LARGE, "the body is too large")
        if exc.status < 400:  # a redirect (the status page's) is an answer, not an error
            raise
        answer = http_error_problem(exc)
        if answer.status != exc.status:
            log.error("unexpected HTTP %d on %s %s", exc.status, request.method, _logged(request))
        return answer
    except Exception:
        log.exception("unexpected error on %s %s", request.method, _logged(request))
        return problem(
            ErrorCode.INTERNAL_ERROR, "the proxy failed unexpectedly; nothing was forwarded"
        )


def _logged(request: web.Request) -> str:
    """The path as sent, percent-encodings kept (decoded, a `%0A` would start a forged
    log line), without the query (which may carry a secret)."""
    return request.rel_url.raw_path


async def _answer_and_close(request: web.Request, response: web.Response) -> web.Response:
    """Send `response`, then close the connection at once. The rest of the body is not
    coming, or not wanted: left to itself aiohttp would linger (up to 10 s) reading it
    before closing, so a slow client would still hold the connection past its timeout."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    # RequestHandler.force_close() is public; the transport flushes the answer first.
    request.protocol.force_close()
    return response


async def proxy_handler(request: web.Request) -> web.StreamResponse:
    runtime = runtime_of(request)
    if not request.raw_path.startswith("/"):
        # An absolute-form target (a client using the proxy as its HTTP_PROXY) or "*"
        # names no route of ours and cannot be forwarded as is: refused before anything.
        raise Refusal(
            ErrorCode.INVALID_REQUEST, "the request target must be a path (origin-form, /...)"
        )
    check_header_encoding(request.headers)
    stripped = forwarding.strips_meaningful_header(request.headers)
    if stripped is not None:
        raise Refusal(
            ErrorCode.INVALID_REQUEST,
            f"the Connection header names {stripped}, which cannot be removed in transit",
        )
    match = runtime.policy.match(request.method, request.path)
    # With the policy, before any wait: the credentials of the same reload's generation.
    take_credentials(request)
    if match is None:
        raise Refusal(ErrorCode.NO_ROUTE, f"no route matches {request.method} {request.path}")
    telemetry.about(route=match.route.name)
    if match.route.fenced:
        return await fenced.handle(request, match, runtime)
    return await _pass_through(request, match, runtime)


async def _pass_through(
    request: web.Request, match: RouteMatch, runtime: Runtime
) -> web.StreamResponse:
    route = match.route
    body = forwarding.upstream_body(request, await read_body(request, route.max_body_bytes))
    headers = forwarding.upstream_headers(request, None, take_credentials(request))
    telemetry.inject(headers)
    response: web.StreamResponse | None = None
    try:
        async with (
            request.config_dict[UPSTREAMS]
            .pools.pass_through(route.upstream)
            .request(
                request.method,
                forwarding.upstream_url(route.upstream, request),
                headers=headers,
                data=body,
                timeout=forwarding.client_timeout(route.upstream),
                allow_redirects=False,
                middlewares=forwarding.framing_middlewares(body),
            ) as upstream
        ):
            forwarding.check_answer_head(upstream)
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
        if response is not None and response.prepared:
            return _cut(request, response, route.name, runtime, exc)
        if forwarding.sent_nothing(exc):
            runtime.metrics.count_request(route.name, "upstream_unreachable")
            return problem(
                ErrorCode.UPSTREAM_UNREACHABLE,
                f"could not connect to {route.upstream.name}: {exc}; nothing was sent",
                route=route.name,
            )
        # The request may have reached the upstream (a pass-through route records no
        # effect): say so, never "nothing was sent".
        runtime.metrics.count_request(route.name, "no_answer")
        return problem(
            ErrorCode.OUTCOME_UNKNOWN,
            f"the request was sent to {route.upstream.name}, which gave no complete answer "
            f"({type(exc).__name__}: {exc}); it may have been applied (a pass-through route "
            "records no effect)",
            route=route.name,
        )


def _cut(
    request: web.Request,
    response: web.StreamResponse,
    route: str,
    runtime: Runtime,
    exc: BaseException,
) -> web.StreamResponse:
    """The answer broke off after its head was passed on (the upstream's body was cut, or
    the worker's connection went): break the worker's connection off, so that it sees a
    cut, never a short body that looks whole (returning normally would end the chunked
    body properly)."""
    log.warning("the answer to %s %s was cut: %s", request.method, _logged(request), exc)
    runtime.metrics.count_request(route, "cut")
    if request.transport is not None:
        request.transport.abort()
    return response
