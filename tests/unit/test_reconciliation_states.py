"""The states reconciliation works on (core/lifecycle.py): which effects wait for it
(`AWAITING_RECONCILIATION`), and which an operator's probe may ask about
(`probe_refusal`): only an UNKNOWN one; every other state is refused with a code of
its own, whichever face (admin API, CLI) asked."""

from __future__ import annotations

import pytest

from core.codes import ErrorCode
from core.lifecycle import AWAITING_RECONCILIATION, BLOCKING, probe_refusal
from core.records import EffectState


def test_what_waits_for_reconciliation_is_what_blocks_and_cannot_still_land() -> None:
    # A request in flight blocks its resource too, but waits for nobody: its own
    # answer or the sweep settles it.
    assert {EffectState.UNKNOWN, EffectState.CONFLICTING} == AWAITING_RECONCILIATION
    assert BLOCKING - {EffectState.DISPATCHING} == AWAITING_RECONCILIATION


def test_an_unknown_effect_is_probed() -> None:
    assert probe_refusal("eff-1", EffectState.UNKNOWN) is None


PROBE_REFUSED = {
    EffectState.DISPATCHING: ErrorCode.EFFECT_IN_FLIGHT,
    EffectState.COMMITTED: ErrorCode.EFFECT_SETTLED,
    EffectState.NOT_COMMITTED: ErrorCode.EFFECT_SETTLED,
    EffectState.NOT_SENT: ErrorCode.EFFECT_SETTLED,
    # In doubt, but more evidence cannot settle it: only an operator can.
    EffectState.CONFLICTING: ErrorCode.CONFLICTING_EVIDENCE,
}


def test_every_state_is_either_probed_or_refused_here() -> None:
    # A new state must be decided on, not fall through to "settled".
    assert {*PROBE_REFUSED, EffectState.UNKNOWN} == set(EffectState)


@pytest.mark.parametrize(("state", "code"), PROBE_REFUSED.items())
def test_every_other_state_refuses_a_probe_with_its_own_code(
    state: EffectState, code: ErrorCode
) -> None:
    refused = probe_refusal("eff-1", state)
    assert refused is not None
    assert refused.code is code
    assert refused.context == {"effect_id": "eff-1", "state": state.value}
    assert state.value in refused.detail
    assert "only an UNKNOWN effect is probed" in refused.detail
