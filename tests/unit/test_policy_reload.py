"""The reload rules (policies/reloading.py): what a running proxy may take from its
file read again, and which changes would strand an effect in doubt; the digest; and
the upstream sessions a reload retires (proxy/forwarding.py UpstreamPools)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest

from core.records import EffectState
from policies import load_policy_with_digest, parse_policy
from policies.reloading import (
    RESTART_KEYS,
    Unsettled,
    auth_taken_away,
    restart_changes,
    stranded,
    stranding_changes,
)
from proxy import reloading
from proxy.forwarding import UpstreamPools
from proxy.runtime import Runtime, Upstreams
from store import Store

BASE = """\
version: 1
listen: {host: 127.0.0.1, port: 8080}
store: sqlite:///state/test.db
leases: {min_ttl_s: 1, max_ttl_s: 300, default_ttl_s: 30}
upstreams:
  supplier: {url: "http://127.0.0.1:9001", timeout_s: 5, connect_timeout_s: 1}
routes:
  - name: place-order
    upstream: supplier
    match: {methods: [POST], path: "/orders/{sku}"}
    resource: "supplier:{sku}"
    fence: required
    idempotency: {required: true}
    reconcile:
      probe: {method: GET, path: "/orders/by-key/{idempotency_key}"}
      committed: ["200"]
      not_committed: ["404"]
  - name: read-orders
    upstream: supplier
    match: {methods: [GET], path: "/orders/{sku}"}
    fence: none
"""


def edited(old: str, new: str) -> str:
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


AUTH = """\
auth:
  clients:
    - {name: workers, key_sha256: "%s", resources: ["supplier:*"], may: [lease]}
"""
WORKERS_KEY = AUTH % ("a" * 64)


def test_routes_upstreams_leases_quotas_and_clients_change_without_a_restart() -> None:
    old = parse_policy(BASE + WORKERS_KEY)
    for text in (
        edited("timeout_s: 5", "timeout_s: 9"),
        edited("default_ttl_s: 30", "default_ttl_s: 60"),
        edited('[GET], path: "/orders/{sku}"', '[GET], path: "/o/{sku}"'),
        BASE + "quotas: {live_leases: 5}\n",
    ):
        assert restart_changes(old, parse_policy(text + WORKERS_KEY)) == []
    for auth in (
        AUTH % ("b" * 64),  # a key rotated
        WORKERS_KEY
        + "    - {name: readers, key_env: READERS_KEY, resources: ['*'], may: [read]}\n",
        WORKERS_KEY.replace('["supplier:*"]', '["supplier:a"]'),
    ):
        assert restart_changes(old, parse_policy(BASE + auth)) == []


def test_auth_may_be_added_by_a_reload_but_not_taken_away() -> None:
    without, guarded = parse_policy(BASE), parse_policy(BASE + WORKERS_KEY)
    assert auth_taken_away(without, guarded) is None
    assert auth_taken_away(guarded, parse_policy(BASE + AUTH % ("b" * 64))) is None
    assert auth_taken_away(without, without) is None
    refusal = auth_taken_away(guarded, without)
    assert refusal is not None and "restart" in refusal


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("port: 8080", "port: 8081", "listen"),
        ("sqlite:///state/test.db", "sqlite:///state/other.db", "store"),
    ],
)
def test_a_key_read_once_at_start_needs_a_restart(old: str, new: str, key: str) -> None:
    assert restart_changes(parse_policy(BASE), parse_policy(edited(old, new))) == [key]


def test_every_restart_key_is_compared() -> None:
    """Each key of RESTART_KEYS, changed alone, is named (a key dropped from the list
    would be taken half: a new value in the policy, the old one in the listener)."""
    old = parse_policy(BASE)
    for key in RESTART_KEYS:
        different: dict[str, Any] = {key: object()}
        changed = dataclasses.replace(old, **different)
        assert restart_changes(old, changed) == [key]


def test_a_fenced_route_removed_unfenced_or_without_its_probe_is_taken() -> None:
    old = parse_policy(BASE)
    head, reads = BASE.split("  - name: read-orders")
    removed = parse_policy(head.split("  - name: place-order")[0] + "  - name: read-orders" + reads)
    assert stranding_changes(old, removed) == {"place-order": "removed"}
    no_probe = parse_policy(
        BASE.split("    reconcile:")[0] + BASE.split('not_committed: ["404"]\n')[1]
    )
    assert stranding_changes(old, no_probe) == {"place-order": "its reconcile: probe dropped"}
    # A pass-through route records no effect: taking it away strands nothing.
    no_reads = parse_policy(BASE.split("  - name: read-orders")[0])
    assert stranding_changes(old, no_reads) == {}
    assert stranding_changes(old, old) == {}


def test_only_effects_on_taken_routes_are_named() -> None:
    effects = [
        Unsettled("eff_1", "place-order", "supplier:a", "UNKNOWN"),
        Unsettled("eff_2", "other", "x:b", "DISPATCHING"),
    ]
    assert stranded({"place-order": "removed"}, effects) == [
        "eff_1 (UNKNOWN, resource supplier:a) on route place-order (removed)"
    ]
    assert stranded({"third": "removed"}, effects) == []


def test_the_digest_is_the_sha256_of_the_file_bytes(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(BASE)
    policy, digest = load_policy_with_digest(path)
    assert digest == hashlib.sha256(BASE.encode()).hexdigest()
    assert policy == parse_policy(BASE, str(path), tmp_path)
    # A comment is a difference: the copies are not the same file.
    path.write_text(BASE + "# note\n")
    assert load_policy_with_digest(path)[1] != digest


async def test_a_changed_upstream_gets_new_sessions_and_the_old_stay_until_closed() -> None:
    old = parse_policy(BASE).upstreams["supplier"]
    new = dataclasses.replace(old, url="http://127.0.0.1:9002")
    pools = UpstreamPools([old])
    before = pools.fenced(old), pools.pass_through(old)
    retired = pools.update([new])
    assert retired == [old]
    # A request that started with the old upstream still finds its sessions.
    assert (pools.fenced(old), pools.pass_through(old)) == before
    assert pools.fenced(new) not in before
    await pools.close_retired(retired)
    assert all(session.closed for session in before)
    with pytest.raises(KeyError):
        pools.fenced(old)
    # Unchanged upstreams keep their sessions across a reload.
    kept = pools.fenced(new)
    assert pools.update([new]) == []
    assert pools.fenced(new) is kept
    await pools.close()


async def test_an_effect_a_request_older_than_the_reload_left_in_doubt_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check before the swap cannot see an effect that a request which started
    under the old policy leaves in doubt after it: once that request is done, the
    effect is named in the log for an operator."""
    effect = SimpleNamespace(
        id="eff_9", route="place-order", resource="supplier:a", state=EffectState.UNKNOWN
    )

    class Effects:
        async def in_doubt(self, limit: int) -> list[Any]:
            return [effect]

    runtime = Runtime(parse_policy(BASE), cast(Store, Effects()))
    generation = runtime.begin_request()
    upstreams = Upstreams(cast(aiohttp.ClientSession, None), UpstreamPools([]))
    drained = asyncio.create_task(
        reloading._after_drain(runtime, upstreams, [], {"place-order": "removed"}, generation)
    )
    await asyncio.sleep(0)
    assert not drained.done()  # the request that started before is still running
    runtime.end_request(generation)
    await drained
    assert "eff_9 (UNKNOWN, resource supplier:a) on route place-order (removed)" in caplog.text
