"""The control API under /_fence/: leases, admin calls, receipts, health."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from core.codes import ErrorCode
from core.records import LeaseRecord, Refusal
from proxy import openapi, operations
from proxy.operations import OperationRefused
from proxy.problems import ProblemError, refusal_response
from proxy.requests import defer_continue, holder_name, json_object, single_header, ttl
from proxy.runtime import require_admin, runtime_of
from proxy.tokens import new_token, token_hash, well_formed

PREFIX = "/_fence/v1"

Handler = Callable[[web.Request], Awaitable[web.Response]]


def add_routes(app: web.Application) -> None:
    def get(path: str, handler: Handler) -> None:
        app.router.add_get(path, _refusals_as_problems(handler))

    def post(path: str, handler: Handler) -> None:
        # 100 Continue only once the token and admin checks passed (see read_body).
        app.router.add_post(path, _refusals_as_problems(handler), expect_handler=defer_continue)

    post(f"{PREFIX}/leases", acquire)
    get(f"{PREFIX}/leases", show_lease)
    post(f"{PREFIX}/leases/renew", renew)
    post(f"{PREFIX}/leases/release", release)
    post(f"{PREFIX}/admin/revoke", revoke)
    get(f"{PREFIX}/effects", list_effects)
    get(f"{PREFIX}/effects/{{effect_id}}", show_effect)
    post(f"{PREFIX}/effects/{{effect_id}}/probe", probe_effect)
    post(f"{PREFIX}/effects/{{effect_id}}/resolve", resolve_effect)
    get(f"{PREFIX}/reconcile", list_in_doubt)
    get("/_fence/metrics", metrics)
    get(f"{PREFIX}/rejections", list_rejections)
    get("/_fence/healthz", healthz)
    get("/_fence/readyz", readyz)
    get(f"{PREFIX}/openapi.json", openapi_document)


def _refusals_as_problems(handler: Handler) -> Handler:
    """An operation's refusal is a problem+json like any other: the middleware records
    it as a rejection and answers it with the code's status."""

    @functools.wraps(handler)
    async def handle(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except OperationRefused as refused:
            raise ProblemError(refused.code, refused.detail, **refused.context) from None

    return handle


def _presented_token(request: web.Request) -> str:
    token = single_header(request, "Fence-Token")
    if token is None:
        raise ProblemError(
            ErrorCode.MISSING_TOKEN, "this call needs the lease's Fence-Token header"
        )
    if not well_formed(token):
        raise ProblemError(ErrorCode.INVALID_TOKEN, "the Fence-Token is not one this proxy issued")
    return token


def _lease_json(
    resource: str, holder: str, epoch: int, expires_at: float, now: float
) -> dict[str, Any]:
    return {
        "resource": resource,
        "holder": holder,
        "epoch": epoch,
        "expires_at": expires_at,
        "ttl_s": round(expires_at - now, 3),
    }


async def acquire(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    data = await json_object(request, {"resource", "holder", "ttl_s"})
    resource = operations.resource_name(data.get("resource"))
    holder = holder_name(data.get("holder"))
    seconds = ttl(data.get("ttl_s"), runtime.policy.leases)
    token = new_token()
    result = await runtime.store.acquire(resource, holder, seconds, token_hash(token))
    if isinstance(result, Refusal):
        await _record(request, result, resource=resource, holder=holder)
        return refusal_response(result)
    lease, now = result
    body = _lease_json(resource, holder, lease.epoch, lease.expires_at, now)
    body["token"] = token
    return web.json_response(body, status=201)


async def renew(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    token = _presented_token(request)
    data = await json_object(request, {"ttl_s"})
    seconds = ttl(data.get("ttl_s"), runtime.policy.leases)
    result = await runtime.store.renew(token_hash(token), seconds)
    if isinstance(result, Refusal):
        await _record(request, result)
        return refusal_response(result)
    lease, now = result
    return web.json_response(
        _lease_json(lease.resource, lease.holder, lease.epoch, lease.expires_at, now)
    )


async def release(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    token = _presented_token(request)
    await json_object(request, set())
    result = await runtime.store.release(token_hash(token))
    if isinstance(result, Refusal):
        await _record(request, result)
        return refusal_response(result)
    return web.json_response({"resource": result.resource, "epoch": result.epoch, "released": True})


async def show_lease(request: web.Request) -> web.Response:
    view = await operations.lease_view(runtime_of(request).store, request.query.get("resource"))
    return web.json_response(view.as_json())


async def revoke(request: web.Request) -> web.Response:
    require_admin(request)
    data = await json_object(request, {"resource", "reason"})
    revoked = await operations.revoke(
        runtime_of(request).store, data.get("resource"), data.get("reason")
    )
    return web.json_response(
        {
            "resource": revoked.resource,
            "revoked_epoch": revoked.revoked_epoch,
            "epoch": revoked.epoch,
            "reason": revoked.reason,
        }
    )


async def list_effects(request: web.Request) -> web.Response:
    require_admin(request)
    query = request.query
    effects = await operations.list_effects(
        runtime_of(request).store, query.get("resource"), query.get("state"), query.get("limit")
    )
    return web.json_response({"effects": [effect.as_json() for effect in effects]})


async def show_effect(request: web.Request) -> web.Response:
    """The admin reads any effect; a holder reads its own resource's (see _holder_lease)."""
    holder_lease = await _holder_lease(request)
    history = await operations.effect_history(
        runtime_of(request).store, request.match_info["effect_id"]
    )
    if holder_lease is not None and history.effect.resource != holder_lease.resource:
        raise ProblemError(
            ErrorCode.WRONG_RESOURCE,
            f"the Fence-Token's lease guards {holder_lease.resource}, not this effect's resource",
            resource=holder_lease.resource,
        )
    return web.json_response(history.as_json())


async def _holder_lease(request: web.Request) -> LeaseRecord | None:
    """Without the admin token, a `Fence-Token` of any lease the proxy issued on the
    effect's resource (current or ended, while the store keeps it) lets a worker read the
    outcome of its own effect: one that lost its answer must wait for the settlement, and
    it may have lost its lease meanwhile. None: the caller is the admin."""
    if "Authorization" in request.headers or "Fence-Token" not in request.headers:
        require_admin(request)
        return None
    token = _presented_token(request)
    lease = await runtime_of(request).store.lease_of_token(token_hash(token))
    if lease is None:
        raise ProblemError(ErrorCode.INVALID_TOKEN, "the Fence-Token is not one this proxy issued")
    return lease


async def probe_effect(request: web.Request) -> web.Response:
    """Probe now, whatever the schedule; only an UNKNOWN effect can be settled by it."""
    require_admin(request)
    runtime = runtime_of(request)
    effect_id = request.match_info["effect_id"]
    assert runtime.session is not None
    result = await operations.probe(runtime.store, runtime.session, runtime.policy, effect_id)
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
    require_admin(request)
    data = await json_object(request, {"outcome", "reason", "operator"})
    effect = await operations.resolve(
        runtime_of(request).store,
        request.match_info["effect_id"],
        data.get("outcome"),
        data.get("reason"),
        data.get("operator"),
    )
    return web.json_response(effect.as_json())


async def list_in_doubt(request: web.Request) -> web.Response:
    """What `fenceproxy reconcile list --json` prints: blocked resources, effects in doubt."""
    require_admin(request)
    report = await operations.in_doubt(runtime_of(request).store)
    return web.json_response(report.as_json())


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
    require_admin(request)
    query = request.query
    rejections = await operations.list_rejections(
        runtime_of(request).store, query.get("resource"), query.get("limit")
    )
    return web.json_response({"rejections": [r.as_json() for r in rejections]})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(openapi.document(runtime_of(request).policy.leases))


async def readyz(request: web.Request) -> web.Response:
    # A write, not a read: a full disk or a read-only store still answers reads.
    runtime = runtime_of(request)
    await runtime.readiness.check(runtime.store)
    return web.json_response({"status": "ready"})


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
