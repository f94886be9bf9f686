"""Demo upstream: a supplier order API and a routing-rule API that cannot fence.

Run it as its own process::

    python -m demo.upstream --host 127.0.0.1 --port 9001 --db state/demo-upstream.db

(add ``--tls-cert CERT.pem --tls-key KEY.pem`` to serve https, as the TLS tests do)
or in-process with `make_app(db_path)`. Every effect is committed to the
upstream's own SQLite file before the response is sent, so tests can count
what really happened from the upstream's records rather than the proxy's word.
It deliberately does not deduplicate and has no conditional updates: guarding
against stale or repeated writes is the proxy's job.

Endpoints

- ``POST /orders/{sku}`` with a JSON object (``qty``: int, default 1) creates a
  new order on every call: 201 ``{id, sku, qty, idempotency_key, fence_epoch}``.
  ``idempotency_key`` and ``fence_epoch`` are the raw ``Idempotency-Key`` and
  ``Fence-Epoch`` header strings, or null. A body that is not a JSON object: 400.
- ``GET /orders/{sku}``: 200 ``{orders: [...]}``, oldest first.
- ``GET /orders/by-key/{key}``: 200 with the first order whose Idempotency-Key
  is ``key``, else 404 (what the proxy's reconcile probe asks).
- ``PUT /rules/{rule_id}`` with a JSON object: last write wins, every write is
  kept in a history: 200 ``{rule_id, rule, version}``.
- ``GET /rules/{rule_id}``: 200 ``{rule_id, rule, version}`` or 404;
  ``GET /rules/{rule_id}/history``: 200 ``{history: [...]}``.
- ``POST /sink/{key}``: 201 ``{ok: true}`` without touching the database, so a
  benchmark measures the proxy rather than this process's fsync.

Introspection (fault knobs do not apply here)

- ``GET /_demo/effects``: ``{orders, rule_writes, effects: [{seq, kind, target,
  idempotency_key, fence_epoch, at}]}`` with kind ``order`` or ``rule``, target
  the sku or rule id, and ``at`` in Unix seconds.
- ``GET /_demo/headers-seen``: ``{fence_token_seen, last_headers}``. Every
  POST/PUT/PATCH/DELETE outside ``/sink/`` is counted when it arrives, whether
  or not it commits; ``fence_token_seen`` counts those that carried a
  ``Fence-Token`` (the proxy must strip it, so this must stay 0) and
  ``last_headers`` holds the lower-cased headers of the latest one.
- ``GET /_demo/healthz``: 200.

Fault knobs: request headers on any endpoint outside ``/_demo/``, probes
included (the proxy forwards them)

- ``Demo-Delay-Ms: N``: wait N ms before doing anything, so a slow write still
  commits even if the caller has given up.
- ``Demo-Status: NNN`` (200-599): answer that status with a small JSON body and
  commit nothing.
- ``Demo-Drop-Response: 1``: commit the write, then abort the TCP connection
  without a response, so the caller sees a disconnect for a write that happened.
- ``Demo-Status-After-Commit: NNN`` (200-599): commit the write, then answer that
  status anyway: an untrue error (or success) from an upstream that did the work.
- ``Demo-Answer-Delay-Ms: N``: after the work is done (committed or not), wait N ms
  before answering, so the answer is late for a write that already happened.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sqlite3
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.log import access_logger

DELAY_HEADER = "Demo-Delay-Ms"
STATUS_HEADER = "Demo-Status"
DROP_RESPONSE_HEADER = "Demo-Drop-Response"
STATUS_AFTER_COMMIT_HEADER = "Demo-Status-After-Commit"
ANSWER_DELAY_HEADER = "Demo-Answer-Delay-Ms"

INTROSPECTION_PREFIX = "/_demo/"
SINK_PREFIX = "/sink/"
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sku TEXT NOT NULL,
    qty INTEGER NOT NULL,
    idempotency_key TEXT,
    fence_epoch TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS orders_by_key ON orders (idempotency_key);
CREATE TABLE IF NOT EXISTS rule_writes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    rule_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    rule TEXT NOT NULL,
    idempotency_key TEXT,
    fence_epoch TEXT,
    written_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rule_writes_by_rule ON rule_writes (rule_id, version);
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    idempotency_key TEXT,
    fence_epoch TEXT,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS mutation_headers (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    carried_fence_token INTEGER NOT NULL,
    headers TEXT NOT NULL
);
"""

