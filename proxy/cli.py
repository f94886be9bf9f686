"""`fenceproxy` command line: serve, check the policy, read and act on the store.

Every command but `serve` works on the store directly, so it works while the
proxy is down. Tables for people, `--json` for programs, one line on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import getpass
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from core.leasing_advice import Advice, recommendation
from core.records import EffectState
from policies import ConfigError, Policy, load_policy
from policies.tls import server_context
from proxy import connections, operations
from proxy.app import build_app, default_instance_id, new_instance_id
from proxy.auth import (
    KeyProblem,
    blank_admin_token_warnings,
    env_secret,
    exposure_warning,
    missing_keys,
)
from proxy.forwarding import new_client_session
from proxy.identity import STATE_DIR_ENV, IdentityCheck, default_state_dir, memory_file
from proxy.operations import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, OperationRefused
from proxy.presentation import lease_view_json
from proxy.runtime import RUNTIME
from proxy.terminal import printable
from reconcile.prober import ProbeResult
from store import Store, StoreError, check_server, open_store
from store.files import backup_sqlite, schema_versions

T = TypeVar("T")

# aiohttp refuses oversized headers with a plain-text 400 before any handler runs;
# its limits sit above the proxy's own so that clients get a problem+json instead.
# `serve` counts each head before aiohttp keeps it (proxy/connections.py), so a head
# never grows to these in aiohttp's parser.
PARSER_LIMITS = {"max_line_size": 65536, "max_field_size": 65536, "max_headers": 256}


def server_options(policy: Policy) -> dict[str, Any]:
    """What `serve` gives aiohttp's server (the in-process tests give it the same).

    `keepalive_timeout` is the header timeout: aiohttp arms it when a connection opens
    and again after each answer, and closes the connection if a request's headers
    have not all arrived by then (an idle keep-alive connection included). There is
    no request yet to answer, so the close is silent.
    """
    return {**PARSER_LIMITS, "keepalive_timeout": policy.limits.header_timeout_s}


class CommandError(Exception):
    """A one-line reason for a non-zero exit."""


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        sys.exit(2)
    try:
        sys.exit(args.run(args))
    except ConfigError as exc:
        print(f"fenceproxy: invalid configuration {exc.filename}:", file=sys.stderr)
        for line in str(exc).splitlines() or [f"{exc.filename}: cannot be read"]:
            print(f"  {line}", file=sys.stderr)
        sys.exit(1)
    except OperationRefused as refused:
        # The admin API's problem+json says the same: its detail and its code.
        print(f"fenceproxy: {printable(refused.detail)} ({refused.code})", file=sys.stderr)
        sys.exit(1)
    except (CommandError, StoreError) as exc:
        print(f"fenceproxy: {printable(str(exc))}", file=sys.stderr)
        sys.exit(1)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fenceproxy", description=__doc__)
    parser.add_argument(
        "--version", action="version", version=f"fenceproxy {operations.proxy_version()}"
    )
    commands = parser.add_subparsers(metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], int], help: str) -> Any:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument(
            "--config",
            default=os.environ.get("FENCEPROXY_CONFIG"),
            help="policy file (default: $FENCEPROXY_CONFIG)",
        )
        sub.set_defaults(run=run)
        return sub

    serve = command("serve", _serve, "run the proxy")
    serve.add_argument("--host", help="listen on this address instead of the file's listen.host")
    serve.add_argument(
        "--port", type=_port, help="listen on this port instead of the file's listen.port"
    )
    serve.add_argument(
        "--grace",
        type=_positive_seconds,
        default=10.0,
        help="seconds SIGTERM waits for in-flight requests before exiting (default 10)",
    )
    serve.add_argument(
        "--new-store",
        action="store_true",
        help="start on the store as it is, even if it is not the one this instance last "
        "used (an empty store then issues epochs from 1 again)",
    )
    serve.add_argument(
        "--state-dir",
        default=os.environ.get(STATE_DIR_ENV),
        help="where this instance remembers which store it last used (default: "
        f"${STATE_DIR_ENV}, else the SQLite database's directory, or for PostgreSQL "
        "the configuration file's)",
    )
    check = command("check-config", _check_config, "validate a policy file")
    check.add_argument("file", nargs="?", help="policy file (default: --config)")

    leases = commands.add_parser("leases", help="read or revoke leases")
    lease_commands = leases.add_subparsers(metavar="ACTION", required=True)
    show = lease_commands.add_parser("show", help="a resource's lease, epoch and effects in doubt")
    show.add_argument("resource", help="the resource's name, as a route renders it")
    revoke = lease_commands.add_parser("revoke", help="advance a resource's epoch now")
    revoke.add_argument("resource", help="the resource's name, as a route renders it")
    revoke.add_argument("--reason", required=True, help="why, kept with the revocation")
    for sub, run in ((show, _leases_show), (revoke, _leases_revoke)):
        _store_options(sub)
        sub.set_defaults(run=run)

    effects = commands.add_parser("effects", help="effect receipts")
    effect_commands = effects.add_subparsers(metavar="ACTION", required=True)
    listing = effect_commands.add_parser("list", help="recent effects, newest first")
    listing.add_argument("--resource", help="only this resource's effects")
    listing.add_argument("--state", help=f"one of {', '.join(EffectState)}")
    _limit_option(listing)
    one = effect_commands.add_parser("show", help="one effect")
    one.add_argument("effect_id", help="the Fence-Effect-Id of the answer")
    rejections = effect_commands.add_parser("rejections", help="refused requests, newest first")
    rejections.add_argument("--resource", help="only this resource's refusals")
    _limit_option(rejections)
    for sub, run in ((listing, _effects_list), (one, _effects_show), (rejections, _rejections)):
        _store_options(sub)
        sub.set_defaults(run=run)

    reconcile = commands.add_parser("reconcile", help="settle effects whose outcome is unknown")
    reconcile_commands = reconcile.add_subparsers(metavar="ACTION", required=True)
    in_doubt = reconcile_commands.add_parser(
        "list", help="blocked resources and effects in doubt, oldest first"
    )
    detail = reconcile_commands.add_parser("show", help="one effect and every decision about it")
    detail.add_argument("effect_id", help="the Fence-Effect-Id of the answer")
    probe = reconcile_commands.add_parser("probe", help="run the route's probe now")
    probe.add_argument("effect_id", help="the effect in doubt to probe")
    resolve = reconcile_commands.add_parser("resolve", help="record an operator's decision")
    resolve.add_argument("effect_id", help="the effect in doubt to settle")
    resolve.add_argument(
        "--outcome",
        required=True,
        help="committed or not_committed (as the API spells it; not-committed is taken too)",
    )
    resolve.add_argument("--reason", required=True, help="the evidence, kept with the decision")
    resolve.add_argument(
        "--operator", default=_default_operator(), help="who decides (default: your login name)"
    )
    for sub, run in (
        (in_doubt, _reconcile_list),
        (detail, _effects_show),
        (probe, _reconcile_probe),
        (resolve, _reconcile_resolve),
    ):
        _store_options(sub)
        sub.set_defaults(run=run)

    store = commands.add_parser("store", help="the store's schema and backups")
    store_commands = store.add_subparsers(metavar="ACTION", required=True)
    migrate = store_commands.add_parser("migrate", help="apply missing schema migrations")
    backup = store_commands.add_parser(
        "backup",
        help="copy a SQLite store to FILE, consistently, while proxies run (PostgreSQL: pg_dump)",
    )
    backup.add_argument("file", help="the copy to write (must not exist)")
    restore = store_commands.add_parser(
        "fence-restore",
        help="after restoring the store from a backup: advance every epoch past anything "
        "issued since the backup and end every lease",
    )
    restore.add_argument(
        "--advance",
        type=int,
        default=1_000_000,
        help="how far past the highest epoch in the backup (default 1000000); must exceed "
        "the acquisitions and revocations any one resource saw since the backup",
    )
    restore.add_argument("--yes", action="store_true", help="do it (every token dies)")
    close_recovery = store_commands.add_parser(
        "close-recovery",
        help="after a failover that lost history: close the recovery window, so that an "
        "idempotency key the store does not know is new again",
    )
    close_recovery.add_argument(
        "--yes",
        action="store_true",
        help="do it (a key applied before the failover and sent again is applied again)",
    )
    for sub, run in (
        (migrate, _store_migrate),
        (backup, _store_backup),
        (restore, _store_fence_restore),
        (close_recovery, _store_close_recovery),
    ):
        _store_options(sub)
        sub.set_defaults(run=run)

    advice = command(
        "lease-advice",
        _lease_advice,
        "lease TTLs from the measured turns of recorded leases (see README, Lease sizing)",
    )
    # Text, not type=float: the operation checks each, with the admin API's refusal.
    advice.add_argument("--resource", help="one group: the resources this glob matches")
    advice.add_argument("--since", help="only leases granted in the last SECONDS")
    advice.add_argument("--margin", help="suggested TTL = margin x longest turn (default 2)")
    advice.add_argument(
        "--poll-interval", help="seconds between a successor's acquire attempts (default 1)"
    )
    advice.add_argument("--targets", help="false-expiry rates to size for (default 0.5,0.1,0.05,0)")
    advice.add_argument("--leases", help="the curve's lease lengths (default: from the data)")
    advice.add_argument("--json", action="store_true", help="print JSON for programs")
    status = command(
        "status",
        _status,
        "the store, whether it answers, and every proxy replica seen in the last minutes",
    )
    status.add_argument("--json", action="store_true", help="print JSON for programs")
    return parser


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 1-65535: {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    # aiohttp reads a shutdown timeout of 0 as "wait forever"; a grace must be positive.
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return value


def _limit_option(sub: argparse.ArgumentParser) -> None:
    # Text, not type=int: the operation checks it, with the admin API's refusal.
    sub.add_argument(
        "--limit", help=f"rows to show, 1-{MAX_LIST_LIMIT} (default {DEFAULT_LIST_LIMIT})"
    )


def _store_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--config",
        default=os.environ.get("FENCEPROXY_CONFIG"),
        help="the policy file, for its store (default: $FENCEPROXY_CONFIG)",
    )
    sub.add_argument("--json", action="store_true", help="print JSON for programs")


def _policy(args: argparse.Namespace) -> Policy:
    if not args.config:
        raise CommandError("no policy file: pass --config FILE or set FENCEPROXY_CONFIG")
    if not os.path.exists(args.config):
        raise CommandError(f"{args.config}: no such file")
    return load_policy(args.config)


def _with_store(args: argparse.Namespace, work: Callable[[Store], Awaitable[T]]) -> T:
    policy = _policy(args)

    async def run() -> T:
        # Two connections, with the policy's cache and timeouts (a pooler's mode).
        pool = dataclasses.replace(policy.store_pool, min_size=1, max_size=2)
        store = open_store(policy.store, time.time, f"cli:{new_instance_id()}", pool)
        await store.open()
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def _serve(args: argparse.Namespace) -> int:
    policy = _policy(args)
    # Two replicas on one host differ only in their listener: one file serves both.
    listen = dataclasses.replace(
        policy.listen,
        host=args.host if args.host is not None else policy.listen.host,
        port=args.port if args.port is not None else policy.listen.port,
    )
    policy = dataclasses.replace(policy, listen=listen)
    admin_token = env_secret(os.environ, policy.admin_token_env) if policy.admin_token_env else None
    next_env = policy.admin_token_next_env
    admin_token_next = env_secret(os.environ, next_env) if next_env else None
    logging.basicConfig(
        level=os.environ.get("FENCEPROXY_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    state_dir = (
        Path(args.state_dir) if args.state_dir else default_state_dir(policy.store, args.config)
    )
    identity = IdentityCheck(memory_file(state_dir, default_instance_id(policy)), args.new_store)
    try:
        app = build_app(
            policy,
            admin_token=admin_token or None,
            identity=identity,
            admin_token_next=admin_token_next or None,
        )
    except KeyProblem as exc:
        raise CommandError(f"{args.config}: {exc}") from None
    app[RUNTIME].grace_s = args.grace
    _check_free(policy.listen.host, policy.listen.port, "--port N (or listen.port)")
    if policy.metrics_listen is not None:
        metrics = policy.metrics_listen
        _check_free(metrics.host, metrics.port, "metrics_listen.port")
    # Before the banner: a standby or a read-only database is refused, not started on.
    asyncio.run(check_server(policy.store, policy.store_pool))
    for warning in [exposure_warning(policy), *blank_admin_token_warnings(policy, os.environ)]:
        if warning is not None:
            print(f"fenceproxy: warning: {warning}", file=sys.stderr, flush=True)
    admin_tokens = sum(bool(token) for token in (admin_token, admin_token_next))
    clients = len(policy.auth.clients) if policy.auth is not None else 0
    tls = policy.listen.tls
    print(
        f"fenceproxy on {'https' if tls else 'http'}://{policy.listen.host}:{policy.listen.port} "
        f"(store {policy.store}, admin API {'on' if admin_tokens else 'off'}"
        f"{f' with {admin_tokens} tokens' if admin_tokens > 1 else ''}, "
        f"{f'{clients} clients' if policy.auth is not None else 'no auth'}"
        f"{_metrics_note(policy)}{_tls_summary(policy)})",
        flush=True,
    )
    try:
        asyncio.run(
            connections.serve(
                app,
                host=policy.listen.host,
                port=policy.listen.port,
                ssl_context=server_context(tls) if tls is not None else None,
                grace_s=args.grace,
                max_connections=policy.limits.max_connections,
                metrics=app[RUNTIME].metrics,
                server_options=server_options(policy),
            )
        )
    except OSError as exc:
        # Taken between the check above and the bind: still one line, not a traceback.
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise
        raise CommandError(
            f"{exc.strerror}; choose another with --port N (or listen.port)"
        ) from None
    return 0


def _check_free(host: str, port: int, how_to_change: str) -> None:
    """Refuse in one line, before anything starts, a listener that cannot bind.

    The probe binds as aiohttp will (SO_REUSEADDR, so a port left in TIME_WAIT by
    the previous run still counts as free) and lets go at once.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = addresses[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            why = "it is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise CommandError(
                f"cannot listen on {host}:{port}: {why}; choose another with {how_to_change}"
            ) from None


