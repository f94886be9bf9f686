"""What each key of the policy file and each environment variable means, for the
generated configuration reference (devtools/docs_reference.py checks that every key
the loader allows and every `FENCEPROXY_*` name the proxy reads has a line here). The
keys of `upstreams` and `routes` are declared with their meaning and default where
the loader reads them (policies/route_keys.py), and their lines are made from that."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from policies import keys, route_keys
from policies.keys import DAY_S
from policies.loading_store import DEFAULT_STORE
from policies.model import Policy


@dataclass(frozen=True)
class Key:
    meaning: str
    # Text, or what the minimal policy holds for it (None: no default).
    default: str | Callable[[Policy], object] = "—"


def _days(seconds: float) -> float:
    return seconds / DAY_S


def _shown(key: keys.Key[object]) -> str:
    """A declared key's default as the reference shows it."""
    if key.shown is not None:
        return key.shown
    value = key.default
    if isinstance(value, tuple):
        return f"`{json.dumps(list(value))}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _declared(parent: str, block: keys.Key[object]) -> dict[str, Key]:
    """The lines of a block's declared keys (policies/route_keys.py), depth first."""
    path = f"{parent}.{block.name}" if parent else block.name
    lines: dict[str, Key] = {}
    assert isinstance(block.kind, keys.Block)
    for key in block.kind.keys:
        lines[f"{path}.{key.name}"] = Key(key.help, _shown(key))
        if isinstance(key.kind, keys.Block):
            lines.update(_declared(path, key))
    return lines


