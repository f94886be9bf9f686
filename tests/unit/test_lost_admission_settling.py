"""The background settling of a lost admission answer's effect (proxy/fenced.py) goes
on until the store answers: past a store that does not answer, and past a bug."""

from __future__ import annotations

from typing import Any, cast

import pytest

from proxy import fenced
from proxy.runtime import Runtime
from store import AdmissionInDoubt, StoreUnavailable


class FlakyStore:
    def __init__(self) -> None:
        self.calls = 0

    async def settle_unsent(self, effect_id: str, resource: str, reason: str) -> None:
        self.calls += 1
        if self.calls == 1:
            raise StoreUnavailable("PostgreSQL did not answer")
        if self.calls == 2:
            raise RuntimeError("a bug")


async def test_settling_goes_on_past_an_unavailable_store_and_a_bug(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fenced, "UNSENT_RETRY_FIRST_S", 0.0)
    store = FlakyStore()
    runtime = Runtime(policy=cast(Any, None), store=cast(Any, store))
    failures: list[str] = []
    monkeypatch.setattr(runtime.metrics, "count_background_failure", failures.append)
    await fenced._settle_until_done(runtime, AdmissionInDoubt("lost", "eff_1", "r"))
    assert store.calls == 3
    assert failures == ["settle-unsent"]