JsonObject = dict[str, Any]


class DemoStore:
    """The upstream's own records; every write method commits before returning."""

    def __init__(self, db_path: str) -> None:
        self._db = sqlite3.connect(db_path)
        self._db.row_factory = sqlite3.Row
        # WAL lets a test read the file while the server writes; FULL makes
        # each commit survive a SIGKILL or power loss, which tests rely on.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def record_mutation_headers(self, headers: dict[str, str]) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO mutation_headers (carried_fence_token, headers) VALUES (?, ?)",
                ("fence-token" in headers, json.dumps(headers)),
            )

    def create_order(
        self, sku: str, qty: int, idempotency_key: str | None, fence_epoch: str | None
    ) -> JsonObject:
        now = time.time()
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO orders (sku, qty, idempotency_key, fence_epoch, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (sku, qty, idempotency_key, fence_epoch, now),
            )
            self._record_effect("order", sku, idempotency_key, fence_epoch, now)
        return {
            "id": cursor.lastrowid,
            "sku": sku,
            "qty": qty,
            "idempotency_key": idempotency_key,
            "fence_epoch": fence_epoch,
        }

    def orders_for(self, sku: str) -> list[JsonObject]:
        rows = self._db.execute("SELECT * FROM orders WHERE sku = ? ORDER BY id", (sku,))
        return [_order_json(row) for row in rows]

    def order_by_key(self, idempotency_key: str) -> JsonObject | None:
        row = self._db.execute(
            "SELECT * FROM orders WHERE idempotency_key = ? ORDER BY id LIMIT 1",
            (idempotency_key,),
        ).fetchone()
        return None if row is None else _order_json(row)

    def put_rule(
        self, rule_id: str, rule: JsonObject, idempotency_key: str | None, fence_epoch: str | None
    ) -> int:
        """Store a new version of the rule and return its version number."""
        now = time.time()
        with self._db:
            (latest,) = self._db.execute(
                "SELECT COALESCE(MAX(version), 0) FROM rule_writes WHERE rule_id = ?", (rule_id,)
            ).fetchone()
            version: int = latest + 1
            self._db.execute(
                "INSERT INTO rule_writes"
                " (rule_id, version, rule, idempotency_key, fence_epoch, written_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (rule_id, version, json.dumps(rule), idempotency_key, fence_epoch, now),
            )
            self._record_effect("rule", rule_id, idempotency_key, fence_epoch, now)
        return version

    def current_rule(self, rule_id: str) -> JsonObject | None:
        row = self._db.execute(
            "SELECT rule_id, rule, version FROM rule_writes WHERE rule_id = ?"
            " ORDER BY version DESC LIMIT 1",
            (rule_id,),
        ).fetchone()
        if row is None:
            return None
        return {
            "rule_id": row["rule_id"],
            "rule": json.loads(row["rule"]),
            "version": row["version"],
        }

    def rule_history(self, rule_id: str) -> list[JsonObject]:
        rows = self._db.execute(
            "SELECT * FROM rule_writes WHERE rule_id = ? ORDER BY version", (rule_id,)
        )
        return [
            {
                "version": row["version"],
                "rule": json.loads(row["rule"]),
                "idempotency_key": row["idempotency_key"],
                "fence_epoch": row["fence_epoch"],
                "at": row["written_at"],
            }
            for row in rows
        ]

    def effects(self) -> JsonObject:
        rows = self._db.execute("SELECT * FROM effects ORDER BY seq").fetchall()
        effects = [dict(row) for row in rows]
        return {
            "orders": sum(1 for effect in effects if effect["kind"] == "order"),
            "rule_writes": sum(1 for effect in effects if effect["kind"] == "rule"),
            "effects": effects,
        }

    def headers_seen(self) -> JsonObject:
        (fence_token_seen,) = self._db.execute(
            "SELECT COUNT(*) FROM mutation_headers WHERE carried_fence_token"
        ).fetchone()
        last = self._db.execute(
            "SELECT headers FROM mutation_headers ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        return {
            "fence_token_seen": fence_token_seen,
            "last_headers": {} if last is None else json.loads(last["headers"]),
        }

    def _record_effect(
        self,
        kind: str,
        target: str,
        idempotency_key: str | None,
        fence_epoch: str | None,
        at: float,
    ) -> None:
        self._db.execute(
            "INSERT INTO effects (kind, target, idempotency_key, fence_epoch, at)"
            " VALUES (?, ?, ?, ?, ?)",
            (kind, target, idempotency_key, fence_epoch, at),
        )


