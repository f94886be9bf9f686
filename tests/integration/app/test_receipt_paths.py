"""A receipt's plan has two writers (store/steps.py): `apply_event`, step by step, and
`write_in_one_statement`, the backend's `receipt` block that the request path takes.
Every receipt the lifecycle table (core/lifecycle.py) can plan is run through both, on
both backends, on an effect in each state a receipt may find it in, with and without
a key, and with another effect open under its key: the two leave the same rows in
effects, idempotency and effect_events, and answer the same. Where the block declines
(a key another open effect under it still needs), the long way it falls back to writes
what the steps write.

And the state an admission decides on is the state every other call reads: the one
reader (store/reads.py) gets the same records from admission_state's row as from
resource_state's, whatever the effects under the resource."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from core import lifecycle
from core.lifecycle import Event
from core.records import EffectRecord, EffectState, StoredResponse
from store import Admitted, NewEffect, Receipt, Store
from store.base import Tx
from store.postgres import PostgresConnector
from store.reads import (
    ADMISSION_COLUMNS,
    RESOURCE_STATE_COLUMNS,
    admission_records,
    resource_state,
)
from store.steps import (
    RECEIPT_APPLIED,
    RECEIPT_COLUMNS,
    RECEIPT_NOW,
    writes_in_one_statement,
)
from tests.integration.app import backends
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import granted, new_token_hash, running_store

KEY = "order-1"
RESPONSE = StoredResponse(201, (("Content-Type", "application/json"),), b'{"order": 1}')
# The receipt each event stands for: its upstream status and the responses it may keep.
RECEIPTS: dict[Event, tuple[int | None, tuple[StoredResponse | None, ...]]] = {
    Event.ANSWERED_COMMITTED: (201, (RESPONSE, None)),
    Event.ANSWERED_NOT_COMMITTED: (409, (None,)),
    Event.NOT_SENT: (None, (None,)),
    Event.LOST: (None, (None,)),
}
# A receipt's earlier receipts that bring an effect to each state it may find it in.
REACHED_BY: dict[EffectState, tuple[Event, ...]] = {
    EffectState.DISPATCHING: (),
    EffectState.UNKNOWN: (Event.LOST,),
    EffectState.COMMITTED: (Event.ANSWERED_COMMITTED,),
    EffectState.NOT_COMMITTED: (Event.ANSWERED_NOT_COMMITTED,),
    EffectState.NOT_SENT: (Event.NOT_SENT,),
    EffectState.CONFLICTING: (Event.ANSWERED_COMMITTED, Event.ANSWERED_NOT_COMMITTED),
}
# Setup happens this long before the receipts, longer than an effect's retain_s: a time
# the receipt did not write is before it.
SETUP_BEFORE_S = 100.0
EFFECTS = (
    "SELECT resource, id, state, created_at, deadline, finished_at, upstream_status, reason,"
    " settled_by, next_probe_at, probe_claimed_by, probe_claimed_until, probe_attempts,"
    " idempotency_key, fingerprint, epoch, retain_s FROM effects"
)
KEYS = (
    "SELECT resource, key, fingerprint, effect_id, epoch, expires_at, response_status,"
    " response_headers, response_body, settled_by FROM idempotency"
)
EVENTS = (
    "SELECT e.resource, v.effect_id, v.at, v.kind, v.actor, v.upstream_status, v.conclusion,"
    " v.detail FROM effect_events v JOIN effects e ON e.id = v.effect_id"
)
# The columns of each that hold a time.
TIMES = {EFFECTS: {3, 4, 5, 9, 11}, KEYS: {5}, EVENTS: {2}}


@dataclass(frozen=True)
class World:
    """The effect a receipt is for (the last one admitted, unless `first_gets_it`) and
    what happened under its resource before."""

    name: str
    before: tuple[Event, ...] = ()
    key: str | None = KEY
    resend: bool = False  # the effect, LOST, is resent: an open effect under its key
    first_gets_it: bool = False  # the receipt is the first send's, not its resend's
    in_dispute: bool = False  # an earlier send under the key is CONFLICTING
    probed: bool = False  # LOST, then settled COMMITTED by a probe (settled_by is set)


WORLDS = [
    *(World(f"{state.value}-key", before) for state, before in REACHED_BY.items()),
    *(World(f"{state.value}-no-key", before, key=None) for state, before in REACHED_BY.items()),
    World("resend-of-an-unknown", resend=True),
    World("unknown-being-resent", resend=True, first_gets_it=True),
    World("after-a-send-in-dispute", in_dispute=True),
    World("committed-by-a-probe-key", probed=True),
    World("committed-by-a-probe-no-key", key=None, probed=True),
]


@dataclass
class Case:
    world: World
    event: Event
    status: int | None
    response: StoredResponse | None
    one_statement: bool  # the receipt is given the effect as it was (the request path's)
    resource: str = ""
    token_hash: str = ""
    effect_id: str = ""
    ids: tuple[str, ...] = ()  # every effect under the resource, in admission order
    before: EffectRecord | None = None
    written_at: float = 0.0  # the store's time just before the receipt
    receipt: Receipt | None = None
    blocks: tuple[bool, ...] = ()  # what each `receipt` block it ran answered (applied)


async def _build(store: Store, clock: FakeClock, case: Case, serial: int) -> None:
    world = case.world
    case.resource = f"r{serial}-{'one' if case.one_statement else 'steps'}"
    token = case.token_hash = new_token_hash()
    granted(await store.acquire(case.resource, "w", 3600, token))
    new = NewEffect(
        "place-order",
        case.resource,
        world.key,
        "fp",
        "POST",
        "/orders/x",
        2,
        5.0,
        60.0,
        upstream_idempotent=world.resend,
    )

    async def admit() -> str:
        decision = await store.admit(token, new)
        assert isinstance(decision, Admitted), (world, decision)
        return decision.effect.id

    async def receive(effect_id: str, event: Event) -> None:
        status, responses = RECEIPTS[event]
        await store.finish_effect(effect_id, event, status, f"earlier {event}", responses[0])

    ids = [await admit()]
    if world.resend or world.in_dispute:
        await receive(ids[0], Event.LOST)
    if world.in_dispute:
        clock.advance(1)
        await store.record_probe(ids[0], Event.PROBE_NOT_COMMITTED, 404, "not found", None)
        ids.append(await admit())
        await receive(ids[0], Event.ANSWERED_COMMITTED)  # contradicts the probe
    elif world.resend:
        ids.append(await admit())
    for event in world.before:
        await receive(ids[-1], event)
    if world.probed:
        await receive(ids[-1], Event.LOST)
        clock.advance(1)
        await store.record_probe(ids[-1], Event.PROBE_COMMITTED, 200, "found", None)
    case.ids = tuple(ids)
    case.effect_id = ids[0] if world.first_gets_it else ids[-1]
    case.before = await store.effect(case.effect_id)


async def _receive(store: Store, case: Case) -> None:
    assert case.before is not None
    blocks: list[bool] = []
    statement = store.connector.statement

    async def watched(query: str, **params: Any) -> Any:
        values = await statement(query, **params)
        assert values is not None  # both backends have the block
        assert len(values) == len(RECEIPT_COLUMNS)
        blocks.append(bool(values[RECEIPT_APPLIED]))
        return values

    store.connector.statement = watched  # type: ignore[method-assign]
    try:
        case.written_at = await store.now()
        case.receipt = await store.finish_effect(
            case.effect_id,
            case.event,
            case.status,
            "the upstream said so",
            case.response,
            admitted=case.before if case.one_statement else None,
        )
    finally:
        del store.connector.statement
    case.blocks = tuple(blocks)


def _cases() -> list[tuple[Case, Case]]:
    return [
        (
            Case(world, event, status, response, one_statement=False),
            Case(world, event, status, response, one_statement=True),
        )
        for world in WORLDS
        for event, (status, responses) in RECEIPTS.items()
        for response in responses
    ]


def _normal(value: Any, case: Case, is_time: bool) -> Any:
    """`value` without what differs between two runs of the same case: effect ids and
    resource names by their role, times by when they are from (an offset from the
    receipt's time, or before it)."""
    if is_time and value is not None:
        offset = float(value) - case.written_at
        return "before" if offset < -1 else f"at+{round(offset)}s"
    if isinstance(value, str):
        for n, effect_id in enumerate(case.ids):
            value = value.replace(effect_id, f"effect-{n}")
        return value.replace(case.resource, "resource")
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def _rows_of(case: Case, found: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[str]]:
    return {
        sql: sorted(
            repr(tuple(_normal(v, case, i in TIMES[sql]) for i, v in enumerate(row)))
            for row in found[sql]
            if row[0] == case.resource
        )
        for sql in (EFFECTS, KEYS, EVENTS)
    }


def _answer(case: Case) -> tuple[Any, ...]:
    receipt = case.receipt
    assert receipt is not None
    effect = tuple(
        _normal(value, case, name in {"created_at", "deadline", "finished_at", "next_probe_at"})
        for name, value in vars(receipt.effect).items()
    )
    return receipt.transition, effect, _normal(receipt.key_holder, case, False)


async def _same_state_for_every_reader(store: Store, case: Case) -> None:
    """What admission reads of the resource is what a lease call reads of it."""
    assert case.before is not None

    async def operation(tx: Tx) -> None:
        by_lease_calls = await resource_state(tx, case.resource, lock=True)
        named = await tx.one("resource_state", resource=case.resource)
        assert named is not None and tuple(named) == RESOURCE_STATE_COLUMNS
        row = await tx.one(
            "admission_state",
            token_hash=case.token_hash,
            resource=case.resource,
            key=case.world.key,
        )
        # The reader takes the row by position: the backend answers its columns in order.
        assert row is not None and tuple(row) == ADMISSION_COLUMNS
        lease, state, _ = admission_records(tuple(row.values()), case.resource, case.world.key)
        assert state == by_lease_calls
        assert lease is not None and lease == by_lease_calls.lease

    await store.connector.write(operation)


async def test_both_writers_of_every_receipts_plan_leave_the_same_rows(
    store_url: str, clock: FakeClock
) -> None:
    pairs = _cases()
    async with running_store(store_url, clock) as store:
        for serial, pair in enumerate(pairs):
            for case in pair:
                await _build(store, clock, case, serial)
        for steps, _ in pairs:
            await _same_state_for_every_reader(store, steps)
        clock.advance(SETUP_BEFORE_S)
        for pair in pairs:
            for case in pair:
                await _receive(store, case)
    found = {sql: await backends.rows(store_url, sql) for sql in (EFFECTS, KEYS, EVENTS)}

    covered: dict[str, set[tuple[EffectState, Event]]] = defaultdict(set)
    for steps, one in pairs:
        assert steps.before is not None and one.before is not None
        label = (one.world.name, one.event.value, one.response is not None)
        assert _answer(one) == _answer(steps), label
        assert _rows_of(one, found) == _rows_of(steps, found), label
        plan = lifecycle.plan(
            one.before,
            one.event,
            "the upstream said so",
            upstream_status=one.status,
            response=one.response,
        )
        assert plan is not None
        pair_key = (one.before.state, one.event)
        assert steps.blocks == ()
        if not writes_in_one_statement(plan):
            assert one.blocks == (), label
            covered["steps only"].add(pair_key)
        elif one.blocks == (True,):
            covered["one statement"].add(pair_key)
        else:
            # Declined: the key it frees is another open effect's now, and the steps
            # pass it on.
            assert one.blocks == (False,) and plan.key is lifecycle.Key.FREE, label
            assert one.world.resend or one.world.in_dispute, label
            covered["declined"].add(pair_key)
    receipts_in_the_table = {
        (state, event) for state, event in lifecycle.TABLE if event in lifecycle.RECEIPTS
    }
    assert set().union(*covered.values()) == receipts_in_the_table
    # The request path's receipts, on an effect as admitted, all take the one statement.
    assert {(EffectState.DISPATCHING, event) for event in lifecycle.RECEIPTS} <= covered[
        "one statement"
    ]
    assert covered["declined"]


async def test_the_receipt_block_answers_the_columns_its_reader_takes_by_position(
    store_url: str, clock: FakeClock
) -> None:
    """store/steps.py reads the receipt's row by position (RECEIPT_COLUMNS): a receipt
    for an effect that is not there writes nothing, and answers the time and so."""
    params: dict[str, Any] = {
        "id": "eff_none",
        "resource": "r",
        "expected": EffectState.DISPATCHING.value,
        "state": EffectState.COMMITTED.value,
        "upstream_status": 201,
        "reason": None,
        "probe_now": False,
        "key_action": lifecycle.Key.KEEP.name.lower(),
        "idempotency_key": None,
        "fingerprint": "fp",
        "epoch": 1,
        "default_retain_s": 60.0,
        "status": None,
        "headers": None,
        "body": None,
        "key_settled_by": None,
        "kind": "receipt",
        "actor": "test",
        "conclusion": None,
    }
    async with running_store(store_url, clock) as store:
        values = await store.connector.statement("receipt", **params)
        assert values is not None and len(values) == len(RECEIPT_COLUMNS)
        assert values[RECEIPT_APPLIED] is False
        assert isinstance(values[RECEIPT_NOW], float)
        connector = store.connector
        if isinstance(connector, PostgresConnector):  # its block names the columns too
            store_id = connector.store_id

            async def named(tx: Tx) -> Any:
                return await tx.one("receipt", **params, store_id=store_id)

            row = await connector.write(named)
            assert tuple(row) == RECEIPT_COLUMNS and row["store_id"] == store_id


def test_only_a_receipts_plan_is_written_in_one_statement() -> None:
    """The block writes the effect's upstream status in its history row: that of a
    probe's or a resend's plan is the event's own, so those always take the steps, even
    when they would otherwise qualify (settled by nobody named)."""
    unknown = EffectRecord(
        "eff_1",
        "place-order",
        "r",
        "w",
        1,
        None,
        "fp",
        "POST",
        "/orders/x",
        EffectState.UNKNOWN,
        "instance-1",
        0.0,
        5.0,
        5.0,
        None,
        "lost",
    )
    for event in (Event.PROBE_COMMITTED, Event.RESEND_NOT_COMMITTED):
        plan = lifecycle.plan(unknown, event, "found", upstream_status=200)
        assert plan is not None and plan.moves and plan.settled_by is None
        assert not writes_in_one_statement(plan)
    receipt = lifecycle.plan(unknown, Event.ANSWERED_COMMITTED, "201", upstream_status=201)
    assert receipt is not None and writes_in_one_statement(receipt)
