"""`fenceproxy` command line: serve, check the policy, read and act on the store.

Every command but `serve` and `reload` works on the store directly, so it works
while the proxy is down. Tables for people, `--json` for programs, one line on failure.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from core.records import EffectState, Refusal
from policies import ConfigError
from proxy import cli_reload, cli_serve, cli_store, operations, telemetry
from proxy.identity import STATE_DIR_ENV
from proxy.operations import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT
from proxy.terminal import printable
from store import StoreError

# The exit status a shell gives a process killed by SIGPIPE (128 + 13).
BROKEN_PIPE_EXIT = 141


def main(argv: Sequence[str] | None = None) -> None:
    try:
        try:
            _main(argv)
        finally:
            # Flushed here, not at interpreter exit, where a closed pipe is only
            # reported as an ignored exception on stderr.
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head`, `| grep -q`): nothing is left to say, and a
        # traceback would only alarm. Later writes at exit go to /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(BROKEN_PIPE_EXIT)


def _main(argv: Sequence[str] | None) -> None:
    parser = build_parser()
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
    except Refusal as refused:
        # The admin API's problem+json says the same: its detail and its code.
        print(f"fenceproxy: {printable(refused.detail)} ({refused.code})", file=sys.stderr)
        sys.exit(1)
    except (cli_store.CommandError, StoreError) as exc:
        print(f"fenceproxy: {printable(str(exc))}", file=sys.stderr)
        sys.exit(1)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; devtools/docs_reference.py renders it as docs/reference/cli.md."""
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

    serve = command("serve", cli_serve.serve, "run the proxy")
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
    serve.add_argument(
        "--log-format",
        choices=telemetry.LOG_FORMATS,
        default=os.environ.get(telemetry.LOG_FORMAT_ENV) or "text",
        help="text lines, or one JSON object per line with the request id, route, resource, "
        f"effect id and epoch (default: ${telemetry.LOG_FORMAT_ENV}, else text)",
    )
    serve.add_argument(
        "--tracing",
        choices=telemetry.TRACING,
        default=os.environ.get(telemetry.TRACING_ENV) or "off",
        help="otlp: OpenTelemetry spans, exported as the OTEL_EXPORTER_OTLP_* variables say "
        f"(needs the otel extra; default: ${telemetry.TRACING_ENV}, else off)",
    )
    reload = command(
        "reload",
        cli_reload.reload,
        "make a running replica read its policy file again (as SIGHUP does), or say why not",
    )
    reload.add_argument(
        "--url", help="the replica, e.g. http://127.0.0.1:8080 (default: the file's listen)"
    )
    reload.add_argument(
        "--port", type=_port, help="the replica's port, if not the file's listen.port"
    )
    reload.add_argument("--cafile", help="CA bundle that the replica's https certificate chains to")
    reload.add_argument("--json", action="store_true", help="print JSON for programs")
    check = command("check-config", cli_serve.check_config, "validate a policy file")
    check.add_argument("file", nargs="?", help="policy file (default: --config)")

    leases = commands.add_parser("leases", help="read or revoke leases")
    lease_commands = leases.add_subparsers(metavar="ACTION", required=True)
    show = lease_commands.add_parser("show", help="a resource's lease, epoch and effects in doubt")
    show.add_argument("resource", help="the resource's name, as a route renders it")
    revoke = lease_commands.add_parser("revoke", help="advance a resource's epoch now")
    revoke.add_argument("resource", help="the resource's name, as a route renders it")
    revoke.add_argument("--reason", required=True, help="why, kept with the revocation")
    for sub, run in ((show, cli_store.leases_show), (revoke, cli_store.leases_revoke)):
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
    for sub, run in (
        (listing, cli_store.effects_list),
        (one, cli_store.effects_show),
        (rejections, cli_store.rejections),
    ):
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
        (in_doubt, cli_store.reconcile_list),
        (detail, cli_store.effects_show),
        (probe, cli_store.reconcile_probe),
        (resolve, cli_store.reconcile_resolve),
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
        (migrate, cli_store.store_migrate),
        (backup, cli_store.store_backup),
        (restore, cli_store.store_fence_restore),
        (close_recovery, cli_store.store_close_recovery),
    ):
        _store_options(sub)
        sub.set_defaults(run=run)

    advice = command(
        "lease-advice",
        cli_store.lease_advice,
        "lease TTLs from the measured turns of recorded leases (docs/explanation/lease-sizing.md)",
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
        cli_store.status,
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


def _default_operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


if __name__ == "__main__":
    main()
