"""A rolling upgrade from the previous release to this checkout and back, under load.

The previous release (releases.toml) is built from its recorded commit
(tests/upgrades/releases.py). Two replicas of it serve one PostgreSQL store; workers
keep writing through them (a new Idempotency-Key per write, the same key again until
an answer says applied, a lease each, renewed before it runs out) to the demo upstream,
which records every effect in its own SQLite file. The test then follows the procedure
of docs/how-to/deployment.md ("Upgrades and rollback"): `fenceproxy status` lists every
replica on the running release; then replica by replica, out of rotation and drained,
stopped, the other release started in its place, ready, back in rotation (the new
release's migrations are applied by its first start while a replica of the previous
one goes on serving beside it); `fenceproxy status` lists every replica on the new one.
Then the same downwards (the rollback the CHANGELOG allows).

The upstream's own records are judged (tests/nemesis/judge.py: no key applied twice, no
stale epoch, no epoch written by two holders, no write answered applied that the
upstream lacks); every answer a worker got must be one the procedure documents (applied:
it says a worker sees no error from it); and no replica of either release logs a
warning or an error.

`make upgrade-test` runs it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import asyncpg
import pytest

from tests.integration.replicas.conftest import (
    Api,
    Fleet,
    Proxy,
    call,
    client_session,
    eventually,
)
from tests.nemesis.harness import Cluster, History, Worker, read_records
from tests.nemesis.judge import Told, judge
from tests.upgrades.releases import installed, previous_release, this_version

pytestmark = pytest.mark.timeout(600)

REPLICAS = 2
WORKERS = 3
TTL_S = 10.0
UPSTREAM_TIMEOUT_S = 2.0
# Longer than the upstream's timeout: a stopping replica finishes what it forwards.
SERVE_ARGS = ("--grace", str(UPSTREAM_TIMEOUT_S + 1))
# Writes each replica must answer applied in each mixed state before the next step.
WRITES_PER_STEP = 10
STEP_TIMEOUT_S = 60.0
SETTLE_S = 30.0
# What the procedure documents that a worker sees: nothing but applied (a replica is
# out of rotation before it stops, and what it is still forwarding finishes within
# `serve --grace`).
DOCUMENTED = frozenset({Told.APPLIED})
# What a replica's log must not say during the whole procedure.
TROUBLE = (" WARNING ", " ERROR ", " CRITICAL ", "Traceback")


async def drive(
    worker: Worker, cluster: Cluster, stop: asyncio.Event, turns: dict[str, int]
) -> None:
    """Write until `stop`: each key until applied, through the replicas in rotation;
    `turns` counts each worker's requests begun, by which a drain knows it is done."""
    turn = 0
    while not stop.is_set():
        turns[worker.name] = turn
        live = [i for i in range(len(cluster.replicas)) if i not in cluster.down]
        replica = live[turn % len(live)]
        turn += 1
        lease = worker.lease
        if lease is not None and lease.expires_at - time.monotonic() < TTL_S / 2:
            await worker.renew(replica)
        if not worker.pending:
            key = f"{worker.name}-{worker.written}"
            worker.written += 1
            worker.pending[key] = worker.targets[0]
        told = await worker.send(next(iter(worker.pending)), replica)
        if told is not Told.APPLIED:
            await asyncio.sleep(0.1)


async def applied_through(history: History, replica: str, since: int) -> int:
    return sum(
        1
        for attempt in history.attempts[since:]
        if attempt.replica == replica and attempt.told is Told.APPLIED
    )


async def serve_together(history: History, names: list[str], what: str) -> None:
    """Until each replica in `names` has answered WRITES_PER_STEP writes applied."""
    since = len(history.attempts)
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        counts = {name: await applied_through(history, name, since) for name in names}
        if all(count >= WRITES_PER_STEP for count in counts.values()):
            history.note(f"STEP {what}: applied through {counts}")
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: after {STEP_TIMEOUT_S:g} s, applied through {counts}")
        await asyncio.sleep(0.1)


async def versions(api: Api, replicas: list[Proxy]) -> list[str]:
    """The version each replica says it runs (its status)."""
    found = []
    admin = {"Authorization": f"Bearer {api.fleet.admin_token}"}
    for proxy in replicas:
        answer = await call(api.session, "GET", f"{proxy.url}/_fence/v1/status", headers=admin)
        assert answer.status == 200, answer
        found.append(answer.body["instance"]["version"])
    return found


async def status_shows(fleet: Fleet, cluster: Cluster, expected: list[str]) -> None:
    """Until `fenceproxy status` (steps 3 and 7) lists each replica at its expected
    version: a replica's row is written at its start and on each beat."""
    wanted = {
        proxy.instance_id: version
        for proxy, version in zip(cluster.replicas, expected, strict=True)
    }
    listed: dict[str, str] = {}

    async def listed_as_wanted() -> bool:
        nonlocal listed
        done = await asyncio.to_thread(
            fleet.cli, cluster.replicas[0].config_path, "status", "--json"
        )
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)["replicas"]
        listed = {row["instance_id"]: row["version"] for row in rows}
        return listed == wanted

    await eventually(f"fenceproxy status to list {wanted}", listed_as_wanted, STEP_TIMEOUT_S)


