"""Policy reload without a restart, on real `serve` processes and the demo upstream
(its own records are the evidence): SIGHUP and `fenceproxy reload` under load, an
invalid file, a change that needs a restart, a route taken away from an effect in
doubt, and two replicas that serve different files."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import yaml

from demo.upstream import DELAY_HEADER
from support.processes import free_port
from tests.integration.replicas.conftest import (
    ADMIN_TOKEN_ENV,
    Answer,
    Api,
    Fleet,
    Proxy,
    api_for,
    call,
    eventually,
    proxy_config,
)

WAIT_S = 15.0
HEALTH_ROUTE = {
    "name": "upstream-health",
    "upstream": "demo",
    "match": {"methods": ["GET"], "path": "/_demo/healthz"},
    "fence": "none",
}


def policy(fleet: Fleet, port: int, store_url: str, *, timeout_s: float, extra: bool) -> str:
    config: dict[str, Any] = proxy_config(port, fleet.upstream_url, store_url, timeout_s=timeout_s)
    if extra:
        config["routes"].append(HEALTH_ROUTE)
    return yaml.safe_dump(config, sort_keys=False)


def digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def start(fleet: Fleet, name: str = "r0", *, timeout_s: float = 1.0) -> Proxy:
    fleet.start_upstream()
    path, port = fleet.write_config(name, f"sqlite:///{fleet.tmp_path / 'fence.db'}")
    path.write_text(policy(fleet, port, store_url(fleet), timeout_s=timeout_s, extra=False))
    proxy = fleet.spawn_proxy(name, path, port)
    fleet.wait_ready(proxy)
    return proxy


def store_url(fleet: Fleet) -> str:
    return f"sqlite:///{fleet.tmp_path / 'fence.db'}"


def admin(fleet: Fleet) -> dict[str, str]:
    return {"Authorization": f"Bearer {fleet.admin_token}"}


async def reload_via_api(api: Api, proxy: Proxy) -> Answer:
    return await call(
        api.session,
        "POST",
        f"{proxy.url}/_fence/v1/admin/reload",
        json_body={},
        headers=admin(api.fleet),
    )


async def readyz(api: Api, proxy: Proxy) -> dict[str, Any]:
    answer = await call(api.session, "GET", f"{proxy.url}/_fence/readyz")
    assert answer.status == 200, answer
    body: dict[str, Any] = answer.body
    return body


async def serving(api: Api, proxy: Proxy, digest: str) -> None:
    async def served() -> bool:
        return bool((await readyz(api, proxy))["policy"]["digest"] == digest)

    await eventually(f"{proxy.name} to serve {digest[:12]}", served, WAIT_S)


async def token_for(api: Api, proxy: Proxy, resource: str) -> str:
    granted = await api.acquire(proxy, resource, f"worker-{resource}", 30)
    assert granted.status == 201, granted
    token: str = granted.body["token"]
    return token


async def test_reload_under_load_fails_no_request(fleet: Fleet) -> None:
    proxy = start(fleet)
    path = proxy.config_path
    versions = [
        policy(fleet, proxy.port, store_url(fleet), timeout_s=1.0, extra=False),
        policy(fleet, proxy.port, store_url(fleet), timeout_s=2.0, extra=True),
    ]
    stop = asyncio.Event()
    answers: dict[str, Answer] = {}

    async def worker(api: Api, number: int) -> None:
        token = await token_for(api, proxy, f"r:load-{number}")
        while not stop.is_set():
            key = uuid.uuid4().hex
            answers[key] = await api.put_rule(proxy, f"load-{number}", token, key, {"n": 1})

    async with api_for(fleet) as api:
        workers = [asyncio.create_task(worker(api, n)) for n in range(4)]
        try:
            for round_ in range(6):
                path.write_text(versions[(round_ + 1) % 2])
                if round_ % 2:
                    os.kill(proxy.process.pid, signal.SIGHUP)
                else:
                    done = await asyncio.to_thread(
                        fleet.cli, path, "reload", env={ADMIN_TOKEN_ENV: fleet.admin_token}
                    )
                    assert done.returncode == 0, done.stderr
                    assert "reloaded, sha256 " + digest_of(path) in done.stdout
                await serving(api, proxy, digest_of(path))
                # The added route exists exactly while the policy that adds it is served.
                health = await call(api.session, "GET", f"{proxy.url}/_demo/healthz")
                assert health.status == (200 if (round_ + 1) % 2 else 404), health
        finally:
            stop.set()
            await asyncio.gather(*workers)
        assert len(answers) > 20
        failed = [a for a in answers.values() if not 200 <= a.status < 300]
        assert not failed
        # The upstream's own records: every answered write, once.
        written = [e["idempotency_key"] for e in await api.upstream_effects()]
        assert sorted(written) == sorted(answers)


# The write in flight across the reload: the reload (a file read, a policy built and
# recorded) must land while it waits, with seconds to spare on a loaded machine, and it
# must end well within the timeout it started with.
HELD_ACROSS_RELOAD_MS = 3000
STARTED_WITH_TIMEOUT_S = 6.0


async def test_a_request_in_flight_keeps_the_timeout_it_started_with(fleet: Fleet) -> None:
    """Started under a 6 s upstream timeout, a 3 s write succeeds though a reload to
    0.5 s lands while it waits; the same write started after the reload times out."""
    proxy = start(fleet, timeout_s=STARTED_WITH_TIMEOUT_S)
    async with api_for(fleet) as api:
        token = await token_for(api, proxy, "r:slow-1")
        slow = asyncio.create_task(
            call(
                api.session,
                "PUT",
                f"{proxy.url}/rules/slow-1",
                json_body={"n": 1},
                headers={
                    "Fence-Token": token,
                    "Idempotency-Key": "k1",
                    DELAY_HEADER: str(HELD_ACROSS_RELOAD_MS),
                },
            )
        )

        async def sent() -> bool:
            return any(e["state"] == "DISPATCHING" for e in await api.effects(proxy))

        await eventually("the slow write to be forwarded", sent, WAIT_S)
        proxy.config_path.write_text(
            policy(fleet, proxy.port, store_url(fleet), timeout_s=0.5, extra=False)
        )
        reloaded = await reload_via_api(api, proxy)
        assert reloaded.status == 200, reloaded
        assert not slow.done()
        assert 200 <= (await slow).status < 300
        token = await token_for(api, proxy, "r:slow-2")
        late = await call(
            api.session,
            "PUT",
            f"{proxy.url}/rules/slow-2",
            json_body={"n": 1},
            headers={
                "Fence-Token": token,
                "Idempotency-Key": "k2",
                DELAY_HEADER: str(HELD_ACROSS_RELOAD_MS),
            },
        )
        assert late.code == "outcome_unknown", late


async def test_an_invalid_file_changes_nothing_and_says_why(fleet: Fleet) -> None:
    proxy = start(fleet)
    served = digest_of(proxy.config_path)
    good = proxy.config_path.read_text()
    proxy.config_path.write_text(good.replace("timeout_s: 1.0", "timeout_s: -1", 1))
    async with api_for(fleet) as api:
        refused = await reload_via_api(api, proxy)
        assert refused.status == 409 and refused.code == "reload_refused", refused
        assert f"{proxy.config_path}:" in refused.body["detail"]
        assert "upstreams.demo.timeout_s" in refused.body["detail"]
        done = fleet.cli(proxy.config_path, "reload", env={ADMIN_TOKEN_ENV: fleet.admin_token})
        assert done.returncode == 1
        # The CLI reads the file first (for the replica's address and the token's
        # variable), with check-config's checks: refused there, in the same words.
        assert "invalid configuration" in done.stderr
        assert "upstreams.demo.timeout_s" in done.stderr
        os.kill(proxy.process.pid, signal.SIGHUP)

        async def logged() -> bool:
            return "policy reload refused" in proxy.process.log_tail(20).replace("\n", " ")

        await eventually("the SIGHUP's refusal in the log", logged, WAIT_S)
        assert (await readyz(api, proxy))["policy"]["digest"] == served
        token = await token_for(api, proxy, "r:after")
        assert 200 <= (await api.put_rule(proxy, "after", token, "k", {"n": 1})).status < 300


async def test_a_key_that_needs_a_restart_is_refused(fleet: Fleet) -> None:
    proxy = start(fleet)
    text = proxy.config_path.read_text()
    other = f"sqlite:///{fleet.tmp_path / 'other.db'}"
    proxy.config_path.write_text(text.replace(store_url(fleet), other))
    async with api_for(fleet) as api:
        # Only an admin may make a replica read its file again.
        anonymous = await call(
            api.session, "POST", f"{proxy.url}/_fence/v1/admin/reload", json_body={}
        )
        assert anonymous.status == 401, anonymous
        refused = await reload_via_api(api, proxy)
        assert refused.code == "reload_refused", refused
        assert "store cannot change without a restart" in refused.body["detail"]


async def test_removing_a_route_with_an_unknown_effect_is_refused_naming_it(
    fleet: Fleet,
) -> None:
    proxy = start(fleet, timeout_s=0.3)
    async with api_for(fleet) as api:
        token = await token_for(api, proxy, "r:doubt")
        cut = await call(
            api.session,
            "PUT",
            f"{proxy.url}/rules/doubt",
            json_body={"n": 1},
            headers={"Fence-Token": token, "Idempotency-Key": "k", DELAY_HEADER: "800"},
        )
        effect_id = cut.headers["fence-effect-id"]
        (effect,) = await api.effects(proxy, resource="r:doubt")
        assert effect["state"] == "UNKNOWN", effect
        config = yaml.safe_load(proxy.config_path.read_text())
        config["routes"] = [r for r in config["routes"] if r["name"] != "put-rule"]
        proxy.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        refused = await reload_via_api(api, proxy)
        assert refused.code == "reload_refused", refused
        assert (
            f"{effect_id} (UNKNOWN, resource r:doubt) on route put-rule (removed)"
            in (refused.body["detail"])
        )
        # Once an operator settled it, the same file is taken.
        resolved = await api.resolve(proxy, effect_id, "not_committed", "test: never sent")
        assert resolved.status == 200, resolved
        assert (await reload_via_api(api, proxy)).status == 200


async def test_replicas_serving_different_files_see_each_other(fleet: Fleet) -> None:
    """Two replicas on one file (`serve --port`); one reloads a changed file, the other
    not yet: the other's readyz names it, and `fenceproxy status` warns."""
    first = start(fleet, "shared")
    path = first.config_path
    port = free_port()
    second = fleet.spawn_proxy("second", path, port, serve_args=("--port", str(port)))
    fleet.wait_ready(second)
    old = digest_of(path)
    async with api_for(fleet) as api:

        async def agree() -> bool:
            body = await readyz(api, first)
            status = await call(
                api.session, "GET", f"{first.url}/_fence/v1/status", headers=admin(fleet)
            )
            return (
                body["policy"] == {"digest": old, "disagreeing": []}
                and len(status.body["replicas"]) == 2
                and status.body["policy_digests"] == [old]
            )

        await eventually("both replicas to record the same policy", agree, WAIT_S)
        path.write_text(policy(fleet, first.port, store_url(fleet), timeout_s=2.0, extra=True))
        new = digest_of(path)
        assert (await reload_via_api(api, second)).status == 200

        async def seen() -> bool:
            body = await readyz(api, first)
            return bool(
                body["policy"]["disagreeing"]
                == [{"instance_id": second.instance_id, "digest": new}]
            )

        await eventually("the first replica to see the second's policy", seen, WAIT_S)
        status = await asyncio.to_thread(fleet.cli, path, "status")
        assert status.returncode == 0, status.stderr
        assert "warning: the replicas serve 2 different policy files" in status.stdout
        assert old[:12] in status.stdout and new[:12] in status.stdout
        metrics = await call(
            api.session, "GET", f"{first.url}/_fence/metrics", headers=admin(fleet)
        )
        assert f'fenceproxy_policy_info{{digest="{old}"}} 1.0' in metrics.body
        assert (await reload_via_api(api, first)).status == 200

        async def agree_again() -> bool:
            return bool((await readyz(api, first))["policy"] == {"digest": new, "disagreeing": []})

        await eventually("the replicas to agree again", agree_again, WAIT_S)


