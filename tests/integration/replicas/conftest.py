"""Real processes for the multi-replica tests: one demo upstream, fenceproxy replicas.

`fleet` starts processes for one test and always stops them (SIGTERM, then
SIGKILL); a failing test's report gets the tail of every process's log.
`pg_url` is a fresh PostgreSQL database for the test (tests/pg.py: skipped
without FENCEPROXY_TEST_POSTGRES_URL, failing loudly when it is set but the
server cannot be reached). Request `pg_url` before `fleet`, so the processes
stop before their database is dropped.

Every replica gets its own port, config file and FENCEPROXY_INSTANCE_ID. The
fenced routes share one resource per id, `r:{id}`: `PUT /rules/{id}` and
`POST /orders/{id}` both write under the lease on `r:{id}`, and forward the
Fence-Epoch header, so the upstream's own records say under which epoch each
write landed. `POST /orders/{id}` has a reconcile probe; `PUT /rules/{id}` has none.

The async helpers speak HTTP with aiohttp (never through an HTTP proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml

from demo.upstream import demo_upstream_argv
from support.processes import ManagedProcess, free_port
from tests import pg

PROJECT_ROOT = Path(__file__).resolve().parents[3]
FENCEPROXY_CLI = Path(sys.executable).with_name("fenceproxy")
ADMIN_TOKEN_ENV = "FENCEPROXY_ADMIN_TOKEN"
INSTANCE_ID_ENV = "FENCEPROXY_INSTANCE_ID"
STARTUP_TIMEOUT_S = 30.0
CLI_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.05
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=15, connect=5)

pg_url = pg.database_fixture()


def resource_of(target: str) -> str:
    """The resource that guards the upstream's rule or order `target`."""
    return f"r:{target}"


def proxy_config(
    port: int,
    upstream_url: str,
    store_url: str,
    *,
    timeout_s: float = 0.3,
    settle_s: float | None = None,
    send_window_s: float | None = None,
) -> dict[str, Any]:
    """`settle_s` defaults to the upstream timeout, the shortest the policy allows;
    `send_window_s` to the policy's default."""
    config: dict[str, Any] = {
        "version": 1,
        "listen": {"host": "127.0.0.1", "port": port},
        "store": store_url,
        "admin_token_env": ADMIN_TOKEN_ENV,
        "leases": {"min_ttl_s": 0.5, "max_ttl_s": 300, "default_ttl_s": 2},
        "upstreams": {
            "demo": {
                "url": upstream_url,
                "timeout_s": timeout_s,
                "connect_timeout_s": min(0.25, timeout_s),
            }
        },
        "routes": [
            {
                "name": "place-order",
                "upstream": "demo",
                "match": {"methods": ["POST"], "path": "/orders/{sku}"},
                "resource": "r:{sku}",
                "fence": "required",
                "forward_fence_headers": True,
                "max_in_flight": 1,
                "idempotency": {"required": True, "retain_s": 3600},
                "reconcile": {
                    "probe": {"method": "GET", "path": "/orders/by-key/{idempotency_key}"},
                    "committed": ["200"],
                    "not_committed": ["404"],
                    "settle_s": max(timeout_s, 0.5) if settle_s is None else settle_s,
                    "attempts": 8,
                },
            },
            {
                "name": "put-rule",
                "upstream": "demo",
                "match": {"methods": ["PUT"], "path": "/rules/{rule_id}"},
                "resource": "r:{rule_id}",
                "fence": "required",
                "forward_fence_headers": True,
                "max_in_flight": 1,
                "idempotency": {"required": True, "retain_s": 3600},
            },
            {
                "name": "read-orders",
                "upstream": "demo",
                "match": {"methods": ["GET"], "path": "/orders/{rest:.*}"},
                "fence": "none",
            },
        ],
    }
    if send_window_s is not None:
        config["upstreams"]["demo"]["send_window_s"] = send_window_s
    if store_url.startswith("postgresql:"):
        config["store_pool"] = {"min_size": 1, "max_size": 4}
    return config


