"""The effect lifecycle against the store, on SQLite and PostgreSQL: every way a late,
lost or contradicting piece of evidence used to double an effect or lie in a receipt.

Each test is a deterministic sequence of store calls. Written
first against the code before core/lifecycle.py, where each of them failed: a late
receipt freed a key whose effect was settled COMMITTED, a resend's NOT_SENT freed the
key of a committed operation, retention ran out while an effect was in doubt, and a
probe's "not found" was judged when it arrived instead of when it was asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.fencing import Replay
from core.lifecycle import Event
from core.records import EffectRecord, EffectState, Refusal, StoredResponse
from policies import Retention, parse_policy
from proxy.forwarding import new_client_session
from reconcile.prober import probe_effect
from store import Admitted, NewEffect, Receipt, Store
from tests.integration.app import backends
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import (
    acquire,
    granted,
    new_token_hash,
    running_store,
)

RESOURCE = "supplier:widget"
KEY = "order-1"
RESPONSE = StoredResponse(201, (("Content-Type", "application/json"),), b'{"order": 1}')


def order(
    key: str | None = KEY,
    fingerprint: str = "fp-order-1",
    max_in_flight: int = 1,
    upstream_timeout_s: float = 5.0,
    retain_s: float = 60.0,
    upstream_idempotent: bool = False,
) -> NewEffect:
    return NewEffect(
        route="place-order",
        resource=RESOURCE,
        idempotency_key=key,
        fingerprint=fingerprint,
        method="POST",
        path="/orders/widget",
        max_in_flight=max_in_flight,
        upstream_timeout_s=upstream_timeout_s,
        retain_s=retain_s,
        upstream_idempotent=upstream_idempotent,
    )


@pytest.fixture(params=["step_by_step", "as_admitted"])
async def store(
    store_url: str,
    clock: FakeClock,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Store]:
    """The store, its receipts recorded step by step, or, as the proxy records them,
    from the effect as admitted (`finish_effect(admitted=...)`: on PostgreSQL one
    statement that writes only if the effect is still as admitted)."""
    async with running_store(store_url, clock) as opened:
        if request.param == "as_admitted":
            as_admitted: dict[str, EffectRecord] = {}
            admit, finish = opened.admit, opened.finish_effect

            async def admit_and_remember(token_hash: str, new: NewEffect) -> Any:
                decision = await admit(token_hash, new)
                if isinstance(decision, Admitted):
                    as_admitted[decision.effect.id] = decision.effect
                return decision

            async def finish_as_admitted(
                effect_id: str,
                event: Event,
                upstream_status: int | None,
                reason: str,
                response: StoredResponse | None,
                resends: tuple[str, ...] = (),
            ) -> Receipt:
                return await finish(
                    effect_id,
                    event,
                    upstream_status,
                    reason,
                    response,
                    resends,
                    admitted=as_admitted.get(effect_id),
                )

            monkeypatch.setattr(opened, "admit", admit_and_remember)
            monkeypatch.setattr(opened, "finish_effect", finish_as_admitted)
        yield opened


async def holder(store: Store, ttl_s: float = 60) -> str:
    token_hash = new_token_hash()
    granted(await store.acquire(RESOURCE, "worker-a", ttl_s, token_hash))
    return token_hash


async def admitted(store: Store, token_hash: str, new: NewEffect | None = None) -> str:
    decision = await store.admit(token_hash, new or order())
    assert isinstance(decision, Admitted), decision
    return decision.effect.id


async def lost(store: Store, effect_id: str) -> None:
    """The dispatch's answer was lost: the effect is UNKNOWN."""
    receipt = await store.finish_effect(effect_id, Event.LOST, None, "response lost", None)
    assert receipt.effect.state is EffectState.UNKNOWN


async def state_of(store: Store, effect_id: str) -> EffectState:
    effect = await store.effect(effect_id)
    assert effect is not None
    return effect.state


async def key_owner(store_url: str, key: str = KEY) -> list[tuple[str]]:
    return [
        (str(row[0]),)
        for row in await backends.rows(
            store_url, "SELECT effect_id FROM idempotency WHERE key = ?", (key,)
        )
    ]


