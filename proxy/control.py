"""The control API under /_fence/: leases, admin calls, receipts, health."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from aiohttp import web

from core.codes import ErrorCode
from core.records import LeaseRecord, Refusal
from policies import AuthClient, Right
from proxy import auth, openapi, operations, reloading
from proxy.presentation import lease_view_json
from proxy.problems import refusal_response
from proxy.quotas import over_acquire_rate, quota_subject
from proxy.requests import (
    CREDENTIAL_VERIFIED,
    defer_continue,
    holder_name,
    json_object,
    lease_before_body,
    single_header,
    ttl,
)
from proxy.runtime import UPSTREAMS, Runtime, runtime_of
from proxy.tokens import new_token, token_hash, well_formed
from reconcile import operations as reconciliation
from store import StoreError

PREFIX = "/_fence/v1"

Handler = Callable[[web.Request], Awaitable[web.Response]]


def add_routes(app: web.Application, metrics: bool = True) -> None:
    """The control API; `metrics: False` when they are served on a listener of their own."""

    def get(path: str, handler: Handler) -> None:
        app.router.add_get(path, handler)

    def post(path: str, handler: Handler) -> None:
        # 100 Continue only once the token and admin checks passed (see read_body).
        app.router.add_post(path, handler, expect_handler=defer_continue)

    post(f"{PREFIX}/leases", acquire)
    get(f"{PREFIX}/leases", show_lease)
    post(f"{PREFIX}/leases/renew", renew)
    post(f"{PREFIX}/leases/release", release)
    post(f"{PREFIX}/admin/revoke", revoke)
    post(f"{PREFIX}/admin/close-recovery", close_recovery)
    post(f"{PREFIX}/admin/reload", reload_policy)
    get(f"{PREFIX}/effects", list_effects)
    get(f"{PREFIX}/effects/{{effect_id}}", show_effect)
    post(f"{PREFIX}/effects/{{effect_id}}/probe", probe_effect)
    post(f"{PREFIX}/effects/{{effect_id}}/resolve", resolve_effect)
    get(f"{PREFIX}/reconcile", list_in_doubt)
    if metrics:
        get("/_fence/metrics", guarded_metrics)
    get(f"{PREFIX}/rejections", list_rejections)
    get(f"{PREFIX}/lease-advice", lease_advice)
    get(f"{PREFIX}/status", service_status)
    get(f"{PREFIX}/leases/recent", recent_leases)
    get("/_fence/healthz", healthz)
    get("/_fence/readyz", readyz)
    get(f"{PREFIX}/openapi.json", openapi_document)


def add_metrics_route(app: web.Application) -> None:
    """The metrics listener's one route (`metrics_listen`)."""
    app.router.add_get("/_fence/metrics", metrics)


def _presented_token(request: web.Request) -> str:
    token = single_header(request, "Fence-Token")
    if token is None:
        raise Refusal(ErrorCode.MISSING_TOKEN, "this call needs the lease's Fence-Token header")
    if not well_formed(token):
        raise Refusal(ErrorCode.INVALID_TOKEN, "the Fence-Token is not one this proxy issued")
    return token


def _lease_json(lease: LeaseRecord, now: float) -> dict[str, Any]:
    return {
        "resource": lease.resource,
        "holder": lease.holder,
        "epoch": lease.epoch,
        "expires_at": lease.expires_at,
        "ttl_s": round(lease.expires_at - now, 3),
        "client": lease.client,
    }


