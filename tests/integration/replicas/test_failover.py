"""A failover to an asynchronous standby, with real processes.

A primary and its streaming standby (tests/pgstandby.py); two proxy replicas on the primary;
workers taking turns on two shared resources and writing under load to the demo
upstream, which counts its own effects: orders on `r:o` (a route with a probe),
rules on `r:u` (a route without one). The standby is cut off its primary while the
workers write, so that grants and receipts the primary acknowledges never reach it;
then the primary is stopped hard with writes in flight, the standby promoted, and the
proxy restarted against it as an operator would. Every worker then takes a new lease
and sends every key it ever sent again.

The invariants, from the upstream's own records: no epoch written by two holders; no
key applied twice; every write acknowledged before the failover either known to the
new store or recovered (told, by the probe, that a request with its key was applied,
`key_applied_request_unknown`, never that this request was: the store lost its
payload; or refused with `recovery_window`), never forwarded again. Each run shows
that the standby did lose acknowledged history, or the test proves nothing.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from tests.integration.replicas.conftest import Answer, Api, Fleet, Proxy, api_for, call
from tests.pgstandby import StandbyPair

pytestmark = pytest.mark.timeout(120)

ORDERS, RULES = "o", "u"
HOLDERS = {"h0": ORDERS, "h1": ORDERS, "h2": RULES, "h3": RULES}
WRITES_PER_LEASE = 3
TTL_S = 60.0
SETTLE_S = 1.0
TIMEOUT_S = 1.0
# How long the workers write before the standby is cut off, and after, before the crash.
REPLICATED_S = 0.5
LAGGING_S = 1.0
RETRY_ROUNDS = 40


@dataclass
class Sent:
    """What each worker sent, and what it was answered, key by key."""

    answers: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def acknowledged(self) -> set[str]:
        return {key for key, outcomes in self.answers.items() if "ok" in outcomes}


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    with StandbyPair() as started:
        yield started


async def write(api: Api, proxy: Proxy, holder: str, token: str, key: str) -> Answer:
    target = HOLDERS[holder]
    if target == ORDERS:
        return await api.place_order(proxy, target, token, key)
    return await api.put_rule(proxy, target, token, key, {"by": holder})


async def worker(api: Api, proxy: Proxy, holder: str, sent: Sent, stop: asyncio.Event) -> None:
    """Lease, three writes, release, over and over, until `stop` or the proxy dies."""
    written = 0
    while not stop.is_set():
        try:
            granted = await api.acquire(proxy, f"r:{HOLDERS[holder]}", holder, TTL_S)
            if granted.status != 201:
                # The other holder has it: ask again when its turn is likely over.
                await asyncio.sleep(0.02)
                continue
            token = granted.body["token"]
            for _ in range(WRITES_PER_LEASE):
                key = f"{holder}.{written}"
                written += 1
                sent.answers[key].append("sent")
                answer = await write(api, proxy, holder, token, key)
                sent.answers[key].append(answer.outcome)
            await api.release(proxy, token)
        except (aiohttp.ClientError, TimeoutError):
            return  # the proxy was stopped under it: what it sent stays as answered


async def send_again(api: Api, proxy: Proxy, holder: str, keys: list[str]) -> dict[str, Answer]:
    """Every key of `holder` again under a new lease, each until it gets an answer that
    is not "ask again" (a recovery_window refusal on the probed route)."""
    for _ in range(RETRY_ROUNDS):
        granted = await api.acquire(proxy, f"r:{HOLDERS[holder]}", holder, TTL_S)
        if granted.code != "resource_blocked":
            break
        # An effect whose receipt the standby never saw: the probe settles it.
        await asyncio.sleep(SETTLE_S / 4)
    assert granted.status == 201, granted
    token = granted.body["token"]
    final: dict[str, Answer] = {}
    for key in keys:
        for _ in range(RETRY_ROUNDS):
            answer = await write(api, proxy, holder, token, key)
            if answer.code != "recovery_window" or HOLDERS[holder] == RULES:
                break
            await asyncio.sleep(min(float(answer.headers["retry-after"]), SETTLE_S) / 4)
        final[key] = answer
    released = await api.release(proxy, token)
    assert released.status == 200, released
    return final


async def resolve_in_doubt(api: Api, proxy: Proxy, resource: str) -> None:
    """As an operator on a route without a probe: every effect in doubt on `resource`
    (admitted on the old primary, its receipt lost) resolved by the upstream's records."""
    for _ in range(RETRY_ROUNDS):
        in_doubt = [
            effect
            for effect in await api.effects(proxy, resource=resource)
            if effect["state"] in ("DISPATCHING", "UNKNOWN")
        ]
        if not in_doubt:
            return
        applied = {effect["idempotency_key"] for effect in await api.upstream_effects()}
        for effect in in_doubt:
            if effect["state"] == "UNKNOWN":
                outcome = "committed" if effect["idempotency_key"] in applied else "not_committed"
                resolved = await api.resolve(proxy, effect["id"], outcome, "failover test")
                assert resolved.status == 200, resolved
        # DISPATCHING ones turn UNKNOWN once past their deadline (the sweep).
        await asyncio.sleep(0.25)
    raise AssertionError(f"effects on {resource} still in doubt")


