"""Two fenceproxy replicas behind pgbouncer (started by the test), in both pool modes:
the seeded workload of test_replicas.py (short leases, writes through random
replicas, stale tokens of dead leases, lost answers settled by probes and an
operator), then every acknowledged write retried with its key through the other
replica. Checked from the workers' records and the upstream's own: the six
invariants of the pooler campaign (grants, writes under dead leases, epochs
at the upstream, no key applied twice, the upstream holds exactly what was
acknowledged, no answer but the expected ones: never store_unavailable or a 500).

Transaction mode runs with `store_pool.statement_cache: false` and fewer server
connections (4) than the replicas' pools together (2 x 4): pgbouncer multiplexes them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from support.processes import free_port
from tests.integration.replicas.conftest import (
    Api,
    Fleet,
    Proxy,
    api_for,
    authority_clock_offset,
    proxy_config,
)
from tests.integration.replicas.test_replicas import (
    ACQUIRE_OUTCOMES,
    RELEASE_OUTCOMES,
    RENEW_OUTCOMES,
    SEED,
    TARGETS,
    TOLERANCE_S,
    WRITE_OUTCOMES,
    Workload,
    Write,
    check_grants,
    check_upstream,
    check_writes,
)
from tests.pgbouncer import Bouncer, PoolMode

pytestmark = pytest.mark.timeout(90)

WORKLOAD_S = 8.0


def start_replicas(fleet: Fleet, store_url: str, statement_cache: bool) -> list[Proxy]:
    replicas = []
    for number in range(2):
        name = f"r{number}"
        port = free_port()
        config = proxy_config(port, fleet.upstream_url, store_url, timeout_s=0.3, settle_s=0.5)
        config["store_pool"] = {"min_size": 1, "max_size": 4, "statement_cache": statement_cache}
        path = fleet.tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        replicas.append(fleet.spawn_proxy(name, path, port))
    fleet.wait_ready(*replicas)
    return replicas


async def retry_acknowledged(api: Api, replicas: list[Proxy], workload: Workload) -> list[str]:
    """Each write acknowledged 2xx, sent again (same token, key and body) through the
    other replica: a replay or a refusal, never a second effect or a 5xx."""
    tokens = {(g.target, g.epoch): g.token for g in workload.grants}
    other = {replica.name: replicas[1 - n] for n, replica in enumerate(replicas)}
    problems = []

    async def retry(write: Write) -> None:
        token = tokens[(write.target, write.epoch)]
        content = {"holder": write.holder, "epoch": write.epoch, "key": write.key}
        via = other[write.replica]
        if write.kind == "rule":
            answer = await api.put_rule(via, write.target, token, write.key, content)
        else:
            body = {"qty": 1, **content}
            answer = await api.place_order(via, write.target, token, write.key, body)
        if answer.status >= 500:
            problems.append(f"retry of {write.key} answered {answer.status} {answer.outcome}")

    await asyncio.gather(*(retry(w) for w in workload.writes if w.outcome == "ok"))
    return problems


@pytest.mark.parametrize(
    ("mode", "statement_cache", "server_connections"),
    [("transaction", False, 4), ("session", True, 12)],
)
async def test_two_replicas_behind_pgbouncer_keep_every_invariant(
    pg_url: str,
    fleet: Fleet,
    tmp_path: Path,
    mode: PoolMode,
    statement_cache: bool,
    server_connections: int,
) -> None:
    fleet.start_upstream()
    with Bouncer(mode, pool_size=server_connections) as bouncer:
        replicas = start_replicas(fleet, bouncer.url(pg_url), statement_cache)
        clock_offset, uncertainty = await authority_clock_offset(pg_url)
        async with api_for(fleet) as api:
            workload = Workload(api, replicas, SEED, clock_offset)
            await workload.run(WORKLOAD_S)
            await workload.settle()
            retry_problems = await retry_acknowledged(api, replicas, workload)
            upstream = await api.upstream_effects()
            committed_unknown = set()
            for write in workload.writes:
                if write.outcome == "outcome_unknown":
                    assert write.effect_id is not None, write
                    receipt = await api.effect(replicas[1], write.effect_id)
                    if receipt["state"] == "COMMITTED":
                        committed_unknown.add(write.key)
        fleet.stop_proxies()

    summary = {kind: dict(counts) for kind, counts in workload.outcomes.items()}
    print(f"{mode}: grants={len(workload.grants)} writes={len(workload.writes)} {summary}")
    problems = list(retry_problems)
    for kind, allowed in (
        ("acquire", ACQUIRE_OUTCOMES),
        ("renew", RENEW_OUTCOMES),
        ("release", RELEASE_OUTCOMES),
        ("write", WRITE_OUTCOMES),
    ):
        if not set(workload.outcomes[kind]) <= allowed:
            problems.append(f"{kind} answered {dict(workload.outcomes[kind])}")
    problems += check_grants(workload.grants)
    write_problems, dead = check_writes(workload.grants, workload.writes, TOLERANCE_S + uncertainty)
    problems += write_problems
    problems += check_upstream(workload.grants, workload.writes, upstream, committed_unknown)
    assert not problems, "\n".join(problems[:40])
    # The run exercised what it claims to: takeovers, stale tokens refused, writes landed.
    assert {g.target for g in workload.grants} == set(TARGETS), summary
    assert len(dead) >= 5, summary
    assert workload.outcomes["write"]["ok"] >= 20, summary
