"""`fenceproxy serve` and `fenceproxy check-config`: starting a proxy on a policy file,
and checking that file without starting one."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import gc
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core import failpoints
from core import telemetry as core_telemetry
from policies import Policy, load_policy
from policies.tls import server_context
from proxy import connections, operations, telemetry
from proxy.app import build_app, default_instance_id
from proxy.auth import (
    KeyProblem,
    blank_admin_token_warnings,
    env_secret,
    exposure_warning,
    missing_keys,
)
from proxy.cli_store import CommandError, policy_and_digest_of
from proxy.identity import IdentityCheck, default_state_dir, memory_file
from proxy.runtime import RUNTIME

# aiohttp refuses oversized headers with a plain-text 400 before any handler runs;
# its limits sit above the proxy's own so that clients get a problem+json instead.
# `serve` counts each head before aiohttp keeps it (proxy/connections.py), so a head
# never grows to these in aiohttp's parser.
PARSER_LIMITS = {"max_line_size": 65536, "max_field_size": 65536, "max_headers": 256}


# The cyclic GC's first-generation threshold once `serve` listens (CPython's default is
# 700). Under fenced load at c=16 the default ran a first-generation collection every
# 25 or so requests, about 20 µs of the loop's CPU per request; a request leaves almost
# no cyclic garbage (none collected over 8,000 fenced writes at this threshold), so
# collections become rare while the young objects they would hold stay a few MB at most
# (bench/README.md, "The cyclic collector under fenced load").
GC_FIRST_GENERATION_THRESHOLD = 10_000


def settle_heap() -> None:
    """Once started: what is alive now (modules, the policy, the app, the store's
    connections) lives as long as the process, so it is moved out of the collector's
    reach (`gc.freeze`): a full collection then scans only what requests made, not the
    whole startup heap, which took 23-36 ms a time under load against under 1 ms frozen.
    A frozen object dropped later (the policy a reload replaces) is still freed by its
    reference count; only a cycle among frozen objects would stay. And collections made
    rarer (`GC_FIRST_GENERATION_THRESHOLD`)."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_FIRST_GENERATION_THRESHOLD, middle, oldest)


def server_options(policy: Policy) -> dict[str, Any]:
    """What `serve` gives aiohttp's server (the in-process tests give it the same).

    `keepalive_timeout` is the header timeout: aiohttp arms it when a connection opens
    and again after each answer, and closes the connection if a request's headers
    have not all arrived by then (an idle keep-alive connection included). There is
    no request yet to answer, so the close is silent.
    """
    return {**PARSER_LIMITS, "keepalive_timeout": policy.limits.header_timeout_s}


def stop_this_process() -> None:
    """What a failpoint does: stop as a GC or VM pause would, until SIGCONT."""
    os.kill(os.getpid(), signal.SIGSTOP)


def serve(args: argparse.Namespace) -> int:
    try:
        telemetry.check_options(args.log_format, args.tracing)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    policy, digest = policy_and_digest_of(args)
    try:
        # Read once: a test pauses a replica at a named place (core/failpoints.py).
        paused_at = failpoints.configure(os.environ, stop_this_process)
    except failpoints.FailpointError as exc:
        raise CommandError(str(exc)) from None

    def adjust(policy: Policy) -> Policy:
        """Two replicas on one host differ only in their listener: one file serves both
        (and a reload reads it again with the same change)."""
        listen = dataclasses.replace(
            policy.listen,
            host=args.host if args.host is not None else policy.listen.host,
            port=args.port if args.port is not None else policy.listen.port,
        )
        return dataclasses.replace(policy, listen=listen)

    policy = adjust(policy)
    admin_token = env_secret(os.environ, policy.admin_token_env) if policy.admin_token_env else None
    next_env = policy.admin_token_next_env
    admin_token_next = env_secret(os.environ, next_env) if next_env else None
    telemetry.configure_logging(args.log_format, os.environ.get("FENCEPROXY_LOG_LEVEL", "INFO"))
    flush_spans = _start_tracing(
        args.tracing, args.log_format == "json", default_instance_id(policy)
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
            policy_file=args.config,
            policy_digest=digest,
        )
    except KeyProblem as exc:
        raise CommandError(f"{args.config}: {exc}") from None
    app[RUNTIME].grace_s = args.grace
    app[RUNTIME].adjust = adjust
    _check_free(policy.listen.host, policy.listen.port, "--port N (or listen.port)")
    if policy.metrics_listen is not None:
        metrics = policy.metrics_listen
        _check_free(metrics.host, metrics.port, "metrics_listen.port")
    for warning in [exposure_warning(policy), *blank_admin_token_warnings(policy, os.environ)]:
        if warning is not None:
            print(f"fenceproxy: warning: {warning}", file=sys.stderr, flush=True)
    if paused_at:
        print(
            f"fenceproxy: warning: {failpoints.ENV} stops this process (SIGSTOP) at "
            f"{', '.join(sorted(paused_at))}: for tests only",
            file=sys.stderr,
            flush=True,
        )
    admin_tokens = sum(bool(token) for token in (admin_token, admin_token_next))
    clients = len(policy.auth.clients) if policy.auth is not None else 0
    tls = policy.listen.tls
    banner = (
        f"fenceproxy on {'https' if tls else 'http'}://{policy.listen.host}:{policy.listen.port} "
        f"(store {policy.store}, admin API {'on' if admin_tokens else 'off'}"
        f"{f' with {admin_tokens} tokens' if admin_tokens > 1 else ''}, "
        f"{f'{clients} clients' if policy.auth is not None else 'no auth'}"
        f"{_metrics_note(policy)}{_tls_summary(policy)})"
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
                max_unverified_waits=policy.limits.unverified_waits,
                metrics=app[RUNTIME].metrics,
                server_options=server_options(policy),
                # Once the store is open and the port listens: a store that cannot be
                # opened is refused in one line, with no banner before it.
                on_listening=lambda: _listening(banner),
            )
        )
    except OSError as exc:
        # Taken between the check above and the bind: still one line, not a traceback.
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise
        raise CommandError(
            f"{exc.strerror}; choose another with --port N (or listen.port)"
        ) from None
    finally:
        flush_spans()
    return 0


def _listening(banner: str) -> None:
    settle_heap()
    print(banner, flush=True)


def _start_tracing(tracing: str, log_fields: bool, instance_id: str) -> Callable[[], None]:
    """Tracing for the process as `--tracing` says, and whether log lines carry what the
    work is about; returns what sends the spans still held when the proxy stops (for up
    to the exporter's timeout). Off, OpenTelemetry is not even imported."""
    if tracing == "off":
        core_telemetry.install(None, log_fields)
        return lambda: None
    try:
        from proxy import tracing as otel
    except ImportError as exc:
        raise CommandError(
            f"--tracing {tracing} needs OpenTelemetry, which is not installed ({exc}): "
            "pip install 'fenceproxy[otel]'"
        ) from None
    version = operations.proxy_version()
    try:
        provider = otel.otlp_provider(instance_id, version)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    core_telemetry.install(otel.OtelSpans(provider, version), log_fields)
    return provider.shutdown


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


def check_config(args: argparse.Namespace) -> int:
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