async def test_failover_to_a_lagging_async_standby_keeps_every_promise(
    pair: StandbyPair, fleet: Fleet
) -> None:
    fleet.start_upstream()
    before = fleet.start_replicas(
        pair.primary_url, [None, None], timeout_s=TIMEOUT_S, settle_s=SETTLE_S
    )
    sent = Sent()
    async with api_for(fleet) as api:
        # Said before anything goes wrong: the standby is asynchronous.
        replication = (await api_call_readyz(api, before[0]))["replication"]
        assert replication["standbys"] == 1 and "asynchronously" in replication["warning"]
        assert "replicate the store asynchronously" in before[0].process.log_tail(60)
        stop = asyncio.Event()
        workers = [
            asyncio.create_task(worker(api, before[number % 2], holder, sent, stop))
            for number, holder in enumerate(HOLDERS)
        ]
        # Bounded waits on the workload itself, not on the clock alone.
        await asyncio.wait(workers, timeout=REPLICATED_S)
        await asyncio.to_thread(pair.wait_caught_up)
        await asyncio.to_thread(pair.detach_standby)
        acknowledged_replicated = set(sent.acknowledged())
        await asyncio.wait(workers, timeout=LAGGING_S)
        # Writes in flight: the primary dies under them, then the proxy is stopped.
        await asyncio.to_thread(pair.crash_primary)
        for replica in before:
            replica.process.terminate()
        stop.set()
        await asyncio.gather(*workers)
        acknowledged = sent.acknowledged()
        assert acknowledged - acknowledged_replicated, "nothing acknowledged while lagging"

        await asyncio.to_thread(pair.promote)
        # Both replicas restarted on the new primary: one recovers, both see the window.
        afters = fleet.start_replicas(
            pair.standby_url, [None, None], timeout_s=TIMEOUT_S, settle_s=SETTLE_S
        )
        after = afters[0]
        windows = [(await api_call_readyz(api, replica))["recovery_window"] for replica in afters]
        assert "timeline" in windows[0]["reason"] and windows[0] == windows[1], windows
        recovered = [r for r in afters if "the store lost history" in r.process.log_tail(60)]
        assert len(recovered) == 1, "recovered once, by one replica"
        known_after = {effect["idempotency_key"] for effect in await api.effects(after)}
        lost = acknowledged - known_after
        assert lost, "the standby lost no acknowledged write: the run proves nothing"

        await resolve_in_doubt(api, after, f"r:{RULES}")
        answers: dict[str, Answer] = {}
        for number, holder in enumerate(HOLDERS):
            keys = sorted(key for key in sent.answers if key.startswith(f"{holder}."))
            answers.update(await send_again(api, afters[number % 2], holder, keys))
        upstream = await api.upstream_effects()

        # The operator closes the window (the admin API; the CLI asks for --yes, and
        # finds it closed); the replica that answered says so at once.
        refused = fleet.cli(after.config_path, "store", "close-recovery")
        assert refused.returncode != 0 and "--yes" in refused.stderr, refused
        closing = await call(
            api.session,
            "POST",
            f"{after.url}/_fence/v1/admin/close-recovery",
            json_body={},
            headers={"Authorization": f"Bearer {fleet.admin_token}"},
        )
        assert closing.status == 200 and closing.body == {"closed": True}, closing
        assert "recovery_window" not in await api_call_readyz(api, after)
        again = fleet.cli(after.config_path, "store", "close-recovery", "--yes")
        assert again.returncode == 0 and "none was open" in again.stdout, again

    # No key applied twice at the upstream.
    applied: dict[str, int] = defaultdict(int)
    for effect in upstream:
        applied[effect["idempotency_key"]] += 1
    assert {key: n for key, n in applied.items() if n > 1} == {}
    # No epoch written by two holders (a key names its holder).
    holders_of: dict[tuple[str, str], set[str]] = defaultdict(set)
    for effect in upstream:
        holders_of[(effect["target"], effect["fence_epoch"])].add(
            effect["idempotency_key"].split(".")[0]
        )
    assert {k: v for k, v in holders_of.items() if len(v) > 1} == {}
    # No epoch going back at the upstream: a write it took after another on the same
    # target never carries a lower epoch (the stale write, A@1 after B@2).
    last_epoch: dict[str, int] = {}
    for effect in upstream:
        epoch = int(effect["fence_epoch"])
        assert epoch >= last_epoch.get(effect["target"], 0), (effect, last_epoch)
        last_epoch[effect["target"]] = epoch
    # Every acknowledged write is known, or recovered: told applied or refused.
    for key in acknowledged:
        assert applied[key] == 1, key
        answer = answers[key]
        if key in lost and HOLDERS[key.split(".")[0]] == RULES:
            assert answer.code == "recovery_window", (key, answer)
        elif key in lost:
            assert answer.code == "key_applied_request_unknown", (key, answer)
        else:
            assert (
                answer.status in (200, 201) and answer.headers.get("idempotent-replayed") == "true"
            ), (key, answer)


async def api_call_readyz(api: Api, proxy: Proxy) -> dict[str, Any]:
    async with api.session.get(f"{proxy.url}/_fence/readyz") as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body
