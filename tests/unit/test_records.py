"""The records (core/records.py): the one refusal carrier, the fence headers that name
a fenced write, a stored path, and the records as the API shows them."""

from __future__ import annotations

import pytest

from core.codes import ErrorCode
from core.records import (
    EffectEvent,
    EffectRecord,
    EffectState,
    Refusal,
    Rejection,
    StoredResponse,
    fence_headers,
    stored_path,
)


def test_a_refusal_is_typed_by_its_code_and_keeps_its_detail_and_context() -> None:
    code = next(iter(ErrorCode))
    refusal = Refusal(code, "held by another", {"epoch": 3})
    assert (refusal.code, refusal.detail, str(refusal)) == (
        code,
        "held by another",
        "held by another",
    )
    assert refusal.context == {"epoch": 3}
    assert Refusal(code, "no context").context == {}
    assert repr(refusal) == f"Refusal({code!r}, 'held by another', {{'epoch': 3}})"
    with pytest.raises(TypeError, match="a refusal's code is an ErrorCode, not 'LEASE_HELD'"):
        Refusal("LEASE_HELD", "a string from an untyped caller")  # type: ignore[arg-type]


def test_fence_headers_name_only_the_parts_given() -> None:
    assert fence_headers("order:1", epoch=7, effect_id="eff_1") == {
        "Fence-Epoch": "7",
        "Fence-Resource": "order:1",
        "Fence-Effect-Id": "eff_1",
    }
    # A key's probe in the recovery window: no effect known, the resource alone.
    assert fence_headers("order:1") == {"Fence-Resource": "order:1"}
    assert fence_headers("order:1", epoch=0) == {"Fence-Epoch": "0", "Fence-Resource": "order:1"}


def test_a_stored_path_is_cut_at_256_characters_and_marked_and_keeps_no_nul() -> None:
    assert stored_path("/a\x00b") == "/a%00b"
    assert stored_path("/" + "x" * 255) == "/" + "x" * 255
    assert stored_path("/" + "x" * 256) == "/" + "x" * 255 + "…"


def test_the_records_as_the_api_shows_them() -> None:
    effect = EffectRecord(
        "eff_1", "orders", "order:1", "w1", 3, "k1", "fp", "POST", "/orders/1",
        EffectState.UNKNOWN, "i1", 10.0, 12.0, None, None, "lost",
    )  # fmt: skip
    assert effect.as_json() == {
        "id": "eff_1",
        "route": "orders",
        "resource": "order:1",
        "holder": "w1",
        "epoch": 3,
        "idempotency_key": "k1",
        "fingerprint": "fp",
        "method": "POST",
        "path": "/orders/1",
        "state": "UNKNOWN",
        "instance_id": "i1",
        "created_at": 10.0,
        "deadline": 12.0,
        "finished_at": None,
        "upstream_status": None,
        "reason": "lost",
        "probe_attempts": 0,
        "next_probe_at": None,
        "settled_by": None,
    }
    rejection = Rejection("LEASE_HELD", "PUT", "/x/1")
    assert rejection.as_json() == {
        "at": 0.0,
        "first_seen": 0.0,  # one request: first seen when recorded
        "count": 1,
        "code": "LEASE_HELD",
        "method": "PUT",
        "path": "/x/1",
        "route": None,
        "resource": None,
        "holder": None,
        "epoch": None,
        "fingerprint": None,
        "client": None,
    }
    assert (
        Rejection("LEASE_HELD", "PUT", "/x/1", at=9.0, first_seen=5.0).as_json()["first_seen"]
        == 5.0
    )
    event = EffectEvent(1.0, "probe", "prober", 404, "NOT_COMMITTED", "absent")
    assert event.as_json() == {
        "at": 1.0,
        "kind": "probe",
        "actor": "prober",
        "upstream_status": 404,
        "conclusion": "NOT_COMMITTED",
        "detail": "absent",
    }
    assert StoredResponse(200, (), b"ok").body_kept
