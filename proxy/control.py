"""The control API under /_fence/: leases, admin calls, receipts, health."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.codes import ErrorCode
from core.records import EffectRecord, EffectState, Refusal
from proxy import openapi
from proxy.problems import ProblemError, refusal_response
from proxy.requests import holder_name, json_object, resource_name, single_header, ttl
from proxy.runtime import require_admin, runtime_of
from proxy.tokens import new_token, token_hash, well_formed
from reconcile import prober

PREFIX = "/_fence/v1"
MAX_LIST_LIMIT = 1000


def add_routes(app: web.Application) -> None:
    app.router.add_post(f"{PREFIX}/leases", acquire)
    app.router.add_get(f"{PREFIX}/leases", show_lease)
    app.router.add_post(f"{PREFIX}/leases/renew", renew)
    app.router.add_post(f"{PREFIX}/leases/release", release)
    app.router.add_post(f"{PREFIX}/admin/revoke", revoke)
    app.router.add_get(f"{PREFIX}/effects", list_effects)
    app.router.add_get(f"{PREFIX}/effects/{{effect_id}}", show_effect)
    app.router.add_post(f"{PREFIX}/effects/{{effect_id}}/probe", probe_effect)
    app.router.add_post(f"{PREFIX}/effects/{{effect_id}}/resolve", resolve_effect)
    app.router.add_get("/_fence/metrics", metrics)
    app.router.add_get(f"{PREFIX}/rejections", list_rejections)
    app.router.add_get("/_fence/healthz", healthz)
    app.router.add_get("/_fence/readyz", readyz)
    app.router.add_get(f"{PREFIX}/openapi.json", openapi_document)


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
    resource = resource_name(data.get("resource"))
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
    resource = resource_name(request.query.get("resource"))
    view = await runtime_of(request).store.lease_view(resource)
    return web.json_response(view.as_json())


async def revoke(request: web.Request) -> web.Response:
    require_admin(request)
    data = await json_object(request, {"resource", "reason"})
    resource = resource_name(data.get("resource"))
    reason = _text(data.get("reason"), "reason")
    old_epoch, new_epoch = await runtime_of(request).store.revoke(resource, reason)
    return web.json_response(
        {"resource": resource, "revoked_epoch": old_epoch, "epoch": new_epoch, "reason": reason}
    )


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
        raise ProblemError(
            ErrorCode.INVALID_REQUEST, f"limit must be a whole number 1-{MAX_LIST_LIMIT}"
        )
    return int(raw)


async def list_effects(request: web.Request) -> web.Response:
    require_admin(request)
    resource = request.query.get("resource")
    if resource is not None:
        resource_name(resource)
    state = request.query.get("state")
    if state is not None and state not in EffectState.__members__:
        raise ProblemError(
            ErrorCode.INVALID_REQUEST, f"state must be one of {', '.join(EffectState.__members__)}"
        )
    effects = await runtime_of(request).store.effects(resource, state, _limit(request))
    return web.json_response({"effects": [effect.as_json() for effect in effects]})


async def _effect(request: web.Request) -> EffectRecord:
    effect = await runtime_of(request).store.effect(request.match_info["effect_id"])
    if effect is None:
        raise ProblemError(ErrorCode.NOT_FOUND, "no such effect")
    return effect


async def show_effect(request: web.Request) -> web.Response:
    require_admin(request)
    effect_id = request.match_info["effect_id"]
    effect, events = await runtime_of(request).store.effect_with_events(effect_id)
    if effect is None:
        raise ProblemError(ErrorCode.NOT_FOUND, "no such effect")
    return web.json_response({**effect.as_json(), "events": [e.as_json() for e in events]})


async def probe_effect(request: web.Request) -> web.Response:
    """Probe now, whatever the schedule; only an UNKNOWN effect can be settled by it."""
    require_admin(request)
    runtime = runtime_of(request)
    effect = await _effect(request)
    if effect.state is not EffectState.UNKNOWN:
        raise ProblemError(
            ErrorCode.EFFECT_SETTLED
            if effect.state is not EffectState.DISPATCHING
            else ErrorCode.EFFECT_IN_FLIGHT,
            f"only an UNKNOWN effect is probed; this one is {effect.state.value}",
            effect_id=effect.id,
        )
    assert runtime.session is not None
    result = await prober.probe_effect(runtime.store, runtime.session, runtime.policy, effect)
    runtime.metrics.count_probe(result.conclusion)
    return web.json_response(
        {
            "effect_id": effect.id,
            "conclusion": result.conclusion,
            "detail": result.detail,
            "effect": result.effect.as_json() if result.effect else None,
        }
    )


OUTCOMES = {"committed": EffectState.COMMITTED, "not_committed": EffectState.NOT_COMMITTED}


async def resolve_effect(request: web.Request) -> web.Response:
    require_admin(request)
    data = await json_object(request, {"outcome", "reason", "operator"})
    outcome = OUTCOMES.get(str(data.get("outcome")).replace("-", "_"))
    if outcome is None:
        raise ProblemError(ErrorCode.INVALID_REQUEST, "outcome must be committed or not_committed")
    reason = _text(data.get("reason"), "reason")
    operator = _text(data.get("operator"), "operator")
    runtime = runtime_of(request)
    result = await runtime.store.resolve(request.match_info["effect_id"], outcome, reason, operator)
    if isinstance(result, Refusal):
        await _record(request, result)
        return refusal_response(result)
    return web.json_response(result.as_json())


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 500:
        raise ProblemError(
            ErrorCode.INVALID_REQUEST, f"{name} must be a non-empty string (≤ 500 chars)"
        )
    return value.strip()


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
    resource = request.query.get("resource")
    if resource is not None:
        resource_name(resource)
    rejections = await runtime_of(request).store.rejections(resource, _limit(request))
    return web.json_response({"rejections": [r.as_json() for r in rejections]})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(openapi.document())


async def readyz(request: web.Request) -> web.Response:
    await runtime_of(request).store.ping()
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