def _order_json(row: sqlite3.Row) -> JsonObject:
    return {
        "id": row["id"],
        "sku": row["sku"],
        "qty": row["qty"],
        "idempotency_key": row["idempotency_key"],
        "fence_epoch": row["fence_epoch"],
    }


STORE = web.AppKey("store", DemoStore)


def _bad_request(detail: str) -> web.Response:
    return web.json_response({"error": "bad_request", "detail": detail}, status=400)


async def _json_object_body(request: web.Request) -> JsonObject | web.Response:
    """The request's JSON object body, or the 400 response to send instead."""
    try:
        body = await request.json()
    except ValueError:
        return _bad_request("body is not valid JSON")
    if not isinstance(body, dict):
        return _bad_request("body must be a JSON object")
    return body


async def create_order(request: web.Request) -> web.Response:
    body = await _json_object_body(request)
    if isinstance(body, web.Response):
        return body
    qty = body.get("qty", 1)
    # bool is an int subclass, but {"qty": true} is a client bug, not one unit.
    if not isinstance(qty, int) or isinstance(qty, bool):
        return _bad_request("qty must be an integer")
    order = request.app[STORE].create_order(
        request.match_info["sku"],
        qty,
        request.headers.get("Idempotency-Key"),
        request.headers.get("Fence-Epoch"),
    )
    return web.json_response(order, status=201)


async def list_orders(request: web.Request) -> web.Response:
    return web.json_response({"orders": request.app[STORE].orders_for(request.match_info["sku"])})


async def order_by_key(request: web.Request) -> web.Response:
    order = request.app[STORE].order_by_key(request.match_info["key"])
    if order is None:
        return web.json_response({"error": "not_found"}, status=404)
    return web.json_response(order)


async def put_rule(request: web.Request) -> web.Response:
    rule = await _json_object_body(request)
    if isinstance(rule, web.Response):
        return rule
    rule_id = request.match_info["rule_id"]
    version = request.app[STORE].put_rule(
        rule_id, rule, request.headers.get("Idempotency-Key"), request.headers.get("Fence-Epoch")
    )
    return web.json_response({"rule_id": rule_id, "rule": rule, "version": version})


async def get_rule(request: web.Request) -> web.Response:
    rule = request.app[STORE].current_rule(request.match_info["rule_id"])
    if rule is None:
        return web.json_response({"error": "not_found"}, status=404)
    return web.json_response(rule)


async def rule_history(request: web.Request) -> web.Response:
    history = request.app[STORE].rule_history(request.match_info["rule_id"])
    return web.json_response({"history": history})


async def sink(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"ok": True}, status=201)


async def effects(request: web.Request) -> web.Response:
    return web.json_response(request.app[STORE].effects())


async def headers_seen(request: web.Request) -> web.Response:
    return web.json_response(request.app[STORE].headers_seen())


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Requests still being worked on after their caller went away; kept so they
# are not garbage-collected midway and so shutdown can wait for them.
UNFINISHED = web.AppKey("unfinished", set[asyncio.Task[web.StreamResponse]])


