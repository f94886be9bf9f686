"""The commands that read and act on the store directly, so that they work while the
proxy is down: leases, effects, reconciliation, status, the store's schema and backups,
lease advice."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from policies import Policy, load_policy_with_digest
from policies.store_backends import StoreBackend, store_backend
from proxy import operations
from proxy.app import new_instance_id
from proxy.cli_output import emit, local_time, print_advice, table_cell
from proxy.forwarding import new_client_session
from proxy.presentation import lease_view_json
from proxy.terminal import printable
from reconcile import operations as reconciliation
from reconcile.prober import ProbeResult
from store import Store, open_store
from store.files import backup_sqlite, schema_versions
from store.sqlite import parse_sqlite_url

T = TypeVar("T")


class CommandError(Exception):
    """A one-line reason for a non-zero exit."""


# Of a policy's sha256, enough to tell the files apart in a table.
POLICY_DIGEST_SHOWN = 12


def policy_of(args: argparse.Namespace) -> Policy:
    return policy_and_digest_of(args)[0]


def policy_and_digest_of(args: argparse.Namespace) -> tuple[Policy, str]:
    """The policy of --config and the sha256 of the bytes it was read from."""
    if not args.config:
        raise CommandError("no policy file: pass --config FILE or set FENCEPROXY_CONFIG")
    if not os.path.exists(args.config):
        raise CommandError(f"{args.config}: no such file")
    return load_policy_with_digest(args.config)


def with_store(
    args: argparse.Namespace, work: Callable[[Store], Awaitable[T]], creates: bool = False
) -> T:
    """`work` on the policy's store. Only `creates` (store migrate) may create a SQLite
    store: any other command on a missing file would answer from a new empty store
    ("no leases", "nothing blocked"), which is not true of the proxy's."""
    policy = policy_of(args)
    if not creates and store_backend(policy.store) is StoreBackend.SQLITE:
        path = parse_sqlite_url(policy.store)[0]
        if not path.exists():
            raise CommandError(
                f"{args.config}: no store at {path} (its store path is read from the policy"
                " file's folder); `fenceproxy serve` or `fenceproxy store migrate` creates it"
            )

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


def leases_show(args: argparse.Namespace) -> int:
    view = with_store(args, lambda store: operations.lease_view(store, args.resource))
    data = lease_view_json(view)
    emit(
        args,
        data,
        [
            [table_cell(data[key]) for key in ("epoch", "next_epoch", "holder", "client", "live")]
            + [str(data["blocked"]), local_time(view.expires_at), ",".join(view.in_doubt) or "-"]
        ],
        ["epoch", "next_epoch", "holder", "client", "live", "blocked", "expires_at", "in_doubt"],
    )
    return 0


def leases_revoke(args: argparse.Namespace) -> int:
    revoked = with_store(args, lambda store: operations.revoke(store, args.resource, args.reason))
    data = {
        "resource": revoked.resource,
        "revoked_epoch": revoked.revoked_epoch,
        "epoch": revoked.epoch,
    }
    emit(args, data, [[table_cell(v) for v in data.values()]], list(data))
    return 0


def effects_list(args: argparse.Namespace) -> int:
    effects = with_store(
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
            local_time(e.created_at),
        ]
        for e in effects
    ]
    header = ["id", "state", "route", "resource", "holder", "epoch", "key", "status", "created"]
    emit(args, [e.as_json() for e in effects], rows, header)
    return 0


def effects_show(args: argparse.Namespace) -> int:
    history = with_store(args, lambda store: operations.effect_history(store, args.effect_id))
    data = history.as_json()
    if args.json:
        emit(args, data, [], [])
        return 0
    fields = [[key, table_cell(value)] for key, value in history.effect.as_json().items()]
    emit(args, data, fields, ["field", "value"])
    if history.events:
        print()
        rows = [
            [
                local_time(e.at),
                e.kind,
                e.actor,
                e.conclusion,
                str(e.upstream_status or "-"),
                e.detail,
            ]
            for e in history.events
        ]
        emit(args, data, rows, ["at", "kind", "actor", "conclusion", "status", "detail"])
    return 0


def reconcile_list(args: argparse.Namespace) -> int:
    policy = policy_of(args)
    report = with_store(args, lambda store: reconciliation.in_doubt(store, policy))
    if args.json:
        emit(args, report.as_json(), [], [])
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
    emit(args, report.as_json(), rows, header)
    return 0


