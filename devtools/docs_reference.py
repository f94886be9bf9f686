"""The generated pages of the docs site, from the code they describe.

`python -m devtools.docs_reference` (`make docs`) writes them; `--check` says which
differ from what is checked in (tests/unit/test_docs_reference.py runs it). They are
checked in, not made at build time: they read on GitHub and in a review's diff as
they are, and `mkdocs build` never imports the proxy.

* docs/reference/configuration.md: every key of the policy file, found by asking the
  policy loader itself (`policies.loading.parse_policy`) which keys each block
  allows, so a key added to the loader without a line in `CONFIGURATION` below fails
  the generator; its defaults are read from a parsed minimal policy; and every
  environment variable the proxy reads (`ENVIRONMENT`, checked against the
  `FENCEPROXY_*` names in the shipped packages' source).
* docs/reference/cli.md: the argparse parser (`proxy.cli.build_parser`).
* docs/reference/openapi.md: the OpenAPI document (`proxy.openapi.document`).
* docs/reference/errors.md: the error code table (`core.codes.ErrorCode`).
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import functools
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from core.codes import ErrorCode
from policies.loading import parse_policy
from policies.loading_store import DEFAULT_STORE
from policies.model import DAY_S, Policy
from policies.nodes import ConfigError
from proxy.cli import build_parser
from proxy.openapi import document

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
EXAMPLE_POLICY = ROOT / "config" / "example.yaml"
# The packages the wheel ships (pyproject.toml): the environment variables they read.
SHIPPED = ("policies", "core", "store", "proxy", "reconcile")

# --- the policy file's keys, as the loader knows them ---------------------------------------

_PROBE = "zz_probe_key"
_UNKNOWN = re.compile(r"unknown key \(allowed: (.*)\)\Z")
Path_ = tuple[str | int, ...]


def _dotted(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _with_probe(data: Any, path: Path_) -> Any:
    """A copy of `data` with an unknown key in the mapping at `path`, made if missing
    (and replacing whatever else is there)."""
    data = copy.deepcopy(data)
    holder = data
    for index, part in enumerate(path):
        following = path[index + 1] if index + 1 < len(path) else None
        kind: type[Any] = list if isinstance(following, int) else dict
        if isinstance(part, int):
            while len(holder) <= part:
                holder.append({})
        if not isinstance(holder[part] if isinstance(part, int) else holder.get(part), kind):
            holder[part] = kind()
        holder = holder[part]
    holder[_PROBE] = 1
    return data


def _allowed_at(base: Any, path: Path_) -> list[str] | None:
    """The keys the loader allows in the mapping at `path`, or None if it is no block."""
    data = _with_probe(base, path)
    try:
        parse_policy(yaml.safe_dump(data, sort_keys=False), "<probe>", ROOT / "config")
    except ConfigError as error:
        where = _dotted((*path, _PROBE))
        for problem in error.problems:
            found = _UNKNOWN.match(problem.message)
            if problem.key == where and found:
                return found.group(1).split(", ")
    return None


@functools.cache  # a few hundred parses of the example policy: once per process
def policy_keys() -> tuple[str, ...]:
    """Every key of the policy file, as `a.b`, `routes[].x` and `upstreams.NAME.x`."""
    base = yaml.safe_load(EXAMPLE_POLICY.read_text(encoding="utf-8"))
    keys: list[str] = []

    def walk(path: Path_, shown: str) -> None:
        allowed = _allowed_at(base, path)
        assert allowed is not None, f"{shown or 'the top level'} is not a block"
        for name in allowed:
            child_shown = f"{shown}.{name}" if shown else name
            keys.append(child_shown)
            child: Path_ = (*path, name)
            existing = _lookup(base, child)
            if existing is not None and not isinstance(existing, dict | list):
                continue  # the example holds a plain value there: no block
            if isinstance(existing, list) and not any(isinstance(e, dict) for e in existing):
                continue  # a list of plain values
            if _allowed_at(base, child) is not None:
                walk(child, child_shown)
            elif _allowed_at(base, (*child, 0)) is not None:
                walk((*child, 0), f"{child_shown}[]")
            else:
                entry = next(iter(existing), "NAME") if isinstance(existing, dict) else "NAME"
                if _allowed_at(base, (*child, entry)) is not None:
                    walk((*child, entry), f"{child_shown}.NAME")

    walk((), "")
    return tuple(keys)


def _lookup(data: Any, path: Path_) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


# What a minimal policy gets for what it leaves out: the defaults, read back.
_MINIMAL_POLICY = """\
version: 1
upstreams: {NAME: {url: "http://127.0.0.1:9001"}}
routes:
  - name: r
    upstream: NAME
    match: {methods: [PUT], path: "/x/{id}"}
    resource: "x:{id}"
    reconcile: {probe: {path: "/x/{id}"}, committed: ["200"], not_committed: ["404"]}