async def test_sighup_takes_a_rotated_client_key(fleet: Fleet) -> None:
    """A `serve` process told by SIGHUP that a client's key changed: the old key is
    refused from then on, the new one let in."""
    old_key, new_key = (
        "old-key-0123456789abcdef0123456789ab",
        "new-key-0123456789abcdef0123456789ab",
    )
    proxy = start(fleet)
    config = yaml.safe_load(proxy.config_path.read_text())

    def with_key(key: str) -> str:
        client = {
            "name": "workers",
            "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
            "resources": ["r:*"],
            "may": ["lease"],
        }
        return yaml.safe_dump({**config, "auth": {"clients": [client]}}, sort_keys=False)

    async def acquire_with(api: Api, key: str, resource: str) -> Answer:
        return await call(
            api.session,
            "POST",
            f"{proxy.url}/_fence/v1/leases",
            json_body={"resource": resource, "holder": "w", "ttl_s": 30},
            headers={"Authorization": f"Bearer {key}"},
        )

    async with api_for(fleet) as api:
        proxy.config_path.write_text(with_key(old_key))
        assert (await reload_via_api(api, proxy)).status == 200
        assert (await acquire_with(api, old_key, "r:a")).status == 201
        proxy.config_path.write_text(with_key(new_key))
        os.kill(proxy.process.pid, signal.SIGHUP)
        await serving(api, proxy, digest_of(proxy.config_path))
        refused = await acquire_with(api, old_key, "r:b")
        assert refused.status == 401 and refused.code == "unauthorized", refused
        assert (await acquire_with(api, new_key, "r:b")).status == 201