def reconcile_probe(args: argparse.Namespace) -> int:
    policy = policy_of(args)

    async def work(store: Store) -> ProbeResult:
        async with new_client_session() as session:
            return await operations.probe(store, session, policy, args.effect_id)

    result = with_store(args, work)
    data = {
        "effect_id": args.effect_id,
        "conclusion": result.conclusion,
        "detail": result.detail,
        "state": result.effect.state.value if result.effect else None,
    }
    emit(args, data, [[table_cell(v) for v in data.values()]], list(data))
    return 0


def reconcile_resolve(args: argparse.Namespace) -> int:
    result = with_store(
        args,
        lambda store: operations.resolve(
            store, args.effect_id, args.outcome, args.reason, args.operator
        ),
    )
    data = result.as_json()
    emit(
        args,
        data,
        [[result.id, result.state.value, result.settled_by or "-"]],
        ["id", "state", "settled_by"],
    )
    return 0


def rejections(args: argparse.Namespace) -> int:
    found = with_store(
        args, lambda store: operations.list_rejections(store, args.resource, args.limit)
    )
    rows = [
        [
            local_time(r.at),
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
    emit(args, [r.as_json() for r in found], rows, header)
    return 0


def status(args: argparse.Namespace) -> int:
    """What GET /_fence/v1/status answers, less the answering instance (the CLI serves
    nothing); a store that does not answer is printed, and exits 1."""
    policy = policy_of(args)
    status = with_store(
        args, lambda store: operations.service_status(store, policy.store, instance=None)
    )
    if args.json:
        emit(args, status.as_json(), [], [])
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
            (replica.policy_digest or "-")[:POLICY_DIGEST_SHOWN],
        ]
        for replica in status.replicas
    ]
    print(f"replicas seen in the last {operations.REPLICAS_WINDOW_S:.0f}s: {len(rows)}")
    if rows:
        emit(
            args,
            None,
            rows,
            ["instance", "version", "seen", "up", "last sweep", "last probe", "policy"],
        )
    digests = operations.policy_digests(status.replicas)
    if len(digests) > 1:
        print(
            f"warning: the replicas serve {len(digests)} different policy files "
            f"({', '.join(d[:POLICY_DIGEST_SHOWN] for d in digests)}): reload or restart "
            "the ones behind (docs/how-to/deployment.md)"
        )
    return 0


def store_migrate(args: argparse.Namespace) -> int:
    policy = policy_of(args)
    before = asyncio.run(schema_versions(policy.store))
    # Opening the store applies what is missing (under a lock on PostgreSQL).
    with_store(args, lambda store: store.ping(), creates=True)
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
    emit(args, data, [[policy.store, said]], ["store", "schema"])
    return 0


def store_backup(args: argparse.Namespace) -> int:
    policy = policy_of(args)
    target = Path(args.file)
    backup_sqlite(policy.store, target)
    data = {"store": policy.store, "backup": str(target), "bytes": target.stat().st_size}
    emit(args, data, [[table_cell(v) for v in data.values()]], list(data))
    return 0


def store_fence_restore(args: argparse.Namespace) -> int:
    if args.advance < 1:
        raise CommandError("--advance must be at least 1")
    if not args.yes:
        raise CommandError("fence-restore ends every lease; run it again with --yes")
    floor = with_store(args, lambda store: store.fence_restore(args.advance))
    data = {"epoch_floor": floor, "leases_ended": True}
    emit(args, data, [[str(floor), "all ended"]], ["epoch_floor", "leases"])
    return 0


def store_close_recovery(args: argparse.Namespace) -> int:
    if not args.yes:
        raise CommandError(
            "close-recovery lets keys the store lost be forwarded again; run it again with "
            "--yes once every worker's writes from before the failover are accounted for"
        )
    closed = with_store(args, lambda store: store.close_recovery())
    data = {"recovery_window": "closed" if closed else "none was open"}
    emit(args, data, [[data["recovery_window"]]], ["recovery_window"])
    return 0


def lease_advice(args: argparse.Namespace) -> int:
    """Advice from the recorded leases; non-zero when the policy refuses every write of
    a route (no TTL can fix that)."""
    policy = policy_of(args)
    advice = with_store(
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
        print_advice(advice)
    return 1 if advice.problems else 0