"""


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
        "segments, e.g. `{rest:.*}`); matched against the decoded path",
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
        'how long after dispatch a "not committed" probe answer is believed. Never below '
        "the upstream's `timeout_s` (refused: a write the proxy gave up on may still land); "
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
        "waited longest without a request being handled, or, if every one has a request "
        "being handled, is `503 overloaded`. Keep it above `max_requests`",
        lambda p: p.limits.max_connections,
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


def _default_text(key: Key, minimal: Policy) -> str:
    if isinstance(key.default, str):
        return key.default
    value = key.default(minimal)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


# --- environment variables ---------------------------------------------------------------

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
}
_NAMED_BY_POLICY = (
    "| named by `admin_token_env` (the example: `FENCEPROXY_ADMIN_TOKEN`) | the admin token |\n"
    "| named by `admin_token_next_env` | a second admin token, during a rotation |\n"
    "| named by `auth.clients[].key_env` | that client's key |\n"
)
_ENV_NAME = re.compile(r"FENCEPROXY_[A-Z0-9_]+\Z")


def environment_variables_read() -> set[str]:
    """The `FENCEPROXY_*` names the shipped packages' source spells: each one is read."""
    names = set()
    for package in SHIPPED:
        for source in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and _ENV_NAME.match(node.value)
                ):
                    names.add(node.value)
    return names


# --- the pages ------------------------------------------------------------------------------

GENERATED = "<!-- generated by devtools/docs_reference.py (`make docs`); do not edit -->\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def configuration_page() -> str:
    keys = policy_keys()
    missing = [key for key in keys if key not in CONFIGURATION]
    stale = [key for key in CONFIGURATION if key not in keys]
    if missing or stale:
        raise SystemExit(
            "devtools/docs_reference.py CONFIGURATION is out of step with the policy loader: "
            f"undocumented {missing}, no longer allowed {stale}"
        )
    read = environment_variables_read()
    if read != set(ENVIRONMENT):
        raise SystemExit(
            "devtools/docs_reference.py ENVIRONMENT is out of step with the source: read "
            f"but undocumented {sorted(read - set(ENVIRONMENT))}, documented but not read "
            f"{sorted(set(ENVIRONMENT) - read)}"
        )
    minimal = parse_policy(_MINIMAL_POLICY)
    example = EXAMPLE_POLICY.read_text(encoding="utf-8").rstrip()
    rows = "".join(
        f"| `{key}` | {_default_text(described, minimal)} | {_cell(described.meaning)} |\n"
        for key, described in CONFIGURATION.items()
    )
    environment = "".join(f"| `{name}` | {_cell(ENVIRONMENT[name])} |\n" for name in ENVIRONMENT)
    return (
        f"{GENERATED}\n# Configuration\n\n"
        "One YAML file, the *policy*: `fenceproxy serve --config FILE` (or "
        "`FENCEPROXY_CONFIG`). `fenceproxy check-config FILE` prints every problem at once, "
        "each as `file:line: key.path: message`; an unknown key is one of them. How routes "
        "turn paths into resources: [routes](routes.md).\n\n"
        "## The example (`config/example.yaml`)\n\n"
        f"```yaml\n{example}\n```\n\n"
        "## Every key\n\n"
        "`NAME` stands for an upstream's name, `[]` for each element of a list. A default "
        "in `code` is what the proxy uses when the key is absent.\n\n"
        "| key | default | meaning |\n|---|---|---|\n"
        f"{rows}\n"
        "## Environment variables\n\n"
        "| variable | meaning |\n|---|---|\n"
        f"{environment}{_NAMED_BY_POLICY}\n"
        "A secret's value is taken without surrounding whitespace; a variable that is unset, "
        "empty or whitespace only counts as not set.\n"
    )