def _tls_summary(policy: Policy) -> str:
    tls = policy.listen.tls
    if tls is None:
        return ""
    return ", mutual TLS" if tls.client_ca is not None else ", TLS"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _check_config(args: argparse.Namespace) -> int:
    path = args.file or args.config
    if not path:
        raise CommandError("no policy file: pass FILE, --config FILE or set FENCEPROXY_CONFIG")
    if not os.path.exists(path):
        raise CommandError(f"{path}: no such file")
    policy = load_policy(path)
    fenced = sum(route.fenced for route in policy.routes)
    print(
        f"{path}: ok ({_count(len(policy.routes), 'route')}, {fenced} fenced, store {policy.store}"
        f"{_tls_summary(policy)}, max {policy.limits.max_connections} connections)"
    )
    for line in _refused_characters(policy):
        print(line)
    # Warnings, not errors: the file may be checked where the keys are not set.
    for warning in [exposure_warning(policy), *missing_keys(policy, os.environ)]:
        if warning is not None:
            print(f"fenceproxy: warning: {path}: {warning}", file=sys.stderr)
    return 0


def _refused_characters(policy: Policy) -> list[str]:
    """Per fenced route, what each path parameter may not hold (400 invalid_request):
    the separators of its resource template (policies/templates.py)."""
    lines = []
    for route in policy.routes:
        if not route.fenced or route.resource is None:
            continue
        refused = [
            f"{{{name}}} may not contain {', '.join(repr(char) for char in chars)}"
            for name, chars in route.resource.separators.items()
            if chars
        ]
        lines.append(
            f"  route {route.name}: resource {route.resource.raw!r}: "
            + ("; ".join(refused) or "no character refused")
        )
    return lines