async def conclusions(store: Store, effect_id: str) -> list[tuple[str, str]]:
    _, events = await store.effect_with_events(effect_id)
    return [(event.kind, event.conclusion) for event in events]


# --- late receipts ----------------------------------------------------------------------------


async def test_late_not_committed_after_a_probe_settled_committed_keeps_the_key(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    token = await holder(store)
    effect_id = await admitted(store, token)
    # The proxy that dispatched it stalls; the sweep marks it UNKNOWN; a probe finds it.
    clock.advance(10)
    assert await store.recover(None, 2.0) == [effect_id]
    await store.record_probe(effect_id, Event.PROBE_COMMITTED, 200, "found", None)
    assert await state_of(store, effect_id) is EffectState.COMMITTED

    # The stalled proxy wakes with the upstream's late 4xx.
    receipt = await store.finish_effect(
        effect_id, Event.ANSWERED_NOT_COMMITTED, 409, "upstream answered 409", None
    )

    assert receipt.effect.state is EffectState.CONFLICTING
    assert await key_owner(store_url) == [(effect_id,)]
    assert ("dispatch", "conflict") in await conclusions(store, effect_id)
    # The holder's retry is not forwarded again: the resource is blocked for an operator.
    retry = await store.admit(token, order())
    assert isinstance(retry, Refusal) and retry.code == "resource_blocked", retry
    assert (await store.lease_view(RESOURCE)).blocked


async def test_late_not_sent_after_an_operators_committed_resolve_keeps_the_key(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    token = await holder(store)
    effect_id = await admitted(store, token)
    clock.advance(10)
    resolved = await store.resolve(effect_id, EffectState.COMMITTED, "seen in portal", "alice")
    assert not isinstance(resolved, Refusal) and resolved.state is EffectState.COMMITTED

    receipt = await store.finish_effect(effect_id, Event.NOT_SENT, None, "refused", None)

    assert receipt.effect.state is EffectState.CONFLICTING
    assert await key_owner(store_url) == [(effect_id,)]
    retry = await store.admit(token, order())
    assert isinstance(retry, Refusal) and retry.code == "resource_blocked", retry


async def test_late_committed_after_a_not_committed_settlement_blocks_and_names_both(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    token = await holder(store)
    first = await admitted(store, token)
    await lost(store, first)
    clock.advance(10)
    await store.record_probe(first, Event.PROBE_NOT_COMMITTED, 404, "not found", None)
    assert await key_owner(store_url) == []
    # The key was freed: the holder sent the operation again, as it may.
    second = await admitted(store, token)
    await store.finish_effect(second, Event.ANSWERED_COMMITTED, 201, "upstream 201", RESPONSE)

    # Then a late answer shows the first one had committed after all.
    late = await store.finish_effect(first, Event.ANSWERED_COMMITTED, 201, "upstream 201", None)

    assert late.effect.state is EffectState.CONFLICTING
    assert late.key_holder == second
    assert late.effect.reason is not None and second in late.effect.reason
    assert (await store.lease_view(RESOURCE)).blocked
    retry = await store.admit(token, order())
    assert isinstance(retry, Refusal) and retry.code == "resource_blocked", retry


async def test_a_late_receipt_that_agrees_changes_nothing_but_the_history(
    store: Store, clock: FakeClock
) -> None:
    token = await holder(store)
    effect_id = await admitted(store, token)
    clock.advance(10)
    await store.recover(None, 2.0)
    await store.record_probe(effect_id, Event.PROBE_COMMITTED, 200, "found", None)

    receipt = await store.finish_effect(
        effect_id, Event.ANSWERED_COMMITTED, 201, "upstream 201", RESPONSE
    )

    assert receipt.effect.state is EffectState.COMMITTED
    assert receipt.effect.settled_by == "probe"
    assert await conclusions(store, effect_id) == [
        ("recover", "unknown"),
        ("probe", "committed"),
        ("dispatch", "late"),
    ]


async def test_a_conflict_is_for_an_operator_to_resolve(store: Store, clock: FakeClock) -> None:
    token = await holder(store)
    effect_id = await admitted(store, token)
    clock.advance(10)
    await store.recover(None, 2.0)
    await store.record_probe(effect_id, Event.PROBE_COMMITTED, 200, "found", None)
    await store.finish_effect(effect_id, Event.NOT_SENT, None, "refused", None)
    assert await state_of(store, effect_id) is EffectState.CONFLICTING

    # Probes and receipts are only audited now.
    await store.record_probe(effect_id, Event.PROBE_NOT_COMMITTED, 404, "not found", None)
    assert await state_of(store, effect_id) is EffectState.CONFLICTING
    resolved = await store.resolve(effect_id, EffectState.COMMITTED, "order 7 exists", "bob")
    assert not isinstance(resolved, Refusal) and resolved.state is EffectState.COMMITTED
    replay = await store.admit(token, order())
    assert isinstance(replay, Replay), replay


# --- retention runs from settlement -------------------------------------------------------


async def test_a_key_in_doubt_outlives_its_retention_and_replays_after_the_resolve(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    token = await holder(store, ttl_s=60)
    effect_id = await admitted(store, token, order(retain_s=60))
    await lost(store, effect_id)
    clock.advance(25 * 3600)  # far past retain_s, no probe on this route
    assert await store.collect_garbage() == 0
    assert await key_owner(store_url) == [(effect_id,)]
    resolved = await store.resolve(effect_id, EffectState.COMMITTED, "found it", "alice")
    assert not isinstance(resolved, Refusal)

    token = await holder(store)
    retry = await store.admit(token, order(retain_s=60))
    assert isinstance(retry, Replay), retry
    # Retention starts at the settlement: 60 s from the resolve, then the key goes.
    clock.advance(61)
    assert await store.collect_garbage() == 1


async def test_a_retain_s_shorter_than_the_timeout_does_not_let_a_second_send_through(
    store: Store, clock: FakeClock
) -> None:
    token = await holder(store)
    short = order(max_in_flight=2, retain_s=1, upstream_timeout_s=5)
    effect_id = await admitted(store, token, short)
    clock.advance(2)
    again = await store.admit(token, short)
    assert isinstance(again, Refusal) and again.code == "request_in_progress", again
    assert again.context["effect_id"] == effect_id


# --- resends --------------------------------------------------------------------------------


async def test_a_resends_not_sent_does_not_free_the_key_of_a_committed_operation(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    token = await holder(store)
    dedup = order(upstream_idempotent=True)
    first = await admitted(store, token, dedup)
    await lost(store, first)
    resend = await admitted(store, token, dedup)
    clock.advance(1)
    await store.record_probe(first, Event.PROBE_COMMITTED, 200, "found", None)

    await store.finish_effect(resend, Event.NOT_SENT, None, "connection refused", None)

    assert await state_of(store, first) is EffectState.COMMITTED
    assert await key_owner(store_url) == [(first,)]
    again = await store.admit(token, dedup)
    assert isinstance(again, Replay), again


async def test_a_probe_that_settles_the_first_send_leaves_the_key_with_its_resend(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    """The key belongs to whichever effect under it is still open: a probe's "not
    found" settles the first send NOT_COMMITTED while its resend is still on its way,
    and the key passes to the resend instead of being freed."""
    token = await holder(store)
    dedup = order(upstream_idempotent=True)
    first = await admitted(store, token, dedup)
    await lost(store, first)
    resend = await admitted(store, token, dedup)
    clock.advance(1)

    await store.record_probe(first, Event.PROBE_NOT_COMMITTED, 404, "not found", None)

    assert await state_of(store, first) is EffectState.NOT_COMMITTED
    assert await key_owner(store_url) == [(resend,)]
    again = await store.admit(token, dedup)
    assert isinstance(again, Refusal) and again.code == "request_in_progress", again
    assert again.context["effect_id"] == resend
    # The resend's answer is lost too: the key stays with it, in doubt, and the
    # holder's next send is one more resend of it, never a new operation.
    await lost(store, resend)
    assert await key_owner(store_url) == [(resend,)]
    clock.advance(1)
    await store.record_probe(resend, Event.PROBE_COMMITTED, 200, "found", None)
    replay = await store.admit(token, dedup)
    assert isinstance(replay, Replay), replay
    assert replay.record.effect_id == resend


async def test_a_receipt_that_frees_the_key_passes_it_to_an_earlier_send_in_dispute(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    """The same rule for a receipt (as admitted: on PostgreSQL the one-statement receipt
    declines, and the long way passes the key): the second send's 409 frees the key
    while the first send, contradicted, waits for an operator."""
    token = await holder(store)
    first = await admitted(store, token)
    await lost(store, first)
    clock.advance(10)
    await store.record_probe(first, Event.PROBE_NOT_COMMITTED, 404, "not found", None)
    second = await admitted(store, token)
    late = await store.finish_effect(first, Event.ANSWERED_COMMITTED, 201, "upstream 201", None)
    assert late.effect.state is EffectState.CONFLICTING and late.key_holder == second

    await store.finish_effect(second, Event.ANSWERED_NOT_COMMITTED, 409, "upstream 409", None)

    assert await state_of(store, second) is EffectState.NOT_COMMITTED
    assert await key_owner(store_url) == [(first,)]
    resolved = await store.resolve(first, EffectState.COMMITTED, "order 9 exists", "alice")
    assert not isinstance(resolved, Refusal)
    replay = await store.admit(token, order())
    assert isinstance(replay, Replay) and replay.record.effect_id == first, replay


async def test_an_expired_key_stays_while_a_resend_of_its_operation_is_open(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    """Garbage collection does not take a key from an open effect either: the first
    send committed (its key replays for retain_s), its resend is still in doubt."""
    token = await holder(store)
    dedup = order(upstream_idempotent=True, retain_s=5)
    first = await admitted(store, token, dedup)
    await lost(store, first)
    resend = await admitted(store, token, dedup)
    await lost(store, resend)
    clock.advance(1)
    await store.record_probe(first, Event.PROBE_COMMITTED, 200, "found", None)
    clock.advance(10)  # past the first's retain_s; the resend is still UNKNOWN

    assert await store.collect_garbage() == 0
    assert await key_owner(store_url) == [(first,)]
    await store.record_probe(resend, Event.PROBE_COMMITTED, 200, "found", None)
    assert await key_owner(store_url) == [(resend,)]


async def test_retention_keeps_a_committed_send_whose_key_an_open_resend_needs(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    """Nor does retention: the committed first send, long settled and its key expired,
    stays (with its key) while a resend of the operation is in doubt."""
    token = await holder(store)
    dedup = order(upstream_idempotent=True, retain_s=5)
    first = await admitted(store, token, dedup)
    await lost(store, first)
    resend = await admitted(store, token, dedup)
    await lost(store, resend)
    clock.advance(1)
    await store.record_probe(first, Event.PROBE_COMMITTED, 200, "found", None)
    clock.advance(100)

    purged = await store.apply_retention(Retention(10, 10, 100, leases_s=0))

    assert purged.effects == 0
    assert await key_owner(store_url) == [(first,)]
    await store.record_probe(resend, Event.PROBE_COMMITTED, 200, "found", None)
    assert (await store.apply_retention(Retention(10, 10, 100, leases_s=0))).effects == 1
    assert await key_owner(store_url) == [(resend,)]


# --- PostgreSQL: one consistent view under the resource's lock ----------------------------


async def test_a_retry_is_never_admitted_while_its_first_send_turns_unknown(
    store_url: str, clock: FakeClock
) -> None:
    """A receipt on one replica and a retry with the same key on another, at once, many
    times: the retry sees the first send either in flight or in doubt, never neither."""
    async with (
        running_store(store_url, clock, instance_id="replica-a") as a,
        running_store(store_url, clock, instance_id="replica-b") as b,
    ):
        for round_ in range(40):
            resource = f"supplier:race-{round_}"
            token = new_token_hash()
            granted(await a.acquire(resource, "w", 60, token))
            new = NewEffect("place-order", resource, "k", "fp", "POST", "/orders/x", 2, 5.0, 60.0)
            first = await a.admit(token, new)
            assert isinstance(first, Admitted), first
            _, retry = await asyncio.gather(
                a.finish_effect(first.effect.id, Event.LOST, None, "lost", None),
                b.admit(token, new),
            )
            assert isinstance(retry, Refusal), (round_, retry)
            assert retry.code in ("request_in_progress", "resource_blocked"), retry


# --- probing ------------------------------------------------------------------------------


PROBE_POLICY = """\
version: 1
store: {store}
upstreams:
  supplier: {{url: "{url}", timeout_s: 5, connect_timeout_s: 0.5}}
routes:
  - name: place-order
    upstream: supplier
    match: {{methods: [POST], path: "/orders/{{sku}}"}}
    resource: "supplier:{{sku}}"
    idempotency: {{required: true}}
    reconcile:
      probe: {{method: GET, path: "/orders/by-key/{{idempotency_key}}"}}
      committed: ["200"]
      not_committed: ["404"]
      settle_s: {settle_s}
      attempts: {attempts}
"""


async def probe_server(clock: FakeClock, answer_after_s: float) -> TestServer:
    """A supplier that answers "not found", taking `answer_after_s` (on the store's clock)."""

    async def by_key(request: web.Request) -> web.Response:
        clock.advance(answer_after_s)
        return web.json_response({"found": False}, status=404)

    app = web.Application()
    app.router.add_get("/orders/by-key/{key}", by_key)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def probe_once(
    store: Store, store_url: str, clock: FakeClock, effect_id: str, settle_s: float, **kw: float
) -> str:
    server = await probe_server(clock, kw.get("answer_after_s", 0.0))
    try:
        text = PROBE_POLICY.format(
            store=store_url,
            url=str(server.make_url("")).rstrip("/"),
            settle_s=settle_s,
            attempts=int(kw.get("attempts", 5)),
        )
        policy = parse_policy(text, "probe.yaml")
        effect = await store.effect(effect_id)
        assert effect is not None
        async with new_client_session() as session:
            result = await probe_effect(store, session, policy, effect)
        return result.conclusion
    finally:
        await server.close()


async def test_a_not_found_asked_inside_the_settle_window_proves_nothing_however_late(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    token = await holder(store)
    effect_id = await admitted(store, token)
    await lost(store, effect_id)
    clock.advance(7.1)
    # Asked 7.1 s after dispatch, answered 8.1 s after it, with settle_s 8.
    conclusion = await probe_once(store, store_url, clock, effect_id, 8, answer_after_s=1.0)
    assert conclusion == "inconclusive"
    assert await state_of(store, effect_id) is EffectState.UNKNOWN
    assert await key_owner(store_url) == [(effect_id,)]


async def test_attempts_1_still_gets_its_probe_after_the_settle_window(
    store: Store, store_url: str, clock: FakeClock
) -> None:
    token = await holder(store)
    effect_id = await admitted(store, token)
    await lost(store, effect_id)
    early = await probe_once(store, store_url, clock, effect_id, 5, attempts=1)
    assert early == "inconclusive"
    effect = await store.effect(effect_id)
    assert effect is not None
    assert (effect.state, effect.probe_attempts) == (EffectState.UNKNOWN, 0)
    assert effect.next_probe_at == clock.approx(effect.created_at + 5)

    clock.advance(6)
    assert await probe_once(store, store_url, clock, effect_id, 5, attempts=1) == "not_committed"
    assert await state_of(store, effect_id) is EffectState.NOT_COMMITTED


async def test_two_replicas_judge_acquire_the_same_after_a_conflict(
    store: Store, clock: FakeClock
) -> None:
    token = await holder(store, ttl_s=1)
    effect_id = await admitted(store, token, order(upstream_timeout_s=0.5))
    await store.finish_effect(effect_id, Event.ANSWERED_COMMITTED, 201, "201", RESPONSE)
    await store.finish_effect(effect_id, Event.ANSWERED_NOT_COMMITTED, 409, "409", None)
    clock.advance(2)
    refused = await acquire(store, RESOURCE)
    assert isinstance(refused, Refusal) and refused.code == "resource_blocked", refused
    assert refused.context["effect_ids"] == [effect_id]
