"""The admission's row is read by position (store/reads.py ADMISSION_COLUMNS): each
column lands in the field of its name. The backends' SQL answering the columns in that
order is tests/integration/app/test_receipt_paths.py's."""

from __future__ import annotations

import json
from typing import Any

from core.records import (
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    OpenEffect,
    ResourceState,
    StoredResponse,
)
from store import rows
from store.reads import ADMISSION_COLUMNS, RESOURCE_STATE_COLUMNS, admission_records

RESOURCE = "orders:7"
KEY = "order-7"
OPEN = ["eff_open", "UNKNOWN", 3, KEY, "fp-open"]
RESPONSE = StoredResponse(201, (("Content-Type", "text/plain"),), b"made", reason="Created")


def _admission_row(**changed: Any) -> dict[str, Any]:
    """A row whose every column holds a value no other column holds."""
    named = {
        "now": 1000.5,
        "store_id": "store-1",
        "t_resource": RESOURCE,
        "t_epoch": 3,
        "t_holder": "worker-t",
        "t_granted_at": 10.25,
        "t_expires_at": 40.25,
        "t_ended_at": 35.5,
        "t_end_reason": "released",
        "t_client": "client-t",
        "epoch": 4,
        "epoch_floor": 2,
        "holder": "worker-s",
        "granted_at": 50.75,
        "expires_at": 80.75,
        "ended_at": None,
        "end_reason": None,
        "client": "client-s",
        "open_effects": json.dumps([OPEN]),
        "i_fingerprint": "fp-key",
        "i_effect_id": "eff_key",
        "i_effect_state": "COMMITTED",
        "i_epoch": 1,
        "i_expires_at": 500.125,
        "i_response_status": RESPONSE.status,
        "i_response_headers": rows.response_meta(RESPONSE),
        "i_response_body": RESPONSE.body,
        "i_settled_by": "probe",
    }
    assert tuple(named) == ADMISSION_COLUMNS
    return {**named, **changed}


def _values(named: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(named[name] for name in ADMISSION_COLUMNS)


def test_each_column_of_the_admission_row_lands_in_the_field_of_its_name() -> None:
    lease, state, existing = admission_records(_values(_admission_row()), RESOURCE, KEY)
    # The token's lease (epoch 3) is not the resource's current one (epoch 4).
    assert lease == LeaseRecord(RESOURCE, 3, "worker-t", 10.25, 40.25, 35.5, "released", "client-t")
    assert state == ResourceState(
        resource=RESOURCE,
        epoch=4,
        lease=LeaseRecord(RESOURCE, 4, "worker-s", 50.75, 80.75, None, None, "client-s"),
        open_effects=(OpenEffect("eff_open", EffectState.UNKNOWN, 3, KEY, "fp-open"),),
        epoch_floor=2,
    )
    assert existing == IdempotencyRecord(
        resource=RESOURCE,
        key=KEY,
        fingerprint="fp-key",
        effect_id="eff_key",
        effect_state=EffectState.COMMITTED,
        epoch=1,
        expires_at=500.125,
        response=RESPONSE,
        settled_by="probe",
    )


def test_the_tokens_lease_read_under_the_lock_is_the_resources_current_one() -> None:
    named = _admission_row(t_epoch=4, epoch=4)
    lease, state, _ = admission_records(_values(named), RESOURCE, KEY)
    assert state is not None and lease == state.lease


def test_a_row_without_the_token_the_resource_or_the_key_reads_as_none() -> None:
    assert admission_records(_values(_admission_row(t_resource=None)), RESOURCE, KEY) == (
        None,
        None,
        None,
    )
    other = admission_records(_values(_admission_row(t_resource="other")), RESOURCE, KEY)
    assert other[0] is not None and other[0].resource == "other" and other[1:] == (None, None)
    never = _admission_row(
        epoch=None, epoch_floor=None, holder=None, open_effects="[]", i_effect_id=None
    )
    _, state, existing = admission_records(_values(never), RESOURCE, None)
    assert state == ResourceState(RESOURCE, 0, None, (), 0) and existing is None


def test_the_resource_state_row_is_read_by_the_same_columns() -> None:
    named = _admission_row()
    values = tuple(
        RESOURCE if name == "resource" else named[name] for name in RESOURCE_STATE_COLUMNS
    )
    _, from_admission, _ = admission_records(_values(named), RESOURCE, KEY)
    at = RESOURCE_STATE_COLUMNS.index(rows.STATE_COLUMNS[0])
    assert rows.resource_state(values, at, RESOURCE) == from_admission