def _metrics_note(policy: Policy) -> str:
    listen = policy.metrics_listen
    return f", metrics on http://{listen.host}:{listen.port}" if listen is not None else ""


def _print(args: argparse.Namespace, data: Any, rows: list[list[str]], header: list[str]) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    # Cells hold stored strings (paths, reasons, names sent by anyone): escaped.
    shown = [[printable(_cell(cell)) for cell in row] for row in [header, *rows]]
    widths = [max(len(cell) for cell in column) for column in zip(*shown, strict=True)]
    for row in shown:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def _cell(value: object) -> str:
    """A table cell: an absent value is "-", as in every other column, never "None"."""
    return "-" if value is None else str(value)


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _leases_show(args: argparse.Namespace) -> int:
    view = _with_store(args, lambda store: operations.lease_view(store, args.resource))
    data = lease_view_json(view)
    _print(
        args,
        data,
        [
            [_cell(data[key]) for key in ("epoch", "next_epoch", "holder", "client", "live")]
            + [str(data["blocked"]), _when(view.expires_at), ",".join(view.in_doubt) or "-"]
        ],
        ["epoch", "next_epoch", "holder", "client", "live", "blocked", "expires_at", "in_doubt"],
    )
    return 0


def _leases_revoke(args: argparse.Namespace) -> int:
    revoked = _with_store(args, lambda store: operations.revoke(store, args.resource, args.reason))
    data = {
        "resource": revoked.resource,
        "revoked_epoch": revoked.revoked_epoch,
        "epoch": revoked.epoch,
    }
    _print(args, data, [[_cell(v) for v in data.values()]], list(data))
    return 0


