"""A stalled replica's late receipt, with real processes.

1. worker A's order with Idempotency-Key k goes through replica r0; the upstream
   applies it and holds its answer back a moment;
2. r0 stalls (SIGSTOP) with the answer on its way;
3. the authority's clock passes the effect's deadline (the test moves PostgreSQL's
   clock, which every replica reads, so r0's own HTTP timeout does not fire); r1's
   sweep marks the effect UNKNOWN and r1's probe finds the order: COMMITTED;
4. r0 resumes and receives the upstream's late, untrue 409 (sent after the commit).

Before core/lifecycle.py, r0's receipt freed key k and the worker's retry placed a
second order. Now the late 409 contradicts the settled state: the effect is
CONFLICTING, the worker is told so, the retry is refused, and the upstream's own
records hold one order.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from tests.integration.replicas.conftest import Fleet, api_for, eventually, resource_of


async def test_a_stalled_replicas_late_untrue_answer_never_frees_the_key(
    pg_url: str, fleet: Fleet
) -> None:
    fleet.start_upstream()
    r0, r1 = fleet.start_replicas(pg_url, [None, None], timeout_s=5.0)
    async with api_for(fleet) as api:
        lease = await api.acquire(r1, resource_of("late"), "worker-a", ttl_s=60)
        assert lease.status == 201, lease
        token = lease.body["token"]
        key = f"late-{uuid.uuid4().hex}"
        in_flight = asyncio.create_task(
            api.place_order(
                r0,
                "late",
                token,
                key,
                extra_headers={"Demo-Status-After-Commit": "409", "Demo-Answer-Delay-Ms": "1500"},
            )
        )

        async def committed_upstream() -> bool:
            return any(e["idempotency_key"] == key for e in await api.upstream_effects())

        await eventually("the upstream to apply the order", committed_upstream, 10.0)
        r0.process.pause()
        try:
            [effect] = await api.effects(r1, resource=resource_of("late"))
            assert effect["state"] == "DISPATCHING", effect
            # Past the effect's deadline and margin, by the authority's clock only.
            authority = await asyncpg.connect(pg_url)
            try:
                await authority.execute(
                    "UPDATE store_meta SET clock_offset_s = clock_offset_s + 10"
                )
            finally:
                await authority.close()

            async def settled_by_probe() -> bool:
                receipt = await api.effect(r1, effect["id"])
                return bool(receipt["state"] == "COMMITTED")

            await eventually("r1 to sweep and probe the effect", settled_by_probe, 15.0)
        finally:
            r0.process.resume()

        answer = await in_flight
        assert answer.status == 409, answer
        assert answer.code == "conflicting_evidence", answer
        receipt = await api.effect(r1, effect["id"])
        assert receipt["state"] == "CONFLICTING", receipt
        assert [e["conclusion"] for e in receipt["events"]][-1] == "conflict", receipt

        retry = await api.place_order(r1, "late", token, key)
        assert retry.code == "resource_blocked", retry
        orders = [e for e in await api.upstream_effects() if e["target"] == "late"]
        assert [o["idempotency_key"] for o in orders] == [key]

        # The operator, having checked the supplier, settles it; the retry then replays.
        resolved = await api.resolve(r1, effect["id"], "committed", "order found at supplier")
        assert resolved.status == 200, resolved
        replay = await api.place_order(r0, "late", token, key)
        assert replay.status == 200, replay
        assert replay.headers.get("idempotent-replayed") == "true", replay
        orders = [e for e in await api.upstream_effects() if e["target"] == "late"]
        assert len(orders) == 1, orders
