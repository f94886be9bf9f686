"""What each key of the policy file and each environment variable means, for the
generated configuration reference (devtools/docs_reference.py checks that every key
the loader allows and every `FENCEPROXY_*` name the proxy reads has a line here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policies.loading_store import DEFAULT_STORE
from policies.model import DAY_S, Policy


@dataclass(frozen=True)
class Key:
    meaning: str
    # Text, or what the minimal policy holds for it (None: no default).
    default: str | Callable[[Policy], object] = "—"


def _days(seconds: float) -> float:
    return seconds / DAY_S


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
    "upstreams.NAME.url": Key(
        "`http://` or `https://`; an https upstream's certificate is always verified (its "
        "chain and that it names the URL's host)",
        "required",
    ),
    "upstreams.NAME.timeout_s": Key(
        "seconds a request may take upstream; past it a fenced write's outcome is unknown. "
        "A fenced write needs at least this much left on its lease (`lease_too_short`)",
        lambda p: p.upstreams["NAME"].timeout_s,
    ),
    "upstreams.NAME.connect_timeout_s": Key(
        "seconds to connect (and to wait for a pooled connection); past it nothing was "
        "sent: `502 upstream_unreachable`. At most `timeout_s`",
        lambda p: p.upstreams["NAME"].connect_timeout_s,
    ),
    "upstreams.NAME.send_window_s": Key(
        "seconds after a fenced write's admission within which it may still be sent, "
        "counted from before the admission (its wait for a store connection included) and "
        "checked on the proxy's own monotonic clock once it has a connection, right "
        "before the first byte; past it nothing is sent (`502 upstream_unreachable`, "
        "effect `NOT_SENT`), so a replica paused after admitting cannot land a write "
        "another replica already settled. Other replicas take the write for in flight "
        "until `send_window_s` + `timeout_s` + 2 s after its admission. At least "
        "`connect_timeout_s`, at most 60",
        "5, or `connect_timeout_s` if longer",
    ),
    "upstreams.NAME.pool": Key("connections per process to this upstream"),
    "upstreams.NAME.pool.fenced": Key(
        "connections for fenced routes", lambda p: p.upstreams["NAME"].pool.fenced
    ),
    "upstreams.NAME.pool.pass_through": Key(
        "connections for `fence: none` routes; kept apart from `fenced` so slow reads cannot "
        "starve fenced writes",
        lambda p: p.upstreams["NAME"].pool.pass_through,
    ),
    "upstreams.NAME.ca_bundle": Key(
        "an https upstream's certificate must chain to a CA in this PEM file (only these "
        "CAs); path relative to the policy file's folder; refused on an http URL",
        "none: the system's trust store",
    ),
    "routes": Key(
        "what is proxied, matched in file order; two routes that can match one request are "
        "refused as ambiguous",
        "required",
    ),
    "routes[].name": Key("the route's name, in logs, metrics and effects", "required"),
    "routes[].upstream": Key("the name of an upstream", "required"),
    "routes[].match": Key("what requests the route takes", "required"),
    "routes[].match.methods": Key(
        "HTTP methods (GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS)", "required"
    ),
    "routes[].match.path": Key(
        "`{name}` one segment; `{name:int}`, `{name:uuid}`; `{name:REGEX}` (may span "
        "segments, e.g. `{rest:.*}`); matched against the decoded path, where a regex's "
        "`.` matches any character (a newline from `%0A` too)",
        "required",
    ),
    "routes[].resource": Key(
        "the resource a write needs a lease on, rendered from path parameters: 1 to 256 "
        "characters of `A-Z a-z 0-9 . _ : @ / + = -`; a parameter may not hold its "
        "separators (see [routes](routes.md))",
        "required when fenced",
    ),
    "routes[].fence": Key(
        "`required`: a write needs a live lease's token; `none`: plain pass-through, no "
        "token, nothing recorded",
        lambda p: "required" if p.routes[0].fenced else "none",
    ),
    "routes[].forward_fence_headers": Key(
        "send `Fence-Epoch`, `Fence-Resource`, `Fence-Effect-Id` upstream (workers always get "
        "them)",
        lambda p: p.routes[0].forward_fence_headers,
    ),
    "routes[].max_body_bytes": Key(
        "larger bodies get `413 payload_too_large` before anything is read past the limit",
        lambda p: p.routes[0].max_body_bytes,
    ),
    "routes[].max_in_flight": Key(
        "effects of one resource being forwarded at once", lambda p: p.routes[0].max_in_flight
    ),
    "routes[].idempotency": Key("the `Idempotency-Key` rules"),
    "routes[].idempotency.required": Key(
        "`true`: a write without `Idempotency-Key` is `400 missing_idempotency_key`",
        lambda p: p.routes[0].idempotency.required,
    ),
    "routes[].idempotency.retain_s": Key(
        "seconds a key and its response are kept after its effect settled",
        lambda p: p.routes[0].idempotency.retain_s,
    ),
    "routes[].outcomes": Key(
        'what an upstream status proves; an exact code (`"404"`) beats a class (`"4xx"`); '
        "anything unmapped is `unknown`"
    ),
    "routes[].outcomes.committed": Key("statuses that prove the write applied", '`["2xx"]`'),
    "routes[].outcomes.not_committed": Key(
        "statuses that prove it was not applied (the key is freed)", '`["4xx"]`'
    ),
    "routes[].outcomes.unknown": Key(
        "statuses that prove nothing (the effect is in doubt, the resource blocked)",
        '`["408", "5xx"]`',
    ),
    "routes[].reconcile": Key(
        "how to probe an `UNKNOWN` effect (see [reconciliation](../how-to/reconciliation.md)); "
        "without it, `UNKNOWN` waits for an operator",
        "none",
    ),
    "routes[].reconcile.probe": Key("the request that asks the upstream", "required"),
    "routes[].reconcile.probe.method": Key("`GET` or `HEAD`", lambda p: _reconcile(p).probe.method),
    "routes[].reconcile.probe.path": Key(
        "rendered from the effect's path parameters and `{idempotency_key}` (which needs "
        "`idempotency.required: true`)",
        "required",
    ),
    "routes[].reconcile.committed": Key("probe statuses that prove the write applied", "required"),
    "routes[].reconcile.not_committed": Key(
        "probe statuses that prove it was not applied (believed only after `settle_s`)",
        "required",
    ),
    "routes[].reconcile.settle_s": Key(
        'how long after dispatch a "not committed" probe answer is believed, dispatch being '
        "the latest a write may have been sent (its admission plus the upstream's "
        "`send_window_s`, or its lost answer's receipt if earlier). Never below the "
        "upstream's `timeout_s` (refused: a write the proxy gave up on may still land); "
        "size it as the timeout plus the slowest the upstream has been seen to apply a write",
        "the upstream's `timeout_s`",
    ),
    "routes[].reconcile.attempts": Key(
        'inconclusive probes before the effect waits for an operator (an early "not '
        'found" inside the window does not count)',
        lambda p: _reconcile(p).attempts,
    ),
    "routes[].upstream_idempotent": Key(
        "the upstream deduplicates by `Idempotency-Key`: the current holder may resend the "
        "same operation to settle an `UNKNOWN` one (needs `idempotency.required: true`)",
        lambda p: p.routes[0].upstream_idempotent,
    ),
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


def _reconcile(policy: Policy) -> Any:
    reconcile = policy.routes[0].reconcile
    assert reconcile is not None
    return reconcile


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
        "(`admitted`, `before_send`, `sent`; `NAME:once` stops there the first time only); "
        "default: none. See Contributing, failpoints"
    ),
}
