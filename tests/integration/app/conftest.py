"""In-process harness: the proxy app on a real store in front of a real demo upstream.

Both servers run inside the test's event loop (aiohttp_server / aiohttp_client,
bound to 127.0.0.1). Nothing is mocked: the upstream counts its own effects in a
SQLite file under tmp_path, and the proxy's records are in the store under test.

Every test that uses the store (`make_fence`, `fence`, `store_url`, `clock`) runs
once per backend (the `backend` fixture): SQLite, a file under tmp_path, and
PostgreSQL, a schema of its own in one database per test run (see backends.py).
PostgreSQL runs need FENCEPROXY_TEST_POSTGRES_URL: unset, they are skipped with a
reason (`pytest -ra` lists it); set, they run, and a server that cannot be reached
fails them. A module that is about one backend only overrides `backend`.

Time, as the store sees it, is a `FakeClock` the test advances, so leases expire
without sleeping: on SQLite it is the clock the store reads; on PostgreSQL the
store reads the database's clock, and `advance` moves that (store_meta's
clock_offset_s) by the same amount. PostgreSQL's time also flows on its own, so
tests compare absolute times with `clock.approx`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any, Protocol
from urllib.parse import urlsplit

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict
from pytest_aiohttp import AiohttpClient, AiohttpServer

from demo.upstream import make_app as make_upstream_app
from policies import Policy, parse_policy
from proxy.app import build_app
from proxy.cli_serve import server_options
from proxy.runtime import RUNTIME
from store import Store
from tests import pg
from tests.integration.app import backends
from tests.integration.app.backends import BACKENDS, Backend
from tests.nemesis.pgrelay import PgRelay

ADMIN_TOKEN = "admin-secret-for-integration-tests-0123456789"
PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}
POLL_INTERVAL_S = 0.01
POLL_ATTEMPTS = 500
# How far apart two readings of PostgreSQL's clock taken "at the same moment" of a
# test may be (the database's time keeps flowing while the test runs).
PG_TIME_TOLERANCE_S = 0.5
# SQLite's clock only moves when the test moves it: times compare exactly (up to
# float rounding of sums of ~1.8e9-sized numbers).
SQLITE_TIME_TOLERANCE_S = 1e-6

Json = dict[str, Any]
ProxyClient = TestClient[Any, Any]
Headers = Mapping[str, str] | CIMultiDict[str]


class FakeClock:
    """The store's notion of now; only a test moves it.

    Without `authority_url` (SQLite) it is the clock the store reads, frozen
    between `advance` calls. With `authority_url` (a PostgreSQL store's URL) the
    store reads the database's clock instead: `advance` moves that too, and `now`
    is this process's estimate of it (real time plus the offset added so far).
    """

    def __init__(self, start: float | None = None, *, authority_url: str | None = None) -> None:
        self._now = time.time() if start is None else start
        self.authority_url = authority_url
        self.offset = 0.0

    @property
    def now(self) -> float:
        if self.authority_url is None:
            return self._now
        return time.time() + self.offset

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if self.authority_url is not None:
            backends.advance_authority(self.authority_url, seconds)
            self.offset += seconds
        else:
            self._now += seconds

    @property
    def tolerance(self) -> float:
        return SQLITE_TIME_TOLERANCE_S if self.authority_url is None else PG_TIME_TOLERANCE_S

    def approx(self, expected: float) -> Any:
        """`expected` as a time this store may have recorded: exact on SQLite, within
        PG_TIME_TOLERANCE_S on PostgreSQL."""
        return pytest.approx(expected, rel=0, abs=self.tolerance)


POLICY = Template(
    """\
version: 1
listen: {host: 127.0.0.1, port: 8080}
store: $store
admin_token_env: FENCEPROXY_TEST_ADMIN_TOKEN
leases: {min_ttl_s: 0.1, max_ttl_s: 60, default_ttl_s: 5}
$limits
$quotas
upstreams:
  supplier: {url: $url, timeout_s: $timeout_s, connect_timeout_s: 0.5, send_window_s: 0.5$pool}
routes:
  - name: place-order
    upstream: supplier
    match: {methods: [POST], path: "/orders/{sku}"}
    resource: "supplier:{sku}"
    fence: required
    forward_fence_headers: $forward_fence_headers
    max_body_bytes: 1024
    max_in_flight: $max_in_flight
    idempotency: {required: true, retain_s: 60}
$place_order_extra  - name: put-rule
    upstream: supplier
    match: {methods: [PUT], path: "/rules/{rule_id}"}
    resource: "rules:{rule_id}"
    fence: required
    idempotency: {required: false}
  - name: read-orders
    upstream: supplier
    match: {methods: [GET], path: "/orders/{rest:.*}"}
    fence: none
"""
)

# A reconcile block for place-order that asks the demo upstream whether an order with
# the effect's Idempotency-Key exists (200: committed, 404: not committed).
PROBE_BY_KEY = (
    '{probe: {method: GET, path: "/orders/by-key/{idempotency_key}"}, '
    'committed: ["200"], not_committed: ["404"], settle_s: 2, attempts: 5}'
)


def policy_yaml(
    store_url: str,
    upstream_url: str,
    *,
    timeout_s: float = 1,
    forward_fence_headers: bool = False,
    max_in_flight: int = 1,
    reconcile: str | None = None,
    upstream_idempotent: bool = False,
    limits: str | None = None,
    pool: str | None = None,
    quotas: str | None = None,
    top_level: str = "",
) -> str:
    """The test policy; `reconcile` (a YAML mapping) and `upstream_idempotent` go on
    the place-order route, `limits` and `quotas` (YAML mappings) are the top-level
    blocks and `pool` (a YAML mapping) the supplier upstream's; `top_level` is YAML
    appended at the end (more top-level blocks)."""
    extra = ""
    if reconcile is not None:
        extra += f"    reconcile: {reconcile}\n"
    if upstream_idempotent:
        extra += "    upstream_idempotent: true\n"
    return (
        POLICY.substitute(
            store=json.dumps(store_url),
            url=json.dumps(upstream_url),
            timeout_s=timeout_s,
            forward_fence_headers="true" if forward_fence_headers else "false",
            max_in_flight=max_in_flight,
            place_order_extra=extra,
            limits=f"limits: {limits}" if limits is not None else "",
            quotas=f"quotas: {quotas}" if quotas is not None else "",
            pool=f", pool: {pool}" if pool is not None else "",
        )
        + top_level
    )


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def json_body(response: ClientResponse) -> Json:
    body = await response.json(content_type=None)
    assert isinstance(body, dict), body
    return body


async def assert_problem(response: ClientResponse, status: int, code: str) -> Json:
    """A refusal: RFC 9457 problem+json with the contract's code and status."""
    text = await response.text()
    assert response.status == status, (response.status, text)
    assert response.content_type == "application/problem+json", (response.content_type, text)
    body = json.loads(text)
    assert isinstance(body, dict)
    assert body.keys() >= PROBLEM_KEYS, body
    assert body["code"] == code, body
    assert body["status"] == status, body
    assert isinstance(body["detail"], str) and body["detail"], body
    return body


async def poll_until(
    check: Callable[[], Awaitable[bool]], what: str, attempts: int = POLL_ATTEMPTS
) -> None:
    """Bounded polling: `check` must come true within `attempts` tries."""
    for _ in range(attempts):
        if await check():
            return
        await asyncio.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"timed out waiting for {what}")