CONFIGURATION: dict[str, Key] = {
    "version": Key("the policy format; `1` is the only one known", "required"),
    "listen": Key("the main listener: `{host, port, tls}`"),
    "listen.host": Key(
        "the address to listen on (`serve --host` overrides it)", lambda p: p.listen.host
    ),
    "listen.port": Key("the TCP port (`serve --port` overrides it)", lambda p: p.listen.port),
    "listen.tls": Key(
        "serve HTTPS (TLS 1.2 or later); see [TLS](../how-to/tls.md)", "none: plain HTTP"
    ),
    "listen.tls.cert": Key(
        "PEM certificate chain, leaf first; path relative to the policy file's folder",
        "required with `tls`",
    ),
    "listen.tls.key": Key(
        "the certificate's unencrypted PEM private key; path relative to the policy file's folder",
        "required with `tls`",
    ),
    "listen.tls.client_ca": Key(
        "mutual TLS: every connection must present a client certificate that chains to "
        "this PEM CA file, or the handshake fails",
        "none",
    ),
    "store": Key(
        "`sqlite:///PATH` (a relative PATH is read from the policy file's folder, as TLS "
        "files are; `sqlite:////abs/path.db`) or `postgresql://user@host:port/db`. For SQLite "
        "`?synchronous=NORMAL` trades the last commits before a power loss for speed; the "
        "default `FULL` loses nothing acknowledged. Only `serve` and `store migrate` create a "
        "SQLite store; other commands refuse a missing file",
        lambda p: DEFAULT_STORE,
    ),
    "store_pool": Key("PostgreSQL connections per proxy process"),
    "store_pool.min_size": Key("connections kept open", lambda p: p.store_pool.min_size),
    "store_pool.max_size": Key("connections at most", lambda p: p.store_pool.max_size),
    "store_pool.statement_cache": Key(
        "asyncpg prepares each statement once per connection and keeps it; `false` behind "
        "a pooler in transaction mode (see [replicas](../how-to/replicas.md)). "
        "`?statement_cache_size=` in the store URL is refused and names this option",
        lambda p: p.store_pool.statement_cache,
    ),
    "store_pool.acquire_timeout_s": Key(
        "seconds an operation waits for a free pooled connection; then `503 "
        "store_unavailable` (`Retry-After: 1`), and `/readyz` is 503",
        lambda p: p.store_pool.acquire_timeout_s,
    ),
    "store_pool.command_timeout_s": Key(
        "seconds one statement (or a connection's opening) may take, a pooler's queue "
        "included; then `503 store_unavailable`. Migrations are not bound by it; raise it "
        "for `store fence-restore` on a store with millions of resources",
        lambda p: p.store_pool.command_timeout_s,
    ),
    "admin_token_env": Key(
        "the environment variable whose value is the admin token; unset, empty or blank: "
        "the admin API is off (unless `auth:` names clients)",
        "none",
    ),
    "admin_token_next_env": Key(
        "a variable whose value is accepted as a second admin token, for rotation "
        "(see [auth](../how-to/auth.md))",
        "none",
    ),
    "leases": Key("the TTLs a worker may ask for"),
    "leases.min_ttl_s": Key("the shortest lease granted", lambda p: p.leases.min_ttl_s),
    "leases.max_ttl_s": Key(
        "the longest lease granted (a route's upstream timeout above it refuses every write)",
        lambda p: p.leases.max_ttl_s,
    ),
    "leases.default_ttl_s": Key(
        "the TTL of an acquire that names none", lambda p: p.leases.default_ttl_s
    ),
    "upstreams": Key("the APIs behind the proxy, by name (`NAME` below)", "required"),
    **_declared("upstreams", route_keys.UPSTREAM),
    "routes": Key(
        "what is proxied, matched in file order; two routes that can match one request are "
        "refused as ambiguous",
        "required",
    ),
    **_declared("", route_keys.ROUTE),
    "retention": Key(
        "how long the audit trail is kept (see [retention](../how-to/retention.md)); days, "
        "fractions allowed; `0` keeps forever"
    ),
    "retention.effects_days": Key(
        "how long a settled receipt is kept after it settled, with its history and stored "
        "response. Less than a fenced route's `idempotency.retain_s` is refused; when "
        "absent, the longest `retain_s` if longer. Effects in doubt or conflicting are never "
        "deleted",
        lambda p: _days(p.retention.effects_s),
    ),
    "retention.rejections_days": Key(
        "how long a kind of refusal is kept after it was last seen",
        lambda p: _days(p.retention.rejections_s),
    ),
    "retention.leases_days": Key(
        "how long a lease is kept after it expired; a resource's row goes once nothing "
        "refers to it, and the epoch floor keeps its epochs from being issued again",
        lambda p: _days(p.retention.leases_s),
    ),
    "retention.batch": Key(
        "the most of each kind one pass of the collector deletes in one transaction (1 to 10000)",
        lambda p: p.retention.batch,
    ),
    "limits": Key("what one client may hold of the proxy"),
    "limits.header_timeout_s": Key(
        "seconds a client has to send a request's headers, from the connection's start or "
        "the previous answer (so also how long an idle keep-alive connection is kept); then "
        "the connection is closed without an answer",
        lambda p: p.limits.header_timeout_s,
    ),
    "limits.body_timeout_s": Key(
        "seconds a client has to send the whole body once its headers arrived; then `408 "
        "request_timeout` and the connection is closed; nothing was recorded or forwarded",
        lambda p: p.limits.body_timeout_s,
    ),
    "limits.max_requests": Key(
        "proxied requests handled at once per process; one more is `503 overloaded` with "
        "`Retry-After: 1`. The control API (`/_fence/`) is not counted",
        lambda p: p.limits.max_requests,
    ),
    "limits.max_connections": Key(
        "client connections open at once per process; one more closes the connection that "
        "waited longest, either without a request being handled or on a request with no "
        "verified credential waiting for its token's lookup or its body (that one is "
        "answered `503 overloaded`); if every one has a request being handled otherwise, "
        "the new one is `503 overloaded`. Keep it above `max_requests`",
        lambda p: p.limits.max_connections,
    ),
    "limits.max_unverified_waits": Key(
        "requests with no verified credential (no configured client's key or certificate, "
        "no live lease's `Fence-Token`: an anonymous acquire without `auth:`, a renew with "
        "an ended lease's token, a made-up token being looked up, a pass-through request) "
        "waiting at once for their token's lookup or their body, per process; one more "
        "closes the one that waited longest, answered `503 "
        "overloaded`. Absent: a quarter of `max_requests`; must be below it, so that such "
        "requests, however many, leave the rest to workers with a credential",
        lambda p: p.limits.unverified_waits,
    ),
    "quotas": Key(
        "per quota subject (the holder; with `auth:`, the client); see "
        "[quotas](../how-to/quotas.md)"
    ),
    "quotas.live_leases": Key(
        "live leases one subject may hold at once; `0` is no cap",
        lambda p: p.quotas.live_leases,
    ),
    "quotas.acquires_per_s": Key(
        "acquires per second one subject may make through one process, after its `burst`; "
        "fractions allowed, `0` is no limit",
        lambda p: p.quotas.acquires_per_s,
    ),
    "quotas.burst": Key(
        "acquires a subject may make at once before `acquires_per_s` applies (at least 1)",
        lambda p: p.quotas.burst,
    ),
    "auth": Key(
        "clients with keys, rights and resource globs (see [auth](../how-to/auth.md))",
        "none: the lease API is open",
    ),
    "auth.clients": Key("the clients", "required with `auth`"),
    "auth.clients[].name": Key(
        "1 to 128 of `A-Z a-z 0-9 . _ : @ -`, unique, not `admin`; recorded with what it does",
        "required",
    ),
    "auth.clients[].key_env": Key(
        "the key is this environment variable's value at `serve` (one of `key_env`, "
        "`key_sha256`, `cert_subject`)",
        "—",
    ),
    "auth.clients[].key_sha256": Key(
        'the key\'s SHA-256 in hex (`printf %s "$KEY" | sha256sum`)', "—"
    ),
    "auth.clients[].cert_subject": Key(
        "the subject CN of a client certificate verified against `listen.tls.client_ca`",
        "—",
    ),
    "auth.clients[].resources": Key("fnmatch globs, case-sensitive", "required"),
    "auth.clients[].may": Key("rights: `lease`, `read`, `operate`, `admin`", "required"),
    "metrics_listen": Key(
        "serve `/_fence/metrics` on a listener of its own instead of the main one; it needs "
        "no key, so bind it where only the scraper can reach it",
        "none: metrics on the main listener",
    ),
    "metrics_listen.host": Key("its address", "127.0.0.1"),
    "metrics_listen.port": Key("its TCP port", "required"),
}