@dataclass
class Proxy:
    """One fenceproxy process (a replica)."""

    name: str
    port: int
    instance_id: str
    config_path: Path
    process: ManagedProcess
    skew_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Fleet:
    """The processes of one test; `close` stops every one still running."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.admin_token = secrets.token_urlsafe(24)
        self.upstream_url = ""
        self.upstream: ManagedProcess | None = None
        self.proxies: list[Proxy] = []
        self._stack = contextlib.ExitStack()

    def close(self) -> None:
        self._stack.close()

    def cleanup(self, function: Callable[..., object], *args: Any) -> None:
        """Call `function(*args)` at close, before stopping what was started earlier."""
        self._stack.callback(function, *args)

    def stop_proxies(self) -> None:
        """SIGTERM every proxy still running, and wait for each to exit."""
        for proxy in self.proxies:
            proxy.process.terminate()

    def _start(self, name: str, argv: list[str], env: Mapping[str, str] | None) -> ManagedProcess:
        return self._stack.enter_context(
            ManagedProcess(
                name,
                argv,
                log_path=self.tmp_path / f"{name}.log",
                env=env,
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )

    def start_upstream(self) -> str:
        """The demo upstream, counting its own effects in its own SQLite file."""
        port = free_port()
        self.upstream_url = f"http://127.0.0.1:{port}"
        self.upstream = self._start(
            "upstream",
            demo_upstream_argv(port, self.tmp_path / "upstream.db", access_log=False),
            None,
        )
        self.upstream.wait_http_ok(f"{self.upstream_url}/_demo/healthz", STARTUP_TIMEOUT_S)
        return self.upstream_url

    def write_config(
        self,
        name: str,
        store_url: str,
        *,
        port: int | None = None,
        timeout_s: float = 0.3,
        settle_s: float | None = None,
        send_window_s: float | None = None,
    ) -> tuple[Path, int]:
        port = port or free_port()
        path = self.tmp_path / f"{name}.yaml"
        config = proxy_config(
            port,
            self.upstream_url,
            store_url,
            timeout_s=timeout_s,
            settle_s=settle_s,
            send_window_s=send_window_s,
        )
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path, port

    def spawn_proxy(
        self,
        name: str,
        config_path: Path,
        port: int,
        *,
        skew_s: float | None = None,
        env: Mapping[str, str] | None = None,
        serve_args: tuple[str, ...] = (),
        command: Path | None = None,
    ) -> Proxy:
        """Start a replica (not waiting for it); `skew_s` shifts its process clock, `env`
        adds to its environment (e.g. FENCEPROXY_FAILPOINTS), `serve_args` to its
        command line (e.g. --port, for replicas sharing one file), `command` is another
        release's `fenceproxy` to run instead of this checkout's."""
        serve = ["serve", "--config", str(config_path), "--grace", "1", *serve_args]
        if command is not None:
            argv = [str(command), *serve]
        elif skew_s is None:
            argv = [sys.executable, "-m", "proxy.cli", *serve]
        else:
            module = "tests.integration.replicas.skewed_serve"
            argv = [sys.executable, "-m", module, str(skew_s), "--", *serve]
        instance_id = f"replica-{name}"
        env = {
            **_environ(),
            ADMIN_TOKEN_ENV: self.admin_token,
            INSTANCE_ID_ENV: instance_id,
            **(env or {}),
        }
        number = sum(p.name == name for p in self.proxies)
        log_name = name if number == 0 else f"{name}-{number + 1}"
        process = self._start(log_name, argv, env)
        proxy = Proxy(name, port, instance_id, config_path, process, skew_s)
        self.proxies.append(proxy)
        return proxy

    def wait_ready(self, *proxies: Proxy) -> None:
        for proxy in proxies:
            proxy.process.wait_http_ok(f"{proxy.url}/_fence/readyz", STARTUP_TIMEOUT_S)

    def start_proxy(
        self, name: str, store_url: str, *, timeout_s: float = 0.3, settle_s: float | None = None
    ) -> Proxy:
        config_path, port = self.write_config(
            name, store_url, timeout_s=timeout_s, settle_s=settle_s
        )
        proxy = self.spawn_proxy(name, config_path, port)
        self.wait_ready(proxy)
        return proxy

    def start_replicas(
        self,
        store_url: str,
        skews: list[float | None],
        *,
        timeout_s: float = 0.3,
        settle_s: float | None = None,
    ) -> list[Proxy]:
        """One replica per entry of `skews`, started together (they migrate the fresh
        database concurrently), each answering /_fence/readyz before this returns."""
        replicas = []
        for number, skew_s in enumerate(skews):
            config_path, port = self.write_config(
                f"r{number}", store_url, timeout_s=timeout_s, settle_s=settle_s
            )
            replicas.append(self.spawn_proxy(f"r{number}", config_path, port, skew_s=skew_s))
        self.wait_ready(*replicas)
        return replicas

    def cli(
        self, config_path: Path, *args: str, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The installed `fenceproxy` command with `--config`; never raises on exit."""
        return subprocess.run(
            [str(FENCEPROXY_CLI), *args, "--config", str(config_path)],
            cwd=self.tmp_path,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            check=False,
            env={**_environ(), **(env or {})},
        )

    def log_tails(self) -> list[tuple[str, str]]:
        sections = [(f"{p.process.name} log", p.process.log_tail(60)) for p in self.proxies]
        if self.upstream is not None:
            sections.append(("upstream log", self.upstream.log_tail(30)))
        return sections