async def migrations(store_url: str) -> set[int]:
    conn = await asyncpg.connect(store_url)
    try:
        return {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}
    finally:
        await conn.close()


async def drain(turns: dict[str, int]) -> None:
    """Until every worker has begun a request since: none still goes to a replica that
    left the rotation before (the load balancer's drain)."""
    before = dict(turns)
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while any(turns[name] == turn for name, turn in before.items()):
        if time.monotonic() > deadline:
            pytest.fail(f"workers stuck in one request for {STEP_TIMEOUT_S:g} s: {turns}")
        await asyncio.sleep(0.02)


async def replace(
    fleet: Fleet,
    cluster: Cluster,
    history: History,
    turns: dict[str, int],
    index: int,
    command: Path | None,
) -> None:
    """Steps 4-6 of the procedure for one replica: out of rotation, stopped, the other
    release started in its place (same instance id, port and policy), ready, back."""
    old = cluster.replicas[index]
    cluster.down.add(index)
    await drain(turns)
    history.note(f"STEP r{index} out of rotation, stopping")
    await asyncio.to_thread(old.process.terminate)
    proxy = fleet.spawn_proxy(
        old.name, old.config_path, old.port, command=command, serve_args=SERVE_ARGS
    )
    await asyncio.to_thread(fleet.wait_ready, proxy)
    cluster.replicas[index] = proxy
    cluster.down.discard(index)
    history.note(f"STEP r{index} back in rotation on {command or 'this checkout'}")


async def test_rolling_upgrade_and_rollback_under_load(pg_url: str, fleet: Fleet) -> None:
    previous = previous_release()
    current = this_version()
    old_command = await asyncio.to_thread(installed, previous)
    fleet.start_upstream()
    replicas = []
    for number in range(REPLICAS):
        path, port = fleet.write_config(f"r{number}", pg_url, timeout_s=UPSTREAM_TIMEOUT_S)
        replicas.append(
            fleet.spawn_proxy(f"r{number}", path, port, command=old_command, serve_args=SERVE_ARGS)
        )
    await asyncio.to_thread(fleet.wait_ready, *replicas)
    before = await migrations(pg_url)
    cluster = Cluster(fleet, replicas, None)
    history = History()
    names = [f"r{number}" for number in range(REPLICAS)]
    async with client_session() as session:
        api = Api(session, fleet)
        assert await versions(api, cluster.replicas) == [previous.version] * REPLICAS
        await status_shows(fleet, cluster, [previous.version] * REPLICAS)
        workers = [
            Worker(f"w{n}", (), [f"u{n}"], TTL_S, cluster, session, history) for n in range(WORKERS)
        ]
        stop = asyncio.Event()
        turns: dict[str, int] = {}
        tasks = [asyncio.create_task(drive(worker, cluster, stop, turns)) for worker in workers]
        try:
            await serve_together(history, names, f"all on {previous.version}")
            # The upgrade, replica by replica.
            for index in range(REPLICAS):
                await replace(fleet, cluster, history, turns, index, None)
                if index == 0:
                    # The new release migrated the store at its first start; the previous
                    # release serves beside it on the migrated schema.
                    assert await migrations(pg_url) > before
                    assert await versions(api, cluster.replicas) == [current, previous.version]
                await serve_together(history, names, f"r{index} upgraded")
            assert await versions(api, cluster.replicas) == [current] * REPLICAS
            await status_shows(fleet, cluster, [current] * REPLICAS)
            # The rollback, replica by replica: the migrations stay (expansions).
            for index in range(REPLICAS):
                await replace(fleet, cluster, history, turns, index, old_command)
                await serve_together(history, names, f"r{index} rolled back")
            assert await versions(api, cluster.replicas) == [previous.version] * REPLICAS
            await status_shows(fleet, cluster, [previous.version] * REPLICAS)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        deadline = time.monotonic() + SETTLE_S
        await asyncio.gather(*(worker.settle(deadline) for worker in workers))
    unresolved = {key for worker in workers for key in worker.pending}
    await asyncio.to_thread(fleet.stop_proxies)
    applied, arrivals = read_records(fleet.tmp_path / "upstream.db")
    violations = judge(applied, arrivals, history.grants, history.attempts)
    answers = Counter(
        (attempt.told.value, attempt.status, attempt.code) for attempt in history.attempts
    )
    report = f"answers {dict(answers)}; upstream effects {len(applied)}\n{history.describe()}"
    print(report.splitlines()[0])
    assert violations == [], f"{violations}\n{report}"
    assert unresolved == set(), report
    undocumented = [a for a in history.attempts if a.told not in DOCUMENTED]
    assert undocumented == [], report
    assert len(applied) == sum(worker.written for worker in workers), report
    # Each release ran without a fault of its own beside the other, background work
    # included (a beat, a sweep, a refusal count that fails is logged, not answered).
    for proxy in fleet.proxies:
        troubles = [
            line
            for line in proxy.process.log_path.read_text(encoding="utf-8").splitlines()
            if any(level in line for level in TROUBLE)
        ]
        assert troubles == [], f"{proxy.process.name}: {troubles}"