def _effects_list(args: argparse.Namespace) -> int:
    effects = _with_store(
        args,
        lambda store: operations.list_effects(store, args.resource, args.state, args.limit),
    )
    rows = [
        [
            e.id,
            e.state.value,
            e.route,
            e.resource,
            e.holder,
            str(e.epoch),
            e.idempotency_key or "-",
            str(e.upstream_status or "-"),
            _when(e.created_at),
        ]
        for e in effects
    ]
    header = ["id", "state", "route", "resource", "holder", "epoch", "key", "status", "created"]
    _print(args, [e.as_json() for e in effects], rows, header)
    return 0


def _effects_show(args: argparse.Namespace) -> int:
    history = _with_store(args, lambda store: operations.effect_history(store, args.effect_id))
    data = history.as_json()
    if args.json:
        _print(args, data, [], [])
        return 0
    fields = [[key, _cell(value)] for key, value in history.effect.as_json().items()]
    _print(args, data, fields, ["field", "value"])
    if history.events:
        print()
        rows = [
            [_when(e.at), e.kind, e.actor, e.conclusion, str(e.upstream_status or "-"), e.detail]
            for e in history.events
        ]
        _print(args, data, rows, ["at", "kind", "actor", "conclusion", "status", "detail"])
    return 0


def _default_operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _reconcile_list(args: argparse.Namespace) -> int:
    report = _with_store(args, operations.in_doubt)
    if args.json:
        _print(args, report.as_json(), [], [])
        return 0
    rows = [
        [
            entry.effect.id,
            entry.effect.state.value,
            f"{entry.age_s:.0f}s",
            entry.effect.route,
            entry.effect.resource,
            entry.effect.holder,
            str(entry.effect.epoch),
            entry.effect.idempotency_key or "-",
            str(entry.effect.probe_attempts),
            entry.last_event.detail if entry.last_event else "-",
        ]
        for entry in report.effects
    ]
    header = [
        "id",
        "state",
        "age",
        "route",
        "resource",
        "holder",
        "epoch",
        "key",
        "probes",
        "last result",
    ]
    print(f"blocked resources: {printable(', '.join(report.blocked_resources)) or 'none'}")
    _print(args, report.as_json(), rows, header)
    return 0


