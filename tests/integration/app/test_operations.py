"""proxy/operations.py and reconcile/operations.py on a real store, SQLite and
PostgreSQL: the operations the admin API and the CLI share, their preconditions and
refusals, with no app in between.

The store here has no background reconciler, so every sweep seen is the operation's own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from core.codes import ErrorCode
from core.lifecycle import DEADLINE_MARGIN_S, Event
from core.records import EffectState, Refusal
from policies import Policy, parse_policy
from proxy import operations
from proxy.operations import MAX_TEXT_CHARS
from reconcile import operations as reconciliation
from store import Admitted, NewEffect, Store
from tests.integration.app.conftest import FakeClock, closed_port, policy_yaml
from tests.integration.app.test_store_contract import granted, new_token_hash, running_store

RESOURCE = "supplier:widget"
UPSTREAM_TIMEOUT_S = 5.0
PAST_DEADLINE_S = UPSTREAM_TIMEOUT_S + DEADLINE_MARGIN_S + 0.5


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[Store]:
    async with running_store(store_url, clock) as opened:
        yield opened


@pytest.fixture
def policy(store_url: str) -> Policy:
    """The test policy; place-order has no reconcile block, so a probe asks nobody."""
    return parse_policy(policy_yaml(store_url, f"http://127.0.0.1:{closed_port()}"))


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


async def dispatching(store: Store, resource: str = RESOURCE, key: str = "order-1") -> str:
    """An effect admitted and never finished (its proxy stalled or died)."""
    token_hash = new_token_hash()
    granted(await store.acquire(resource, "worker-a", 60, token_hash))
    admitted = await store.admit(
        token_hash,
        NewEffect(
            route="place-order",
            resource=resource,
            idempotency_key=key,
            fingerprint=f"fp-{key}",
            method="POST",
            path=f"/orders/{resource.partition(':')[2]}",
            max_in_flight=1,
            upstream_timeout_s=UPSTREAM_TIMEOUT_S,
            retain_s=60,
        ),
    )
    assert isinstance(admitted, Admitted), admitted
    return admitted.effect.id


async def unknown(store: Store, clock: FakeClock, resource: str = RESOURCE) -> str:
    effect_id = await dispatching(store, resource)
    clock.advance(PAST_DEADLINE_S)
    assert effect_id in await store.recover(None, DEADLINE_MARGIN_S)
    return effect_id


async def committed(store: Store, clock: FakeClock) -> str:
    effect_id = await unknown(store, clock)
    await operations.resolve(store, effect_id, "committed", "found it", "alice")
    return effect_id


def refusal(error: pytest.ExceptionInfo[Refusal], code: ErrorCode) -> Refusal:
    assert error.value.code is code, (error.value.code, error.value.detail)
    return error.value


# --- the in-doubt listing ------------------------------------------------------------------------


async def test_in_doubt_on_an_empty_store_is_empty(store: Store, policy: Policy) -> None:
    report = await reconciliation.in_doubt(store, policy)
    assert report.as_json() == {"blocked_resources": [], "in_doubt": []}


async def test_in_doubt_sweeps_overdue_effects_first(
    store: Store, clock: FakeClock, policy: Policy
) -> None:
    effect_id = await dispatching(store)
    clock.advance(PAST_DEADLINE_S)

    report = await reconciliation.in_doubt(store, policy)

    [entry] = report.effects
    assert (entry.effect.id, entry.effect.state) == (effect_id, EffectState.UNKNOWN)
    assert entry.last_event is not None and entry.last_event.kind == "recover"
    assert report.blocked_resources == (RESOURCE,)


async def test_a_request_in_flight_is_in_doubt_but_waits_for_nobody(
    store: Store, clock: FakeClock, policy: Policy
) -> None:
    waiting = await unknown(store, clock, "supplier:waiting")
    # Admitted after the clock moved: within its deadline at the listing.
    in_flight = await dispatching(store, "supplier:flying", key="order-2")

    report = await reconciliation.in_doubt(store, policy)

    states = {entry.effect.id: entry.effect.state for entry in report.effects}
    assert states[waiting] is EffectState.UNKNOWN
    assert states[in_flight] is EffectState.DISPATCHING
    # Only resources waiting for a probe or an operator (as the metric counts them).
    assert report.blocked_resources == ("supplier:waiting",)


async def test_in_doubt_ages_are_on_the_store_clock(
    store: Store, clock: FakeClock, policy: Policy
) -> None:
    effect_id = await dispatching(store)
    clock.advance(PAST_DEADLINE_S + 60)

    [entry] = (await reconciliation.in_doubt(store, policy)).effects

    assert entry.effect.id == effect_id
    assert entry.age_s == clock.approx(PAST_DEADLINE_S + 60)
    assert entry.as_json()["age_s"] == clock.approx(PAST_DEADLINE_S + 60)


async def test_in_doubt_says_whether_the_effect_s_route_has_a_probe(
    store: Store, clock: FakeClock, policy: Policy, store_url: str
) -> None:
    # The status page offers "Probe now" only where this is true.
    effect_id = await dispatching(store)
    clock.advance(PAST_DEADLINE_S)
    probed = parse_policy(
        policy_yaml(
            store_url,
            f"http://127.0.0.1:{closed_port()}",
            reconcile='{probe: {method: GET, path: "/orders/by-key/{idempotency_key}"}, '
            'committed: ["200"], not_committed: ["404"], settle_s: 1, attempts: 5}',
        )
    )
    [without] = (await reconciliation.in_doubt(store, policy)).effects
    [with_probe] = (await reconciliation.in_doubt(store, probed)).effects
    assert (without.effect.id, without.has_probe) == (effect_id, False)
    assert (with_probe.has_probe, with_probe.as_json()["has_probe"]) == (True, True)


async def test_settled_effects_are_not_in_doubt(
    store: Store, clock: FakeClock, policy: Policy
) -> None:
    await committed(store, clock)
    assert (await reconciliation.in_doubt(store, policy)).as_json() == {
        "blocked_resources": [],
        "in_doubt": [],
    }


# --- probe ------------------------------------------------------------------------------------


async def test_probe_of_a_missing_effect_is_not_found(
    store: Store, policy: Policy, session: aiohttp.ClientSession
) -> None:
    with pytest.raises(Refusal) as error:
        await operations.probe(store, session, policy, "eff_nope")
    refused = refusal(error, ErrorCode.NOT_FOUND)
    assert (refused.detail, refused.context) == ("no effect eff_nope", {"effect_id": "eff_nope"})


async def test_probe_of_a_request_in_flight_is_refused_and_records_nothing(
    store: Store, policy: Policy, session: aiohttp.ClientSession
) -> None:
    effect_id = await dispatching(store)
    with pytest.raises(Refusal) as error:
        await operations.probe(store, session, policy, effect_id)
    refusal(error, ErrorCode.EFFECT_IN_FLIGHT)
    history = await operations.effect_history(store, effect_id)
    assert (history.effect.state, history.events) == (EffectState.DISPATCHING, ())


async def test_probe_sweeps_first_so_an_overdue_effect_is_probed(
    store: Store, clock: FakeClock, store_url: str, session: aiohttp.ClientSession
) -> None:
    effect_id = await dispatching(store)
    clock.advance(PAST_DEADLINE_S)  # no proxy is running to sweep it
    # A probe of an upstream that is down: asked, and inconclusive.
    probed = parse_policy(
        policy_yaml(
            store_url,
            f"http://127.0.0.1:{closed_port()}",
            reconcile='{probe: {method: GET, path: "/orders/by-key/{idempotency_key}"}, '
            'committed: ["200"], not_committed: ["404"], settle_s: 1, attempts: 5}',
        )
    )

    result = await operations.probe(store, session, probed, effect_id)

    assert result.conclusion == "inconclusive"
    history = await operations.effect_history(store, effect_id)
    assert history.effect.state is EffectState.UNKNOWN
    # Swept (recover), then probed.
    assert [(event.kind, event.conclusion) for event in history.events] == [
        ("recover", "unknown"),
        ("probe", "inconclusive"),
    ]


async def test_probe_on_a_route_without_a_reconcile_block_is_refused_and_counts_nothing(
    store: Store, clock: FakeClock, policy: Policy, session: aiohttp.ClientSession
) -> None:
    effect_id = await unknown(store, clock)
    before = await operations.effect_history(store, effect_id)

    with pytest.raises(Refusal) as error:
        await operations.probe(store, session, policy, effect_id)

    refused = refusal(error, ErrorCode.NO_PROBE)
    assert refused.context == {"effect_id": effect_id, "route": "place-order"}
    assert "reconcile resolve" in refused.detail
    after = await operations.effect_history(store, effect_id)
    assert after == before
    assert after.effect.probe_attempts == 0


async def test_probe_of_a_settled_effect_is_refused(
    store: Store, clock: FakeClock, policy: Policy, session: aiohttp.ClientSession
) -> None:
    effect_id = await committed(store, clock)
    with pytest.raises(Refusal) as error:
        await operations.probe(store, session, policy, effect_id)
    assert refusal(error, ErrorCode.EFFECT_SETTLED).context["state"] == "COMMITTED"


async def test_probe_of_a_conflicting_effect_is_left_to_an_operator(
    store: Store, clock: FakeClock, policy: Policy, session: aiohttp.ClientSession
) -> None:
    effect_id = await committed(store, clock)
    # A late "not found" contradicts the operator's "committed".
    await store.record_probe(effect_id, Event.PROBE_NOT_COMMITTED, 404, "late", None)
    assert (await store.effect(effect_id)).state is EffectState.CONFLICTING  # type: ignore[union-attr]

    with pytest.raises(Refusal) as error:
        await operations.probe(store, session, policy, effect_id)
    refusal(error, ErrorCode.CONFLICTING_EVIDENCE)

    # The operator can decide it.
    settled = await operations.resolve(store, effect_id, "committed", "seen twice", "alice")
    assert settled.state is EffectState.COMMITTED


# --- resolve -----------------------------------------------------------------------------------


async def test_resolve_keeps_the_trimmed_reason_and_the_operator(
    store: Store, clock: FakeClock
) -> None:
    effect_id = await unknown(store, clock)
    settled = await operations.resolve(
        store, effect_id, "not-committed", "  absent from the portal ", " bob "
    )
    assert (settled.state, settled.settled_by) == (EffectState.NOT_COMMITTED, "operator:bob")
    history = await operations.effect_history(store, effect_id)
    assert history.events[-1].detail == "absent from the portal"


async def test_resolve_passes_the_stores_refusals_on(store: Store, clock: FakeClock) -> None:
    effect_id = await committed(store, clock)
    with pytest.raises(Refusal) as error:
        await operations.resolve(store, effect_id, "not_committed", "second thoughts", "bob")
    refused = refusal(error, ErrorCode.EFFECT_SETTLED)
    assert refused.context == {"effect_id": effect_id, "state": "COMMITTED"}

    with pytest.raises(Refusal) as error:
        await operations.resolve(store, "eff_nope", "committed", "r", "bob")
    assert refusal(error, ErrorCode.NOT_FOUND).detail == "no effect eff_nope"


async def test_resolve_of_a_request_in_flight_is_refused(store: Store) -> None:
    effect_id = await dispatching(store)
    with pytest.raises(Refusal) as error:
        await operations.resolve(store, effect_id, "committed", "r", "bob")
    refusal(error, ErrorCode.EFFECT_IN_FLIGHT)


@pytest.mark.parametrize(
    ("outcome", "reason", "operator", "detail"),
    [
        ("maybe", "r", "bob", "outcome must be committed or not_committed"),
        ("committed", " ", "bob", "reason must not be empty"),
        ("committed", "r" * (MAX_TEXT_CHARS + 1), "bob", "reason must be at most 500 characters"),
        ("committed", "r", "", "operator must not be empty"),
    ],
)
async def test_resolve_checks_its_input_before_the_store(
    store: Store, clock: FakeClock, outcome: str, reason: str, operator: str, detail: str
) -> None:
    effect_id = await unknown(store, clock)
    with pytest.raises(Refusal) as error:
        await operations.resolve(store, effect_id, outcome, reason, operator)
    assert refusal(error, ErrorCode.INVALID_REQUEST).detail == detail
    assert (await store.effect(effect_id)).state is EffectState.UNKNOWN  # type: ignore[union-attr]


# --- leases, receipts, refusals ------------------------------------------------------------------


async def test_revoke_checks_the_resource_and_the_reason(store: Store) -> None:
    with pytest.raises(Refusal) as error:
        await operations.revoke(store, "not valid", "host lost")
    refusal(error, ErrorCode.INVALID_REQUEST)
    with pytest.raises(Refusal) as error:
        await operations.revoke(store, RESOURCE, "")
    refusal(error, ErrorCode.INVALID_REQUEST)
    assert (await operations.lease_view(store, RESOURCE)).epoch == 0

    revoked = await operations.revoke(store, RESOURCE, " host lost ")
    assert revoked == operations.Revoked(RESOURCE, 0, 1, "host lost")
    assert (await operations.lease_view(store, RESOURCE)).epoch == 1


async def test_listings_filter_and_limit(store: Store, clock: FakeClock) -> None:
    first = await dispatching(store, "supplier:a")
    second = await dispatching(store, "supplier:b")
    listed = await operations.list_effects(store, None, None, None)
    assert {effect.id for effect in listed} == {first, second}
    assert [e.id for e in await operations.list_effects(store, "supplier:a", None, None)] == [first]
    assert len(await operations.list_effects(store, None, "DISPATCHING", "1")) == 1
    assert await operations.list_effects(store, None, "UNKNOWN", None) == []
    assert await operations.list_rejections(store, RESOURCE, "5") == []

    bad_listings: list[Callable[[], Awaitable[object]]] = [
        lambda: operations.list_effects(store, "a b", None, None),
        lambda: operations.list_effects(store, None, "unknown", None),
        lambda: operations.list_effects(store, None, None, "0"),
        lambda: operations.list_rejections(store, None, "1001"),
    ]
    for listing in bad_listings:
        with pytest.raises(Refusal) as error:
            await listing()
        refusal(error, ErrorCode.INVALID_REQUEST)


async def test_resolve_of_an_overdue_effect_records_the_sweep_first(
    store: Store, clock: FakeClock
) -> None:
    effect_id = await dispatching(store)
    clock.advance(PAST_DEADLINE_S)  # no proxy is running to sweep it

    await operations.resolve(store, effect_id, "committed", "found it", "alice")

    history = await operations.effect_history(store, effect_id)
    # The history says what happened: nobody heard back, then an operator decided.
    assert [(event.kind, event.conclusion) for event in history.events] == [
        ("recover", "unknown"),
        ("resolve", "committed"),
    ]