def sqlite_rows(db_path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read a SQLite file directly (a separate connection, closed at once)."""
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        return [tuple(row) for row in conn.execute(sql, params).fetchall()]


@dataclass
class Fence:
    """One running proxy app, its demo upstream, and helpers to talk to both."""

    client: ProxyClient
    app: web.Application
    upstream: TestClient[Any, Any]
    clock: FakeClock
    # The store's URL: a SQLite file, or a PostgreSQL database and schema.
    store_url: str
    # The SQLite file (SQLite backend only; nothing is there on PostgreSQL).
    db_path: Path
    policy: Policy
    restart_app: Callable[[], Awaitable[Fence]] = field(repr=False)
    # The policy as a YAML file, for the CLI (which reads `--config`).
    config_path: Path | None = None

    @property
    def store(self) -> Store:
        return self.app[RUNTIME].store

    @property
    def backend(self) -> Backend:
        return backends.backend_of(self.store_url)

    async def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Read the proxy's records directly, as another process would (`?` placeholders;
        SQL valid on both backends)."""
        return await backends.rows(self.store_url, sql, params)

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def restart(self) -> Fence:
        """Close this app (its store too) and start a new one on the same files."""
        await self.client.close()
        return await self.restart_app()

    # -- lease API ------------------------------------------------------------

    async def acquire_response(
        self, resource: str, holder: str = "worker-a", ttl_s: float | None = 30
    ) -> ClientResponse:
        payload: Json = {"resource": resource, "holder": holder}
        if ttl_s is not None:
            payload["ttl_s"] = ttl_s
        return await self.client.post("/_fence/v1/leases", json=payload)

    async def acquire(
        self, resource: str, holder: str = "worker-a", ttl_s: float | None = 30
    ) -> Json:
        response = await self.acquire_response(resource, holder, ttl_s)
        body = await json_body(response)
        assert response.status == 201, body
        return body

    async def lease(self, resource: str) -> Json:
        response = await self.client.get("/_fence/v1/leases", params={"resource": resource})
        body = await json_body(response)
        assert response.status == 200, body
        return body

    # -- fenced writes ----------------------------------------------------------

    async def order(
        self,
        sku: str,
        token: str | None,
        key: str | None,
        body: Json | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ClientResponse:
        sent: dict[str, str] = {"Content-Type": "application/json"}
        if token is not None:
            sent["Fence-Token"] = token
        if key is not None:
            sent["Idempotency-Key"] = key
        sent.update(headers or {})
        payload = json.dumps({"qty": 1} if body is None else body).encode()
        return await self.client.post(f"/orders/{sku}", data=payload, headers=sent)

    # -- admin API ----------------------------------------------------------------

    async def effects(self, **query: str) -> list[Json]:
        response = await self.client.get("/_fence/v1/effects", params=query, headers=self.admin)
        body = await json_body(response)
        assert response.status == 200, body
        effects: list[Json] = body["effects"]
        return effects

    async def effect(self, effect_id: str) -> Json:
        response = await self.client.get(f"/_fence/v1/effects/{effect_id}", headers=self.admin)
        body = await json_body(response)
        assert response.status == 200, body
        return body

    async def rejections(self, **query: str) -> list[Json]:
        response = await self.client.get(
            "/_fence/v1/rejections", params={"limit": "1000", **query}, headers=self.admin
        )
        body = await json_body(response)
        assert response.status == 200, body
        rejections: list[Json] = body["rejections"]
        return rejections

    async def revoke(self, resource: str, reason: str = "test revoke") -> Json:
        response = await self.client.post(
            "/_fence/v1/admin/revoke",
            json={"resource": resource, "reason": reason},
            headers=self.admin,
        )
        body = await json_body(response)
        assert response.status == 200, body
        return body

    # -- the upstream's own records -------------------------------------------------

    async def demo_effects(self) -> Json:
        response = await self.upstream.get("/_demo/effects")
        assert response.status == 200
        return await json_body(response)

    async def upstream_orders(self) -> int:
        orders: int = (await self.demo_effects())["orders"]
        return orders

    async def headers_seen(self) -> Json:
        response = await self.upstream.get("/_demo/headers-seen")
        assert response.status == 200
        return await json_body(response)


class FenceFactory(Protocol):
    def __call__(
        self,
        *,
        upstream_url: str | None = None,
        timeout_s: float = 1,
        forward_fence_headers: bool = False,
        max_in_flight: int = 1,
        admin_token: str | None = ADMIN_TOKEN,
        reconcile: str | None = None,
        upstream_idempotent: bool = False,
        limits: str | None = None,
        pool: str | None = None,
        quotas: str | None = None,
        top_level: str = "",
        admin_token_next: str | None = None,
        reloadable: bool = False,
    ) -> Awaitable[Fence]: ...


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """The store backend under test; a module about one backend overrides this."""
    param: Backend = request.param
    return param


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """One PostgreSQL database for the whole run (each test gets a schema in it).

    Skipped (with the reason) when FENCEPROXY_TEST_POSTGRES_URL is unset; when it is
    set, an unreachable server raises `pg.PostgresUnavailable`: every PostgreSQL test
    errors, loudly, never skips.
    """
    admin = pg.require_admin_url()
    url = pg.create_database(admin)
    try:
        yield url
    finally:
        pg.drop_database(url, admin)


@pytest.fixture
def store_url(backend: Backend, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh, empty store for this test: a SQLite file or a PostgreSQL schema.

    The schema is left in place at the end of the test (an app of the test may still
    hold connections to it); the run's database, with every schema, is dropped when
    the run ends.
    """
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fence.db'}"
    database: str = request.getfixturevalue("pg_database")
    return backends.create_schema(database)


@pytest.fixture
def relay(store_url: str) -> Iterator[PgRelay]:
    """A relay between the test's store connections and PostgreSQL, to cut or hold the
    database's answers (a PostgreSQL test's: `store_url` is one)."""
    parts = urlsplit(store_url)
    with PgRelay(parts.hostname or "127.0.0.1", parts.port or 5432) as running:
        yield running


@pytest.fixture
def clock(store_url: str) -> FakeClock:
    if backends.backend_of(store_url) == "sqlite":
        return FakeClock()
    return FakeClock(authority_url=store_url)


@pytest.fixture
async def make_fence(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    tmp_path: Path,
    store_url: str,
    clock: FakeClock,
) -> FenceFactory:
    """Start the demo upstream (once per test) and a proxy app in front of it, on the
    test's store (every app the factory starts shares it)."""
    upstream_server: TestServer | None = None
    upstream_client: TestClient[Any, Any] | None = None

    async def start_upstream() -> tuple[TestServer, TestClient[Any, Any]]:
        nonlocal upstream_server, upstream_client
        if upstream_server is None or upstream_client is None:
            upstream_server = await aiohttp_server(
                make_upstream_app(str(tmp_path / "upstream.db")), host="127.0.0.1"
            )
            upstream_client = await aiohttp_client(upstream_server)
        return upstream_server, upstream_client

    async def factory(
        *,
        upstream_url: str | None = None,
        timeout_s: float = 1,
        forward_fence_headers: bool = False,
        max_in_flight: int = 1,
        admin_token: str | None = ADMIN_TOKEN,
        reconcile: str | None = None,
        upstream_idempotent: bool = False,
        limits: str | None = None,
        pool: str | None = None,
        quotas: str | None = None,
        top_level: str = "",
        admin_token_next: str | None = None,
        reloadable: bool = False,
    ) -> Fence:
        """`reloadable`: the app is told its policy file (`config_path`), so that the
        admin API's reload reads it again (and SIGHUP does, while the app runs)."""
        demo_server, upstream = await start_upstream()
        db_path = tmp_path / "fence.db"  # store_url's file, on SQLite
        url = upstream_url or f"http://127.0.0.1:{demo_server.port}"
        text = policy_yaml(
            store_url,
            url,
            timeout_s=timeout_s,
            forward_fence_headers=forward_fence_headers,
            max_in_flight=max_in_flight,
            reconcile=reconcile,
            upstream_idempotent=upstream_idempotent,
            limits=limits,
            pool=pool,
            quotas=quotas,
            top_level=top_level,
        )
        policy = parse_policy(text)
        config_path = tmp_path / "fenceproxy.yaml"
        config_path.write_text(text, encoding="utf-8")

        async def start() -> Fence:
            app = build_app(
                policy,
                admin_token=admin_token,
                clock=clock,
                admin_token_next=admin_token_next,
                policy_file=str(config_path) if reloadable else None,
            )
            # The options `fenceproxy serve` gives aiohttp's server: the parser limits (so
            # that oversized headers reach the proxy's own check rather than aiohttp's
            # plain 400) and the header timeout.
            server = await aiohttp_server(app, host="127.0.0.1", **server_options(policy))
            client: ProxyClient = await aiohttp_client(server)
            await _first_retention_round(app)
            return Fence(
                client,
                app,
                upstream,
                clock,
                store_url,
                db_path,
                policy,
                start,
                config_path=config_path,
            )

        return await start()

    return factory


async def _first_retention_round(app: web.Application) -> None:
    """Wait out the retention round the app runs as it starts. On PostgreSQL it updates
    store_meta's row, and the test clock's move (FakeClock.advance) waits for that
    row's lock while blocking this event loop: were the round's transaction still
    open, it could never commit, and the move would wait out its lock_timeout."""
    collector = app[RUNTIME].retention

    async def ran() -> bool:
        return collector is None or collector.rounds > 0

    await poll_until(ran, "the retention round at the app's start", attempts=6000)


@pytest.fixture
async def fence(make_fence: FenceFactory) -> Fence:
    return await make_fence()