def _reconcile_probe(args: argparse.Namespace) -> int:
    policy = _policy(args)

    async def work(store: Store) -> ProbeResult:
        async with new_client_session() as session:
            return await operations.probe(store, session, policy, args.effect_id)

    result = _with_store(args, work)
    data = {
        "effect_id": args.effect_id,
        "conclusion": result.conclusion,
        "detail": result.detail,
        "state": result.effect.state.value if result.effect else None,
    }
    _print(args, data, [[_cell(v) for v in data.values()]], list(data))
    return 0


def _reconcile_resolve(args: argparse.Namespace) -> int:
    result = _with_store(
        args,
        lambda store: operations.resolve(
            store, args.effect_id, args.outcome, args.reason, args.operator
        ),
    )
    data = result.as_json()
    _print(
        args,
        data,
        [[result.id, result.state.value, result.settled_by or "-"]],
        ["id", "state", "settled_by"],
    )
    return 0


def _rejections(args: argparse.Namespace) -> int:
    found = _with_store(
        args, lambda store: operations.list_rejections(store, args.resource, args.limit)
    )
    rows = [
        [
            _when(r.at),
            r.code,
            f"{r.method} {r.path}",
            r.route or "-",
            r.resource or "-",
            r.holder or "-",
            str(r.epoch or "-"),
            r.client or "-",
            str(r.count),
        ]
        for r in found
    ]
    header = ["at", "code", "request", "route", "resource", "holder", "epoch", "client", "count"]
    _print(args, [r.as_json() for r in found], rows, header)
    return 0