async def acquire(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    # Before the body: an unknown caller is refused without being invited to send it.
    client = auth.guard(request, Right.LEASE)
    data = await json_object(request, {"resource", "holder", "ttl_s"})
    resource = operations.resource_name(data.get("resource"))
    auth.check_scope(client, resource)
    holder = holder_name(data.get("holder"))
    seconds = ttl(data, runtime.policy.leases)
    refusal = over_acquire_rate(runtime, quota_subject(request, holder), resource)
    if refusal is not None:
        return await _refuse_acquire(request, refusal, resource, holder)
    token = new_token()
    result = await runtime.store.acquire(
        resource,
        holder,
        seconds,
        token_hash(token),
        runtime.policy.quotas.live_leases,
        client.name if client else None,
    )
    if isinstance(result, Refusal):
        return await _refuse_acquire(request, result, resource, holder)
    lease, now = result
    body = _lease_json(lease, now)
    body["token"] = token
    return web.json_response(body, status=201)


async def _refuse_acquire(
    request: web.Request, refusal: Refusal, resource: str, holder: str
) -> web.Response:
    # rate_limited names no lease: recorded without the holder (anyone may invent one).
    # Any other holder is kept on the record only if it held the lease named.
    limited = refusal.code is ErrorCode.RATE_LIMITED
    await _record(request, refusal, resource=resource, holder=None if limited else holder)
    return refusal_response(refusal)


def verify_presented_key(request: web.Request) -> None:
    """Renew and release need no client key, yet a client sends its key with them
    (fenceproxy_client does): a valid one verifies the request at once, so that its
    connection is kept even while its token is looked up behind a flood's. Any other
    key, or none, is not judged here: the token is the capability."""
    with contextlib.suppress(Refusal):
        if auth.authenticate(request) is not None:
            request[CREDENTIAL_VERIFIED] = True


async def renew(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    token = _presented_token(request)
    verify_presented_key(request)
    # Before any of the body: a made-up token is refused at once, whatever the body
    # does, and only a live lease's token keeps its connection while the body comes.
    await lease_before_body(request, token, runtime.store)
    data = await json_object(request, {"ttl_s"})
    seconds = ttl(data, runtime.policy.leases)
    standing = auth.take_credentials(request).standing
    result = await runtime.store.renew(token_hash(token), seconds, standing)
    if isinstance(result, Refusal):
        await _record(request, result)
        return refusal_response(result)
    lease, now = result
    return web.json_response(_lease_json(lease, now))


async def release(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    token = _presented_token(request)
    verify_presented_key(request)
    await lease_before_body(request, token, runtime.store)  # as renew does
    await json_object(request, set())
    result = await runtime.store.release(token_hash(token))
    if isinstance(result, Refusal):
        await _record(request, result)
        return refusal_response(result)
    return web.json_response({"resource": result.resource, "epoch": result.epoch, "released": True})


async def show_lease(request: web.Request) -> web.Response:
    client = auth.guard(request, Right.READ)
    resource = request.query.get("resource")
    auth.check_scope(client, operations.resource_name(resource))
    view = await operations.lease_view(runtime_of(request).store, resource)
    return web.json_response(lease_view_json(view))


async def revoke(request: web.Request) -> web.Response:
    client = auth.require(request, Right.OPERATE)
    data = await json_object(request, {"resource", "reason"})
    auth.check_scope(client, operations.resource_name(data.get("resource")))
    revoked = await operations.revoke(
        runtime_of(request).store, data.get("resource"), data.get("reason"), client.name
    )
    return web.json_response(
        {
            "resource": revoked.resource,
            "revoked_epoch": revoked.revoked_epoch,
            "epoch": revoked.epoch,
            "reason": revoked.reason,
        }
    )


async def close_recovery(request: web.Request) -> web.Response:
    """`store close-recovery` over the API: every key the store does not know is new
    again, on every replica within a beat."""
    auth.require(request, Right.ADMIN)
    await json_object(request, set())
    store = runtime_of(request).store
    return web.json_response({"closed": await store.close_recovery()})


async def reload_policy(request: web.Request) -> web.Response:
    """`fenceproxy reload` and SIGHUP over the API: this replica reads its policy file
    again (proxy/reloading.py); a refusal changed nothing and says why."""
    auth.require(request, Right.ADMIN)
    await json_object(request, set())
    runtime = runtime_of(request)
    try:
        reloaded = await reloading.reload_policy(runtime, request.config_dict[UPSTREAMS])
    except reloading.ReloadRefused as refused:
        raise Refusal(ErrorCode.RELOAD_REFUSED, str(refused)) from None
    return web.json_response(reloaded.as_json())


def _listing_limit(client: AuthClient, query: Mapping[str, str]) -> tuple[str | None, int]:
    """What to ask the store for, and how many rows to show: a client scoped to some
    resources is shown those among the newest MAX_LIST_LIMIT rows."""
    shown = operations.list_limit(query.get("limit"))
    if client.covers(None):
        return query.get("limit"), shown
    return str(operations.MAX_LIST_LIMIT), shown


def _filter(client: AuthClient, query: Mapping[str, str]) -> str | None:
    """The `resource` filter, refused when out of the client's scope."""
    resource = query.get("resource")
    if resource is not None:
        auth.check_scope(client, operations.resource_name(resource))
    return resource


async def list_effects(request: web.Request) -> web.Response:
    client = auth.require(request, Right.READ)
    query = request.query
    asked, shown = _listing_limit(client, query)
    effects = await operations.list_effects(
        runtime_of(request).store, _filter(client, query), query.get("state"), asked
    )
    effects = auth.in_scope(client, effects, lambda effect: effect.resource)[:shown]
    return web.json_response({"effects": [effect.as_json() for effect in effects]})


async def _effect_in_scope(request: web.Request, client: AuthClient) -> str:
    """The effect id of the path, refused (403) when its resource is out of scope; an
    effect that does not exist is left to the operation's own 404."""
    effect_id = request.match_info["effect_id"]
    if not client.covers(None):
        effect = await runtime_of(request).store.effect(effect_id)
        if effect is not None:
            auth.check_scope(client, effect.resource)
    return effect_id


async def show_effect(request: web.Request) -> web.Response:
    """A reader reads any effect in its scope; a holder its own resource's (see
    _holder_lease)."""
    holder_lease = await _holder_lease(request)
    if holder_lease is None:
        client = auth.require(request, Right.READ)
        effect_id = await _effect_in_scope(request, client)
    else:
        effect_id = request.match_info["effect_id"]
    history = await operations.effect_history(runtime_of(request).store, effect_id)
    if holder_lease is not None and history.effect.resource != holder_lease.resource:
        raise Refusal(
            ErrorCode.WRONG_RESOURCE,
            f"the Fence-Token's lease guards {holder_lease.resource}, not this effect's resource",
            {"resource": holder_lease.resource},
        )
    return web.json_response(history.as_json())


async def _holder_lease(request: web.Request) -> LeaseRecord | None:
    """Without the admin token, a `Fence-Token` of any lease the proxy issued on the
    effect's resource (current or ended, while the store keeps it) lets a worker read the
    outcome of its own effect: one that lost its answer must wait for the settlement, and
    it may have lost its lease meanwhile. None: the caller presents a bearer key (or
    nothing), and is judged as a reader."""
    if "Authorization" in request.headers or "Fence-Token" not in request.headers:
        return None
    token = _presented_token(request)
    lease = await runtime_of(request).store.lease_of_token(token_hash(token))
    if lease is None:
        raise Refusal(ErrorCode.INVALID_TOKEN, "the Fence-Token is not one this proxy issued")
    return lease


async def probe_effect(request: web.Request) -> web.Response:
    """Probe now, whatever the schedule; only an UNKNOWN effect can be settled by it.
    The body is optional: an operator's name (recorded as who asked, after the client)
    and a reason (recorded after the answer's detail), as the status page sends."""
    client = auth.require(request, Right.OPERATE)
    runtime = runtime_of(request)
    effect_id = await _effect_in_scope(request, client)
    data = await json_object(request, {"operator", "reason"})
    actor = f"operator:{client.name}"
    if data.get("operator") is not None:
        actor += f"/{operations.required_text(data['operator'], 'operator')}"
    result = await operations.probe(
        runtime.store,
        request.config_dict[UPSTREAMS].session,
        runtime.policy,
        effect_id,
        actor,
        data.get("reason"),
    )
    runtime.metrics.count_probe(result.conclusion)
    return web.json_response(
        {
            "effect_id": effect_id,
            "conclusion": result.conclusion,
            "detail": result.detail,
            "effect": result.effect.as_json() if result.effect else None,
        }
    )


async def resolve_effect(request: web.Request) -> web.Response:
    client = auth.require(request, Right.OPERATE)
    effect_id = await _effect_in_scope(request, client)
    data = await json_object(request, {"outcome", "reason", "operator"})
    effect = await operations.resolve(
        runtime_of(request).store,
        effect_id,
        data.get("outcome"),
        data.get("reason"),
        _operator(client, data.get("operator")),
    )
    return web.json_response(effect.as_json())


def _operator(client: AuthClient, named: object) -> object:
    """Who a decision is recorded as taken by: the admin token is shared, so its caller
    names the operator (required, as the CLI's --operator); a client is its own name,
    followed by the person it names, if any."""
    if client is auth.ADMIN:
        if named is None:
            raise Refusal(
                ErrorCode.INVALID_REQUEST,
                "operator is required with the admin token: it is shared, so name who decides",
            )
        return named
    if named is None:
        return client.name
    return f"{client.name}/{operations.required_text(named, 'operator')}"


async def list_in_doubt(request: web.Request) -> web.Response:
    """What `fenceproxy reconcile list --json` prints: blocked resources, effects in doubt."""
    client = auth.require(request, Right.READ)
    runtime = runtime_of(request)
    report = await reconciliation.in_doubt(runtime.store, runtime.policy)
    if not client.covers(None):
        report = reconciliation.InDoubt(
            tuple(auth.in_scope(client, report.blocked_resources, lambda resource: resource)),
            tuple(auth.in_scope(client, report.effects, lambda entry: entry.effect.resource)),
        )
    return web.json_response(report.as_json())


async def guarded_metrics(request: web.Request) -> web.Response:
    """Metrics on the main listener: open without `auth:`; with it, `read` on every
    resource (`*`): the counts span all resources (leases, refusals, effects by route),
    and a reader scoped to some would learn of the others' traffic."""
    auth.check_scope(auth.guard(request, Right.READ), None)
    return await metrics(request)


async def metrics(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    body = await runtime.metrics.render(runtime.store)
    return web.Response(
        body=body,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


async def list_rejections(request: web.Request) -> web.Response:
    client = auth.require(request, Right.READ)
    query = request.query
    asked, shown = _listing_limit(client, query)
    rejections = await operations.list_rejections(
        runtime_of(request).store, _filter(client, query), asked
    )
    rejections = auth.in_scope(client, rejections, lambda rejection: rejection.resource)[:shown]
    return web.json_response({"rejections": [r.as_json() for r in rejections]})


async def lease_advice(request: web.Request) -> web.Response:
    """What `fenceproxy lease-advice --json` prints, from the same operation. Its
    groups span resources, so a client must read every resource (`*`)."""
    auth.check_scope(auth.require(request, Right.READ), None)
    runtime = runtime_of(request)
    query = request.query
    advice = await operations.lease_advice(
        runtime.store,
        runtime.policy,
        resource=query.get("resource"),
        since=query.get("since"),
        margin=query.get("margin"),
        poll_interval=query.get("poll_interval"),
        targets=query.get("targets"),
        leases=query.get("leases"),
    )
    return web.json_response(advice.as_json())


def this_instance(runtime: Runtime) -> operations.ThisInstance:
    now = time.monotonic()
    reconciler = runtime.reconciler

    def age(instant: float | None) -> float | None:
        return None if instant is None else now - instant

    return operations.ThisInstance(
        instance_id=runtime.store.instance_id,
        version=operations.proxy_version(),
        uptime_s=now - runtime.started,
        last_sweep_age_s=age(reconciler.last_sweep) if reconciler else None,
        last_probe_age_s=age(reconciler.last_probe) if reconciler else None,
        policy_digest=runtime.policy_digest,
    )


async def service_status(request: web.Request) -> web.Response:
    """This instance, the store and whether it answers, the replicas seen lately: what
    `fenceproxy status` prints, from the same operation. A store that does not answer
    is part of the answer (200), not a refusal. Any reader may ask, whatever its
    globs: nothing here is about a resource (anything that is must be filtered by
    scope, as the listings are, or need `*`, as the metrics do)."""
    auth.require(request, Right.READ)
    runtime = runtime_of(request)
    status = await operations.service_status(
        runtime.store, runtime.policy.store, this_instance(runtime)
    )
    return web.json_response(status.as_json())


async def recent_leases(request: web.Request) -> web.Response:
    """Live leases, and those expired or ended lately (marked when their holder came
    back after expiry), in the client's scope."""
    client = auth.require(request, Right.READ)
    leases = await operations.recent_leases(runtime_of(request).store)
    if not client.covers(None):
        leases = replace(
            leases,
            live=tuple(auth.in_scope(client, leases.live, lambda lease: lease.resource)),
            ended=tuple(auth.in_scope(client, leases.ended, lambda lease: lease.resource)),
        )
    return web.json_response(operations.recent_leases_json(leases))


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(openapi.document(runtime_of(request).policy.leases))


async def readyz(request: web.Request) -> web.Response:
    # A write, not a read: a full disk or a read-only store still answers reads.
    runtime = runtime_of(request)
    await runtime.readiness.check(runtime.store)
    body: dict[str, object] = {"status": "ready"}
    window = runtime.store.recovery
    if window is not None:
        # Ready, yet refusing keys it does not know: say why.
        body["recovery_window"] = {"opened_at": window.opened_at, "reason": window.reason}
    replication = runtime.store.replication
    if replication is not None:
        # What the PostgreSQL primary says of its standbys.
        body["replication"] = replication.as_json()
    body["policy"] = await _policy_agreement(runtime)
    return web.json_response(body)


async def _policy_agreement(runtime: Runtime) -> dict[str, object]:
    """The policy this replica serves, and the replicas seen lately that serve another.
    Said, not refused: during a rolling change of the policy they differ for a while,
    and taking every replica out of the balancer then would be worse (the alert on
    fenceproxy_policy_info tells the lasting case)."""
    answer: dict[str, object] = {"digest": runtime.policy_digest}
    try:
        replicas = await runtime.readiness.replicas(runtime.store, operations.REPLICAS_WINDOW_S)
    except StoreError:
        return answer  # ready was proven by the write; who else runs is unknown now
    answer["disagreeing"] = [
        {"instance_id": replica.instance_id, "digest": replica.policy_digest}
        for replica in operations.disagreeing(replicas, runtime.policy_digest)
    ]
    return answer


async def _record(
    request: web.Request, refusal: Refusal, resource: str | None = None, holder: str | None = None
) -> None:
    await runtime_of(request).record_rejection(
        request,
        refusal.code,
        resource=resource or refusal.context.get("resource"),
        holder=holder,
        epoch=refusal.context.get("epoch"),
    )