ENVIRONMENT: dict[str, str] = {
    "FENCEPROXY_CONFIG": "the policy file of every `fenceproxy` command without `--config`",
    "FENCEPROXY_INSTANCE_ID": (
        "this proxy instance's stable name (default `hostname:port`): the effects it "
        "dispatched carry it, so a restart turns only its own in-flight effects into "
        "`UNKNOWN`; give each replica its own"
    ),
    "FENCEPROXY_STATE_DIR": (
        "`serve --state-dir`'s default: where the instance remembers which store it last "
        "used (default: the SQLite database's folder, or for PostgreSQL the policy file's)"
    ),
    "FENCEPROXY_LOG_LEVEL": "`serve`'s log level (`DEBUG`, `INFO`, `WARNING`...); default `INFO`",
    "FENCEPROXY_LOG_FORMAT": (
        "`serve --log-format`'s default: `text`, or `json` (one object per line with the "
        "request id, route, resource, effect id and epoch); default `text`"
    ),
    "FENCEPROXY_TRACING": (
        "`serve --tracing`'s default: `off`, or `otlp` (OpenTelemetry spans exported as the "
        "standard `OTEL_EXPORTER_OTLP_*` variables say; needs the `otel` extra). See "
        "How-to, tracing and JSON logs"
    ),
    "FENCEPROXY_FAILPOINTS": (
        "for tests only: named places where `serve` stops itself (SIGSTOP), comma-separated "
        "(`mid_batch`, `admitted`, `before_send`, `cancelled`, `sent`; `NAME:once` stops "
        "there the first "
        "time only); default: none. See Contributing, failpoints"
    ),
}