def _environ() -> dict[str, str]:
    return dict(os.environ)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    processes = Fleet(tmp_path)
    try:
        yield processes
    finally:
        processes.close()


# -- HTTP ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A response: status, JSON body (or text, or None), headers with lower-case names."""

    status: int
    body: Any
    headers: dict[str, str]

    @property
    def code(self) -> str | None:
        """The problem+json `code` of a refusal, else None."""
        if isinstance(self.body, dict) and self.status >= 400:
            code = self.body.get("code")
            return code if isinstance(code, str) else None
        return None

    @property
    def outcome(self) -> str:
        """ "ok" for 2xx, else the problem code (or the bare status)."""
        if 200 <= self.status < 300:
            return "ok"
        return self.code or str(self.status)


def client_session() -> aiohttp.ClientSession:
    # A connection per request: a kept-alive one would outlive a proxy that a test
    # stops and starts again on the same port.
    connector = aiohttp.TCPConnector(limit=64, force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=HTTP_TIMEOUT)


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    json_body: Any = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    async with session.request(method, url, json=json_body, headers=headers) as response:
        raw = await response.read()
        received = {name.lower(): value for name, value in response.headers.items()}
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", errors="replace")
        return Answer(response.status, body, received)


class Api:
    """The control API, fenced writes and the upstream's own records, over one session."""

    def __init__(self, session: aiohttp.ClientSession, fleet: Fleet) -> None:
        self.session = session
        self.fleet = fleet

    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.fleet.admin_token}"}

    async def acquire(self, proxy: Proxy, resource: str, holder: str, ttl_s: float) -> Answer:
        body = {"resource": resource, "holder": holder, "ttl_s": ttl_s}
        return await call(self.session, "POST", f"{proxy.url}/_fence/v1/leases", json_body=body)

    async def renew(self, proxy: Proxy, token: str, ttl_s: float) -> Answer:
        return await call(
            self.session,
            "POST",
            f"{proxy.url}/_fence/v1/leases/renew",
            json_body={"ttl_s": ttl_s},
            headers={"Fence-Token": token},
        )

    async def release(self, proxy: Proxy, token: str) -> Answer:
        return await call(
            self.session,
            "POST",
            f"{proxy.url}/_fence/v1/leases/release",
            json_body={},
            headers={"Fence-Token": token},
        )

    async def lease(self, proxy: Proxy, resource: str) -> Answer:
        return await call(self.session, "GET", f"{proxy.url}/_fence/v1/leases?resource={resource}")

    async def put_rule(
        self, proxy: Proxy, rule_id: str, token: str, key: str, rule: Mapping[str, Any]
    ) -> Answer:
        headers = {"Fence-Token": token, "Idempotency-Key": key}
        return await call(
            self.session,
            "PUT",
            f"{proxy.url}/rules/{rule_id}",
            json_body=dict(rule),
            headers=headers,
        )

    async def place_order(
        self,
        proxy: Proxy,
        sku: str,
        token: str,
        key: str,
        body: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Answer:
        headers = {"Fence-Token": token, "Idempotency-Key": key, **(extra_headers or {})}
        return await call(
            self.session,
            "POST",
            f"{proxy.url}/orders/{sku}",
            json_body=dict(body or {"qty": 1}),
            headers=headers,
        )

    async def effects(
        self, proxy: Proxy, *, resource: str | None = None, state: str | None = None
    ) -> list[dict[str, Any]]:
        query = "limit=1000"
        if resource is not None:
            query += f"&resource={resource}"
        if state is not None:
            query += f"&state={state}"
        answer = await call(
            self.session, "GET", f"{proxy.url}/_fence/v1/effects?{query}", headers=self._admin()
        )
        assert answer.status == 200, answer
        effects: list[dict[str, Any]] = answer.body["effects"]
        return effects

    async def effect(self, proxy: Proxy, effect_id: str) -> dict[str, Any]:
        """The receipt with its "events"."""
        answer = await call(
            self.session, "GET", f"{proxy.url}/_fence/v1/effects/{effect_id}", headers=self._admin()
        )
        assert answer.status == 200, answer
        receipt: dict[str, Any] = answer.body
        return receipt

    async def resolve(self, proxy: Proxy, effect_id: str, outcome: str, reason: str) -> Answer:
        return await call(
            self.session,
            "POST",
            f"{proxy.url}/_fence/v1/effects/{effect_id}/resolve",
            json_body={"outcome": outcome, "reason": reason, "operator": "replica-test"},
            headers=self._admin(),
        )

    async def upstream_effects(self) -> list[dict[str, Any]]:
        """Every write the upstream committed, in its commit order, from its own records."""
        answer = await call(self.session, "GET", f"{self.fleet.upstream_url}/_demo/effects")
        assert answer.status == 200, answer
        effects: list[dict[str, Any]] = answer.body["effects"]
        return effects

    async def upstream_headers_seen(self) -> dict[str, Any]:
        answer = await call(self.session, "GET", f"{self.fleet.upstream_url}/_demo/headers-seen")
        assert answer.status == 200, answer
        seen: dict[str, Any] = answer.body
        return seen


@contextlib.asynccontextmanager
async def api_for(fleet: Fleet) -> AsyncIterator[Api]:
    async with client_session() as session:
        yield Api(session, fleet)


async def authority_clock_offset(store_url: str, samples: int = 5) -> tuple[float, float]:
    """(offset, uncertainty) in seconds: the store's clock (the database's `now()` plus
    store_meta.clock_offset_s, which every replica uses) minus this process's
    time.time(); taken from the sample with the shortest round trip."""
    conn = await asyncpg.connect(store_url)
    try:
        best: tuple[float, float] | None = None
        for _ in range(samples):
            before = time.time()
            authority = await conn.fetchval(
                "SELECT extract(epoch FROM clock_timestamp())::float8 + clock_offset_s"
                " FROM store_meta"
            )
            after = time.time()
            sample = (float(authority) - (before + after) / 2, (after - before) / 2)
            if best is None or sample[1] < best[1]:
                best = sample
    finally:
        await conn.close()
    assert best is not None
    return best


async def eventually(
    what: str,
    condition: Callable[[], Awaitable[bool]],
    timeout_s: float,
    interval_s: float = POLL_INTERVAL_S,
) -> None:
    """Poll `condition` until it holds; fail the test with `what` once time is up."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)