@web.middleware
async def fault_knobs(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith(INTROSPECTION_PREFIX):
        return await handler(request)
    if request.method in MUTATING_METHODS and not request.path.startswith(SINK_PREFIX):
        request.app[STORE].record_mutation_headers(
            {name.lower(): value for name, value in request.headers.items()}
        )

    delay_ms = request.headers.get(DELAY_HEADER, "0")
    if not delay_ms.isdigit():
        return _bad_request(f"{DELAY_HEADER} must be a whole number of milliseconds")
    forced_status = request.headers.get(STATUS_HEADER)
    if forced_status is not None and not (
        forced_status.isdigit() and 200 <= int(forced_status) <= 599
    ):
        return _bad_request(f"{STATUS_HEADER} must be a status code from 200 to 599")
    forced_status_code = None if forced_status is None else int(forced_status)
    after_commit = request.headers.get(STATUS_AFTER_COMMIT_HEADER)
    if after_commit is not None and not (
        after_commit.isdigit() and 200 <= int(after_commit) <= 599
    ):
        return _bad_request(f"{STATUS_AFTER_COMMIT_HEADER} must be a status code from 200 to 599")
    answer_delay_ms = request.headers.get(ANSWER_DELAY_HEADER, "0")
    if not answer_delay_ms.isdigit():
        return _bad_request(f"{ANSWER_DELAY_HEADER} must be a whole number of milliseconds")

    # Shielded: a real API does not undo its work because the client hung up,
    # even where the server cancels handlers on disconnect (aiohttp's test
    # server does).
    work = asyncio.create_task(
        _respond_after_delay(
            request,
            handler,
            int(delay_ms) / 1000,
            forced_status_code,
            None if after_commit is None else int(after_commit),
            int(answer_delay_ms) / 1000,
        )
    )
    unfinished = request.app[UNFINISHED]
    unfinished.add(work)
    work.add_done_callback(unfinished.discard)
    response = await asyncio.shield(work)

    if request.headers.get(DROP_RESPONSE_HEADER) == "1" and request.transport is not None:
        request.transport.abort()
    return response


async def _respond_after_delay(
    request: web.Request,
    handler: Handler,
    delay_s: float,
    forced_status: int | None,
    status_after_commit: int | None,
    answer_delay_s: float,
) -> web.StreamResponse:
    # The body arrived with the request: read it before waiting, so a caller
    # that gives up during the delay cannot stop the write.
    await request.read()
    await asyncio.sleep(delay_s)
    if forced_status is not None:
        response: web.StreamResponse = web.json_response(
            {"error": "demo_status", "detail": f"forced by {STATUS_HEADER}; nothing was stored"},
            status=forced_status,
        )
    else:
        response = await handler(request)
        if status_after_commit is not None:
            response = web.json_response(
                {
                    "error": "demo_status_after_commit",
                    "detail": f"forced by {STATUS_AFTER_COMMIT_HEADER}; the write WAS stored",
                },
                status=status_after_commit,
            )
    await asyncio.sleep(answer_delay_s)
    return response


async def _store_context(app: web.Application, db_path: str) -> AsyncIterator[None]:
    app[STORE] = DemoStore(db_path)
    app[UNFINISHED] = set()
    yield
    await asyncio.gather(*app[UNFINISHED], return_exceptions=True)
    app[STORE].close()


def make_app(db_path: str) -> web.Application:
    app = web.Application(middlewares=[fault_knobs])
    app.cleanup_ctx.append(lambda app: _store_context(app, db_path))
    app.router.add_post("/orders/{sku}", create_order)
    app.router.add_get("/orders/by-key/{key}", order_by_key)
    app.router.add_get("/orders/{sku}", list_orders)
    app.router.add_put("/rules/{rule_id}", put_rule)
    app.router.add_get("/rules/{rule_id}", get_rule)
    app.router.add_get("/rules/{rule_id}/history", rule_history)
    app.router.add_post("/sink/{key}", sink)
    app.router.add_get("/_demo/effects", effects)
    app.router.add_get("/_demo/headers-seen", headers_seen)
    app.router.add_get("/_demo/healthz", healthz)
    return app


def demo_upstream_argv(
    port: int,
    db_path: str | Path,
    access_log: bool = True,
    tls: tuple[str | Path, str | Path] | None = None,
) -> list[str]:
    """The command that runs this demo upstream in its own process on 127.0.0.1;
    `tls` (certificate, key) serves https instead of http."""
    argv = [sys.executable, "-m", "demo.upstream", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--db", str(db_path)]
    if tls is not None:
        argv += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    return argv if access_log else [*argv, "--no-access-log"]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m demo.upstream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001)
    parser.add_argument("--db", required=True, help="SQLite file for the upstream's own records")
    parser.add_argument(
        "--no-access-log", action="store_true", help="for benchmarks: no line per request"
    )
    parser.add_argument("--tls-cert", help="serve https with this PEM certificate chain")
    parser.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    args = parser.parse_args()
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert is not None:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    web.run_app(
        make_app(args.db),
        host=args.host,
        port=args.port,
        access_log=None if args.no_access_log else access_logger,
        ssl_context=tls,
    )


if __name__ == "__main__":
    main()