def _status(args: argparse.Namespace) -> int:
    """What GET /_fence/v1/status answers, less the answering instance (the CLI serves
    nothing); a store that does not answer is printed, and exits 1."""
    policy = _policy(args)
    status = _with_store(
        args, lambda store: operations.service_status(store, policy.store, instance=None)
    )
    if args.json:
        _print(args, status.as_json(), [], [])
        return 0 if status.store_answers else 1
    answers = (
        "answers"
        if status.store_answers
        else f"does not answer: {printable(str(status.store_problem))}"
    )
    print(f"store: {status.backend}, {answers}")
    if not status.store_answers:
        return 1
    now = status.now or 0.0

    def ago(at: float | None) -> str:
        return "never" if at is None else f"{now - at:.0f}s ago"

    rows = [
        [
            replica.instance_id,
            replica.version,
            ago(replica.seen_at),
            f"{now - replica.started_at:.0f}s",
            ago(replica.last_sweep_at),
            ago(replica.last_probe_at),
        ]
        for replica in status.replicas
    ]
    print(f"replicas seen in the last {operations.REPLICAS_WINDOW_S:.0f}s: {len(rows)}")
    if rows:
        _print(args, None, rows, ["instance", "version", "seen", "up", "last sweep", "last probe"])
    return 0


def _store_migrate(args: argparse.Namespace) -> int:
    policy = _policy(args)
    before = asyncio.run(schema_versions(policy.store))
    # Opening the store applies what is missing (under a lock on PostgreSQL).
    _with_store(args, lambda store: store.ping())
    after = asyncio.run(schema_versions(policy.store))
    version = max(after)
    applied = sorted(after - before)
    if not before:
        said = f"created schema version {version}"
    elif applied:
        said = f"applied {', '.join(map(str, applied))}: schema version {version}"
    else:
        said = f"up to date (schema version {version})"
    data = {"store": policy.store, "version": version, "applied": applied, "created": not before}
    _print(args, data, [[policy.store, said]], ["store", "schema"])
    return 0


def _store_backup(args: argparse.Namespace) -> int:
    policy = _policy(args)
    target = Path(args.file)
    backup_sqlite(policy.store, target)
    data = {"store": policy.store, "backup": str(target), "bytes": target.stat().st_size}
    _print(args, data, [[_cell(v) for v in data.values()]], list(data))
    return 0


def _store_fence_restore(args: argparse.Namespace) -> int:
    if args.advance < 1:
        raise CommandError("--advance must be at least 1")
    if not args.yes:
        raise CommandError("fence-restore ends every lease; run it again with --yes")
    floor = _with_store(args, lambda store: store.fence_restore(args.advance))
    data = {"epoch_floor": floor, "leases_ended": True}
    _print(args, data, [[str(floor), "all ended"]], ["epoch_floor", "leases"])
    return 0


