"""An admission whose COMMIT's answer is lost, with real processes: a replica whose
store URL goes through tests/nemesis/pgrelay.py to PostgreSQL, the demo upstream in
its own process as the judge of what was applied.

The relay cuts the admission's transaction after forwarding its COMMIT (PostgreSQL
commits the DISPATCHING effect, the replica never hears it) or before (nothing is
committed). Either way nothing was sent to the upstream. The replica must say so,
settle the effect as not sent if it was recorded, and let the same key through on
the worker's retry, with no operator: once it answered "nothing was done" (untrue:
an effect was recorded), then 409 request_in_progress, then 423 resource_blocked for
every key once a sweep turned the orphan UNKNOWN.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.integration.replicas.conftest import Api, Fleet, api_for, eventually, resource_of
from tests.nemesis.pgrelay import Action, PgRelay

# What only the admission's transaction says (store/postgres.sql admission_state).
ADMISSION = "fenceproxy_admission_state"


@pytest.fixture
def relay(pg_url: str) -> Iterator[PgRelay]:
    parts = urlsplit(pg_url)
    with PgRelay(parts.hostname or "127.0.0.1", parts.port or 5432) as running:
        yield running


async def _rule_writes(api: Api, key: str) -> list[dict[str, Any]]:
    return [e for e in await api.upstream_effects() if e["idempotency_key"] == key]


@pytest.mark.parametrize("action", ["cut_after_commit", "cut_before_commit"])
async def test_a_lost_admission_answer_is_settled_not_sent_and_the_retry_goes_through(
    pg_url: str, relay: PgRelay, fleet: Fleet, action: Action
) -> None:
    fleet.start_upstream()
    proxy = fleet.start_proxy("r0", relay.url(pg_url), timeout_s=2.0)
    target = f"lost-{uuid.uuid4().hex[:8]}"
    async with api_for(fleet) as api:
        lease = await api.acquire(proxy, resource_of(target), "worker-a", ttl_s=30)
        assert lease.status == 201, lease
        token = lease.body["token"]
        key = f"k-{uuid.uuid4().hex}"
        fault = relay.arm(action, match=ADMISSION)

        answer = await api.put_rule(proxy, target, token, key, {"v": 1})

        assert fault.wait(5.0), "the relay never saw the admission's COMMIT"
        assert fault.report is not None
        recorded = action == "cut_after_commit"
        assert fault.report.forwarded_commit is recorded
        assert fault.report.committed is (True if recorded else None), fault.report
        assert await _rule_writes(api, key) == []  # nothing reached the upstream
        assert answer.status == 503, answer
        assert answer.code == "store_unavailable", answer
        detail = answer.body["detail"]
        assert "nothing was sent" in detail, answer
        assert "nothing was done" not in detail, answer
        assert answer.body.get("settled") is True, answer
        effects = await api.effects(proxy, resource=resource_of(target))
        if recorded:
            [effect] = effects
            assert effect["state"] == "NOT_SENT", effect
            assert effect["id"] == answer.body["effect_id"], answer
        else:
            assert effects == []

        retry = await api.put_rule(proxy, target, token, key, {"v": 1})
        assert retry.status in (200, 201), retry
        assert len(await _rule_writes(api, key)) == 1  # applied once, by the retry
        again = await api.put_rule(proxy, target, token, key, {"v": 1})
        assert again.headers.get("idempotent-replayed") == "true", again
        assert len(await _rule_writes(api, key)) == 1
        states = sorted(e["state"] for e in await api.effects(proxy, resource=resource_of(target)))
        assert states == (["COMMITTED", "NOT_SENT"] if recorded else ["COMMITTED"])


async def test_a_commit_still_on_its_way_is_waited_for_before_the_answer(
    pg_url: str, relay: PgRelay, fleet: Fleet
) -> None:
    """The replica is cut off while its COMMIT is still on its way to the old backend
    (the relay sends it a second later). The lookup waits for the resource's lock,
    which that backend holds until the COMMIT lands, so it finds the effect and
    settles it: a lookup that did not wait would say "not recorded" and leave it to
    commit DISPATCHING behind the worker's back."""
    fleet.start_upstream()
    proxy = fleet.start_proxy("r0", relay.url(pg_url), timeout_s=2.0)
    async with api_for(fleet) as api:
        lease = await api.acquire(proxy, resource_of("late-commit"), "worker-a", ttl_s=30)
        token = lease.body["token"]
        key = f"k-{uuid.uuid4().hex}"
        fault = relay.arm("cut_after_commit", match=ADMISSION, delay_s=1.0)

        answer = await api.put_rule(proxy, "late-commit", token, key, {"v": 1})

        assert fault.wait(5.0) and fault.report is not None and fault.report.committed
        assert answer.status == 503 and answer.body.get("settled") is True, answer
        [effect] = await api.effects(proxy, resource=resource_of("late-commit"))
        assert effect["state"] == "NOT_SENT", effect
        retry = await api.put_rule(proxy, "late-commit", token, key, {"v": 1})
        assert retry.status in (200, 201), retry
        assert len(await _rule_writes(api, key)) == 1


async def test_a_store_unreachable_after_the_lost_answer_is_settled_in_the_background(
    pg_url: str, relay: PgRelay, fleet: Fleet
) -> None:
    fleet.start_upstream()
    config_path, port = fleet.write_config("r0", relay.url(pg_url), timeout_s=30.0)
    config = yaml.safe_load(config_path.read_text())
    config["store_pool"].update(acquire_timeout_s=1.0, command_timeout_s=1.0)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    proxy = fleet.spawn_proxy("r0", config_path, port)
    fleet.wait_ready(proxy)
    async with api_for(fleet) as api:
        lease = await api.acquire(proxy, resource_of("dark"), "worker-a", ttl_s=60)
        token = lease.body["token"]
        key = f"k-{uuid.uuid4().hex}"
        fault = relay.arm("cut_after_commit", match=ADMISSION, blackhole_after=True)

        answer = await api.put_rule(proxy, "dark", token, key, {"v": 1})

        assert fault.wait(5.0) and fault.report is not None and fault.report.committed
        assert answer.status == 503, answer
        assert answer.body.get("settled") is False, answer
        assert "nothing was sent" in answer.body["detail"], answer
        effect_id = answer.body["effect_id"]
        relay.blackhole(False)

        async def settled() -> bool:
            return bool((await api.effect(proxy, effect_id))["state"] == "NOT_SENT")

        await eventually("the replica to settle the effect in the background", settled, 20.0)
        retry = await api.put_rule(proxy, "dark", token, key, {"v": 1})
        assert retry.status in (200, 201), retry
        assert len(await _rule_writes(api, key)) == 1