def _option_text(action: argparse.Action) -> str:
    if action.option_strings:
        value = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        return ", ".join(f"`{name}{value}`" for name in action.option_strings)
    optional = " (optional)" if action.nargs == "?" else ""
    return f"`{action.metavar or action.dest.upper()}`{optional}"


def _commands(
    parser: argparse.ArgumentParser, prefix: str
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    # argparse has no public way to list a parser's actions; tests/unit/test_cli_help.py
    # walks the same private names, and pins them.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name) or "", sub
                yield from _commands(sub, f"{prefix} {name}")


def cli_page() -> str:
    parser = build_parser()
    parts = [
        f"{GENERATED}\n# CLI\n\n"
        "Every command needs the policy file: `--config FILE`, or `FENCEPROXY_CONFIG=FILE` "
        "in the environment (without either, it stops with `no policy file: pass --config "
        "FILE or set FENCEPROXY_CONFIG`). Every command but `serve` works on the store "
        "directly (so it works while the proxy is down), prints a table or `--json` where "
        "it has one, and exits non-zero with a one-line reason on failure. "
        "`fenceproxy --version` prints the version. With `make run`, "
        "`export FENCEPROXY_CONFIG=state/fenceproxy.yaml`.\n"
    ]
    for name, help_text, sub in _commands(parser, "fenceproxy"):
        rows = [
            f"| {_option_text(action)} | {_cell(action.help or '')}"
            f"{' (required)' if action.required and action.option_strings else ''} |"
            for action in sub._actions
            if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        ]
        # A fixed width: the usage lines must not depend on the terminal that runs this.
        sub.formatter_class = functools.partial(argparse.HelpFormatter, width=88)
        usage = sub.format_usage().removeprefix("usage: ").rstrip()
        described = help_text[:1].upper() + help_text[1:]
        parts.append(f"\n## `{name}`\n\n{described}.\n\n```\n{usage}\n```\n")
        if rows:
            parts.append("\n| argument | meaning |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "".join(parts)


def errors_page() -> str:
    rows = "".join(
        f"| `{code.value}` | {code.status} | {_cell(code.when)} |\n" for code in ErrorCode
    )
    return (
        f"{GENERATED}\n# Error codes\n\n"
        'Every refusal is `application/problem+json` (RFC 9457): `{"type", "title", '
        '"status", "detail", "code", ...context}`, where `type` is '
        "`https://fenceproxy.dev/problems/<code>` and the context names the resource, "
        "epochs or effect ids involved. The worker client raises one exception class per "
        "code ([writing a worker](../how-to/write-a-worker.md)).\n\n"
        "| code | status | when |\n|---|---|---|\n"
        f"{rows}"
    )


def _schema_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    kind = schema.get("type", "object" if "properties" in schema else "any")
    text = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if "enum" in schema:
        text += ": " + ", ".join(f"`{value}`" for value in schema["enum"])
    bounds = [
        f"{label} {schema[name]}"
        for name, label in (
            ("minimum", "≥"),
            ("exclusiveMinimum", ">"),
            ("maximum", "≤"),
            ("minLength", "length ≥"),
            ("maxLength", "length ≤"),
        )
        if name in schema
    ]
    if "pattern" in schema:
        bounds.append(f"pattern `{schema['pattern']}`")
    if bounds:
        text += " (" + ", ".join(bounds) + ")"
    return text


def _fields(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", ()))
    rows = [
        f"| `{name}` | {_cell(_schema_text(field))} | {'yes' if name in required else 'no'} | "
        f"{_cell(field.get('description', ''))} |"
        for name, field in schema.get("properties", {}).items()
    ]
    if not rows:
        return ""
    return "| field | type | required | meaning |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


def openapi_page() -> str:
    spec = document()
    parts = [
        f"{GENERATED}\n# OpenAPI: every operation\n\n"
        f"`GET /_fence/v1/openapi.json` serves this document (OpenAPI {spec['openapi']}); "
        "this page is made from it. The [HTTP API](http-api.md) page says who may call "
        "what.\n\nCredentials, as an operation lists them (`none`: it may be called "
        "without one):\n\n"
        + "".join(
            f"* `{name}`: {scheme.get('description', '')}\n"
            for name, scheme in spec["components"]["securitySchemes"].items()
        )
    ]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            parts.append(f"\n## `{method.upper()} {path}`\n\n")
            if operation.get("summary"):
                parts.append(f"{operation['summary'][0].upper()}{operation['summary'][1:]}.\n\n")
            if operation.get("description"):
                parts.append(f"{operation['description']}\n\n")
            security = operation.get("security")
            if security is not None:
                names = [next(iter(entry), "") or "none" for entry in security]
                parts.append(f"Credentials: {', '.join(f'`{name}`' for name in names)}.\n\n")
            parameters = operation.get("parameters", [])
            if parameters:
                parts.append(
                    "| parameter | in | type | required | meaning |\n|---|---|---|---|---|\n"
                )
                for parameter in parameters:
                    parts.append(
                        f"| `{parameter['name']}` | {parameter['in']} | "
                        f"{_cell(_schema_text(parameter.get('schema', {})))} | "
                        f"{'yes' if parameter.get('required') else 'no'} | "
                        f"{_cell(parameter.get('description', ''))} |\n"
                    )
                parts.append("\n")
            body = operation.get("requestBody")
            if body is not None:
                schema = body["content"]["application/json"]["schema"]
                parts.append("Body (JSON):\n\n" + (_fields(schema) or "`{}`\n") + "\n")
            parts.append("| status | answer |\n|---|---|\n")
            for status, response in operation["responses"].items():
                parts.append(f"| {status} | {_cell(response.get('description', ''))} |\n")
    parts.append("\n## Schemas\n")
    for name, schema in spec["components"]["schemas"].items():
        parts.append(f"\n### {name}\n\n")
        if schema.get("description"):
            parts.append(f"{schema['description']}\n\n")
        parts.append(_fields(schema) or f"```json\n{json.dumps(schema, indent=2)}\n```\n")
    return "".join(parts)


PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": configuration_page,
    "cli.md": cli_page,
    "errors.md": errors_page,
    "openapi.md": openapi_page,
}


def stale_pages() -> dict[str, str]:
    """Each generated page whose checked-in text differs, with the difference."""
    differences = {}
    for name, render in PAGES.items():
        path = REFERENCE / name
        written = path.read_text(encoding="utf-8") if path.exists() else ""
        wanted = render()
        if written != wanted:
            differences[name] = "".join(
                difflib.unified_diff(
                    written.splitlines(keepends=True),
                    wanted.splitlines(keepends=True),
                    f"docs/reference/{name}",
                    "generated",
                )
            )
    return differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="only say which pages differ")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for difference in stale.values():
            sys.stdout.write(difference)
        return 1 if stale else 0
    for name, render in PAGES.items():
        (REFERENCE / name).write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