def _store_close_recovery(args: argparse.Namespace) -> int:
    if not args.yes:
        raise CommandError(
            "close-recovery lets keys the store lost be forwarded again; run it again with "
            "--yes once every worker's writes from before the failover are accounted for"
        )
    closed = _with_store(args, lambda store: store.close_recovery())
    data = {"recovery_window": "closed" if closed else "none was open"}
    _print(args, data, [[data["recovery_window"]]], ["recovery_window"])
    return 0


def _lease_advice(args: argparse.Namespace) -> int:
    """Advice from the recorded leases; non-zero when the policy refuses every write of
    a route (no TTL can fix that)."""
    policy = _policy(args)
    advice = _with_store(
        args,
        lambda store: operations.lease_advice(
            store,
            policy,
            resource=args.resource,
            since=args.since,
            margin=args.margin,
            poll_interval=args.poll_interval,
            targets=args.targets,
            leases=args.leases,
        ),
    )
    if args.json:
        print(json.dumps(advice.as_json(), indent=2, sort_keys=True))
    else:
        _print_advice(advice)
    return 1 if advice.problems else 0


CHART_WIDTH = 40


def _print_advice(advice: Advice) -> None:
    for group in advice.groups:
        data = group.as_json()
        print(f"{printable(group.resource)}: {group.stats.turns} measured turn(s)")
        rows = [["turns", str(group.stats.turns)]]
        turn_s = data["turn_s"]
        if isinstance(turn_s, dict):
            rows.append(["turn_s", "  ".join(f"{k} {v:g}" for k, v in turn_s.items())])
        shortest = data["shortest_lease_s"]
        if isinstance(shortest, dict):
            rows.append(
                [
                    "shortest lease for a false-expiry rate of",
                    "  ".join(f"{k}: {_seconds_text(v)}" for k, v in shortest.items()),
                ]
            )
        rows.append(["suggested_ttl_s", _seconds_text(data["suggested_ttl_s"])])
        delay = data["detection_delay_s"]
        if isinstance(delay, dict):
            rows.append(
                [
                    "detection delay (crash)",
                    f"{delay['expected']:g} s on average = {delay['lease_s']:g} - "
                    f"{delay['turn_s']:g}/2 + {delay['poll_interval_s']:g}/2",
                ]
            )
        rows.append(
            [
                "expired",
                f"{group.expired}: holder came back {group.came_back}, "
                f"never came back {group.expired - group.came_back}",
            ]
        )
        ttls = data["ttls_in_use_s"]
        if isinstance(ttls, dict):
            rows.append(["ttls in use", f"p50 {ttls['p50']:g} s, min {ttls['min']:g} s"])
        _table(rows, ["", ""], indent="  ")
        if group.stats.curve:
            print("  false-expiry curve: share of turns longer than the lease")
            width = max(len(f"{lease:g}") for lease, _ in group.stats.curve)
            for lease, share in group.stats.curve:
                bar = "#" * round(share * CHART_WIDTH)
                print(f"  {lease:>{width}g} s |{bar:<{CHART_WIDTH}}| {share * 100:5.1f}%")
        for warning in group.warnings:
            print(f"  warning: {printable(warning)}")
        print(f"  => {recommendation(group)}")
        print()
    if advice.routes:
        rows = []
        for route in advice.routes:
            tail = route.tail()
            measured = (
                [f"{tail['p50']:g}", f"{tail['p99']:g}", f"{tail['max']:g}"]
                if tail
                else ["-", "-", "-"]
            )
            check = "; ".join(route.warnings()) or "ok"
            rows.append(
                [route.name, str(len(route.latencies)), *measured, f"{route.timeout_s:g}", check]
            )
        _table(rows, ["route", "requests", "p50_s", "p99_s", "max_s", "timeout_s", "check"])
    for problem in advice.problems:
        print(f"problem: {printable(problem)}")


def _seconds_text(value: object) -> str:
    return "-" if value is None else f"{value:g}"


def _table(rows: list[list[str]], header: list[str], indent: str = "") -> None:
    shown = [
        [printable(cell) for cell in row] for row in ([header, *rows] if any(header) else rows)
    ]
    widths = [max(len(cell) for cell in column) for column in zip(*shown, strict=True)]
    for row in shown:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(indent + line.rstrip())


if __name__ == "__main__":
    main()
