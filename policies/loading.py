"""The policy file into policy objects: `load_policy(path)`, `parse_policy(text)`.

The loader walks PyYAML's node tree (not `safe_load`'s plain values) so that
every problem names its line and key path. It goes on after the first problem
and raises one `ConfigError` listing them all, each as `file:line: key.path:
message`, so nothing ever starts half-configured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from policies.model import (
    DAY_S,
    DEFAULT_RETENTION,
    HOLDER_RE,
    MAX_RESOURCE_CHARS,
    RESOURCE_CHARS,
    RESOURCE_RE,
    Auth,
    AuthClient,
    Idempotency,
    LeaseBounds,
    Limits,
    Listen,
    ListenTLS,
    Outcome,
    Policy,
    Pool,
    Probe,
    Quotas,
    Reconcile,
    Retention,
    Right,
    Route,
    StatusRules,
    StorePool,
    Upstream,
)
from policies.nodes import ConfigError, Mapping, Node, Problem, Problems, compose
from policies.store_backends import StoreBackend, store_backend
from policies.templates import PathTemplate, StringTemplate, TemplateError
from policies.tls import certificates_problem, key_problem

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# Without a `store:` key: a SQLite file in state/ beside the policy file.
DEFAULT_STORE = "sqlite:///state/fenceproxy.db"
_STATUS_PATTERN = re.compile(r"([1-5])xx\Z|([1-5][0-9][0-9])\Z")


def load_policy(path: str | Path) -> Policy:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [Problem(1, "<file>", f"cannot be read: {exc}")]) from exc
    return parse_policy(text, str(path), Path(path).parent)


def parse_policy(text: str, filename: str = "<policy>", base_dir: Path | None = None) -> Policy:
    """`base_dir` is what relative file paths in the policy (TLS files, the SQLite
    store) are relative to: the policy file's folder when loaded from a file, else the
    working directory."""
    base = base_dir if base_dir is not None else Path()
    problems = Problems()
    root = Mapping(
        compose(text, filename),
        problems,
        {
            "version",
            "listen",
            "store",
            "store_pool",
            "admin_token_env",
            "leases",
            "upstreams",
            "routes",
            "retention",
            "limits",
            "quotas",
            "auth",
            "admin_token_next_env",
            "metrics_listen",
        },
    )
    if not root.valid:
        raise ConfigError(filename, problems.items)
    version_node = root.child("version", required=True)
    version = version_node.scalar() if version_node is not None else 1
    if version_node is not None and (isinstance(version, bool) or version != 1):
        problems.add(version_node, f"only version 1 is known, got {version_node.describe()}")
    listen = _parse_listen(root, problems, base)
    store = _parse_store(root, problems, base)
    pool = _parse_store_pool(root, problems)
    admin_env = root.text("admin_token_env", default=None)
    leases = _parse_leases(root, problems)
    upstreams = _parse_upstreams(root, problems, base)
    routes = _parse_routes(root, problems, upstreams)
    retention = _parse_retention(root, problems, routes)
    limits = _parse_limits(root, problems)
    quotas = _parse_quotas(root, problems)
    auth = _parse_auth(root, problems, listen)
    next_admin_env = _env_name(root, "admin_token_next_env", problems)
    metrics_listen = _parse_metrics_listen(root, problems, listen)
    if problems:
        raise ConfigError(filename, problems.items)
    return Policy(
        1,
        listen,
        store,
        admin_env,
        leases,
        upstreams,
        routes,
        pool,
        retention,
        limits,
        quotas,
        auth=auth,
        admin_token_next_env=next_admin_env,
        metrics_listen=metrics_listen,
    )


def _parse_listen(root: Mapping, problems: Problems, base: Path) -> Listen:
    node = root.child("listen")
    if node is None:
        return Listen("127.0.0.1", 8080)
    listen = Mapping(node, problems, {"host", "port", "tls"})
    host = listen.text("host", default="127.0.0.1")
    port = listen.number("port", default=8080, integer=True)
    if isinstance(port, int) and port > 65535:
        problems.add(listen.children["port"], f"not a TCP port: {port}")
    tls = _parse_listen_tls(listen, problems, base)
    return Listen(host or "127.0.0.1", port if isinstance(port, int) else 8080, tls)


def _parse_listen_tls(listen: Mapping, problems: Problems, base: Path) -> ListenTLS | None:
    """`listen.tls: {cert, key, client_ca}`: PEM files, each proven to load here."""
    node = listen.child("tls")
    if node is None:
        return None
    block = Mapping(node, problems, {"cert", "key", "client_ca"})
    if not block.valid:
        return None
    cert = _certificates_file(block, "cert", base, required=True)
    key = _policy_file(block, "key", base, required=True)
    client_ca = _certificates_file(block, "client_ca", base, required=False)
    if cert is None or key is None:
        return None
    tls = ListenTLS(cert, key, client_ca)
    problem = key_problem(tls)
    if problem is not None:
        problems.add(block.children["key"], problem)
    return tls


def _policy_file(block: Mapping, name: str, base: Path, required: bool) -> str | None:
    """A file path under `name`, relative to the policy file's folder."""
    raw = block.text(name) if required else block.text(name, default=None)
    return str((base / raw).absolute()) if raw is not None else None


def _certificates_file(block: Mapping, name: str, base: Path, required: bool) -> str | None:
    path = _policy_file(block, name, base, required)
    problem = certificates_problem(path) if path is not None else None
    if problem is not None:
        block.problems.add(block.children[name], problem)
        return None
    return path


def _parse_metrics_listen(root: Mapping, problems: Problems, main: Listen) -> Listen | None:
    """`metrics_listen: {host, port}`: metrics on a listener of their own."""
    node = root.child("metrics_listen")
    if node is None:
        return None
    block = Mapping(node, problems, {"host", "port"})
    if not block.valid:
        return None
    host = block.text("host", default="127.0.0.1")
    port = block.number("port", integer=True)
    if not isinstance(port, int):
        return None
    if port > 65535:
        problems.add(block.children["port"], f"not a TCP port: {port}")
    elif port != 0 and port == main.port and host == main.host:
        problems.add(block.children["port"], f"{host}:{port} is the main listener's address")
    return Listen(host or "127.0.0.1", port)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}\Z")
# What a resource glob may hold: resource characters and fnmatch's own.
_GLOB = re.compile(rf"[*?\[\]!{RESOURCE_CHARS}]{{1,{MAX_RESOURCE_CHARS}}}\Z")
# The admin token's actor name: a client of that name could not be told apart from it.
RESERVED_CLIENT_NAMES = frozenset({"admin"})


def _env_name(block: Mapping, key: str, problems: Problems) -> str | None:
    name = block.text(key, default=None)
    if name is not None and not _ENV_NAME.match(name):
        problems.add(block.children[key], f"expected an environment variable name, got {name!r}")
        return None
    return name if isinstance(name, str) else None


def _parse_auth(root: Mapping, problems: Problems, listen: Listen) -> Auth | None:
    """`auth: {clients: [{name, key_env | key_sha256 | cert_subject, resources, may}]}`."""
    node = root.child("auth")
    if node is None:
        return None
    block = Mapping(node, problems, {"clients"})
    clients_node = block.child("clients", required=True)
    if clients_node is None:
        return None
    if not clients_node.is_sequence:
        problems.add(clients_node, f"expected a list of clients, got {clients_node.describe()}")
        return None
    clients: list[AuthClient] = []
    names: dict[str, int] = {}
    digests: dict[str, int] = {}
    subjects: dict[str, int] = {}
    for element in clients_node.elements():
        client = _parse_client(element, problems)
        if client is None:
            continue
        if client.cert_subject is not None:
            if listen.tls is None or listen.tls.client_ca is None:
                problems.add(
                    element,
                    "cert_subject needs listen.tls.client_ca: only a client certificate "
                    "verified against it can name a client",
                )
            elif client.cert_subject in subjects:
                problems.add(
                    element,
                    f"cert_subject is also the subject of the client on line "
                    f"{subjects[client.cert_subject]}: a certificate must name one client",
                )
            subjects.setdefault(client.cert_subject, element.line)
        if client.name in names:
            problems.add(
                element, f"client name {client.name!r} is already used on line {names[client.name]}"
            )
        names.setdefault(client.name, element.line)
        if client.key_sha256 is not None:
            if client.key_sha256 in digests:
                problems.add(
                    element,
                    f"key_sha256 is also the key of the client on line "
                    f"{digests[client.key_sha256]}: a key must name one client",
                )
            digests.setdefault(client.key_sha256, element.line)
        clients.append(client)
    if not clients and not problems:
        problems.add(clients_node, "at least one client is needed (or leave auth out)")
    return Auth(tuple(clients))


def _parse_client(node: Node, problems: Problems) -> AuthClient | None:
    spec = Mapping(
        node, problems, {"name", "key_env", "key_sha256", "cert_subject", "resources", "may"}
    )
    if not spec.valid:
        return None
    before = len(problems.items)
    name = spec.text("name")
    if name is not None and not HOLDER_RE.match(name):
        problems.add(
            spec.children["name"],
            f"{name!r} is not a valid client name (1-128 of A-Z a-z 0-9 . _ : @ -)",
        )
    elif name in RESERVED_CLIENT_NAMES:
        problems.add(spec.children["name"], f"{name!r} is the admin token's name")
    key_env = _env_name(spec, "key_env", problems)
    key_sha256 = spec.text("key_sha256", default=None)
    if key_sha256 is not None and not _SHA256_HEX.match(key_sha256):
        problems.add(
            spec.children["key_sha256"],
            'expected the key\'s SHA-256 as 64 hex digits (printf %s "$KEY" | sha256sum)',
        )
    cert_subject = spec.text("cert_subject", default=None)
    if cert_subject is not None and not cert_subject.strip():
        problems.add(spec.children["cert_subject"], "expected a certificate subject's CN")
    credentials = ("key_env", "key_sha256", "cert_subject")
    if sum(key in spec.children for key in credentials) != 1:
        problems.add(node, "a client needs exactly one of key_env, key_sha256 and cert_subject")
    globs = spec.text_list("resources", required=True) or []
    for glob, element in globs:
        if not _GLOB.match(glob):
            problems.add(
                element,
                f"{glob!r} is not a resource glob (resource characters and * ? [ ] !)",
            )
    if "resources" in spec.children and spec.children["resources"].is_sequence and not globs:
        problems.add(spec.children["resources"], "at least one resource glob is needed")
    rights: set[Right] = set()
    known = ", ".join(right.value for right in Right)
    for value, element in spec.text_list("may", required=True) or []:
        try:
            rights.add(Right(value))
        except ValueError:
            problems.add(element, f"unknown right {value!r} (known: {known})")
    if (
        "may" in spec.children
        and spec.children["may"].is_sequence
        and not spec.children["may"].raw.value
    ):
        problems.add(spec.children["may"], f"at least one right is needed ({known})")
    if len(problems.items) > before:
        return None
    assert name is not None
    return AuthClient(
        name=name,
        key_env=key_env,
        key_sha256=key_sha256.lower() if key_sha256 is not None else None,
        resources=tuple(glob for glob, _ in globs),
        may=frozenset(rights),
        line=node.line,
        cert_subject=cert_subject,
    )


# In the query string of a PostgreSQL URL (`?statement_cache_size=0`, `&...`).
_DRIVER_ONLY_PARAMETER = re.compile(r"[?&]statement_cache_size=")


def _parse_store(root: Mapping, problems: Problems, base: Path) -> str:
    store = root.text("store", default=DEFAULT_STORE)
    if store is None:
        return ""
    backend = store_backend(store)
    if backend is None:
        problems.add(
            root.children["store"],
            f"expected sqlite:///PATH or postgresql://..., got {store!r}",
        )
    elif backend is StoreBackend.SQLITE and (
        not store.startswith("sqlite:///") or not store[len("sqlite:///") :].partition("?")[0]
    ):
        problems.add(root.children["store"], f"expected sqlite:///PATH, got {store!r}")
    elif backend is StoreBackend.SQLITE:
        return _sqlite_beside_policy(root, store, base)
    elif backend is StoreBackend.POSTGRESQL and _DRIVER_ONLY_PARAMETER.search(store):
        # asyncpg would send it to the server as a startup parameter, which the server
        # (or a pooler) refuses: it is the driver's, and has its option here.
        problems.add(
            root.children["store"],
            "statement_cache_size is not a connection parameter: "
            "set store_pool.statement_cache: false instead",
        )
    return str(store)


def _sqlite_beside_policy(root: Mapping, store: str, base: Path) -> str:
    """The SQLite URL with a relative path taken from the policy file's folder, as TLS
    files are: the CLI run from any folder then opens the proxy's own store, never a
    new empty one beside the shell. A store found where the working directory would
    have put it (the rule before this one) is a problem naming both places, so that a
    proxy upgraded in place does not start on an empty store."""
    raw, separator, options = store[len("sqlite:///") :].partition("?")
    path = Path(raw)
    if path.is_absolute():
        return store
    beside_policy = (base / path).absolute()
    from_cwd = path.absolute()
    if beside_policy != from_cwd and not beside_policy.exists() and from_cwd.exists():
        node = root.children.get("store", root.node)
        root.problems.add(
            node,
            f"the SQLite path {raw} is read from this file's folder: {beside_policy} does"
            f" not exist, but {from_cwd} (from the working directory) does; write the"
            f" store's path absolute (sqlite:///{from_cwd}) or from this file's folder",
        )
    return f"sqlite:///{beside_policy}{separator}{options}"


def _parse_store_pool(root: Mapping, problems: Problems) -> StorePool:
    node = root.child("store_pool")
    if node is None:
        return StorePool(1, 10)
    pool = Mapping(
        node,
        problems,
        {"min_size", "max_size", "statement_cache", "acquire_timeout_s", "command_timeout_s"},
    )
    low = pool.number("min_size", default=1, minimum=0, integer=True)
    high = pool.number("max_size", default=10, minimum=1, integer=True)
    statement_cache = pool.flag("statement_cache", True)
    acquire_timeout_s = pool.number("acquire_timeout_s", default=5.0, minimum=0.001)
    command_timeout_s = pool.number("command_timeout_s", default=30.0, minimum=0.001)
    if low is None or high is None or acquire_timeout_s is None or command_timeout_s is None:
        return StorePool(1, 10)
    if low > high:
        problems.add(node, f"min_size ({low}) is above max_size ({high})")
    return StorePool(low, high, statement_cache, float(acquire_timeout_s), float(command_timeout_s))


def _parse_leases(root: Mapping, problems: Problems) -> LeaseBounds:
    node = root.child("leases")
    if node is None:
        return LeaseBounds(1, 300, 30)
    leases = Mapping(node, problems, {"min_ttl_s", "max_ttl_s", "default_ttl_s"})
    low = leases.number("min_ttl_s", default=1, minimum=0.001)
    high = leases.number("max_ttl_s", default=300, minimum=0.001)
    default = leases.number("default_ttl_s", default=30, minimum=0.001)
    if None in (low, high, default):
        return LeaseBounds(1, 300, 30)
    if low > high:
        problems.add(node, f"min_ttl_s ({low}) is above max_ttl_s ({high})")
    elif not low <= default <= high:
        problems.add(node, f"default_ttl_s ({default}) is outside [{low}, {high}]")
    return LeaseBounds(float(low), float(high), float(default))


# One retention pass is one transaction: it must stay short (SQLite's writer, and the
# admissions queued behind it, wait for it).
MAX_RETENTION_BATCH = 10_000


def _parse_retention(root: Mapping, problems: Problems, routes: tuple[Route, ...]) -> Retention:
    """`retention: {effects_days, rejections_days, leases_days, batch}`; days may be
    fractional, 0 keeps forever. A receipt is kept at least as long as its key replays (the longest
    `idempotency.retain_s` of a fenced route): the default stretches to it, and a shorter
    `effects_days` is refused."""
    fenced = [route for route in routes if route.fenced]
    longest = max(fenced, key=lambda route: route.idempotency.retain_s, default=None)
    longest_s = longest.idempotency.retain_s if longest is not None else 0.0
    default_effects_s = max(DEFAULT_RETENTION.effects_s, longest_s)
    node = root.child("retention")
    if node is None:
        return replace(DEFAULT_RETENTION, effects_s=default_effects_s)
    block = Mapping(node, problems, {"effects_days", "rejections_days", "leases_days", "batch"})
    if not block.valid:
        return DEFAULT_RETENTION
    effects = block.number("effects_days", default=None)
    rejections = block.number("rejections_days", default=DEFAULT_RETENTION.rejections_s / DAY_S)
    leases = block.number("leases_days", default=DEFAULT_RETENTION.leases_s / DAY_S)
    batch = block.number("batch", default=DEFAULT_RETENTION.batch, minimum=1, integer=True)
    effects_s = default_effects_s if effects is None else float(effects) * DAY_S
    if effects is not None and longest is not None and 0 < effects_s < longest_s:
        problems.add(
            block.children["effects_days"],
            f"{effects:g} days is shorter than idempotency.retain_s of route {longest.name!r} "
            f"({longest_s:g} s = {longest_s / DAY_S:g} days): a receipt is kept as long as "
            f"its key may replay it; use at least {longest_s / DAY_S:g} (or 0: forever)",
        )
    if isinstance(batch, int) and batch > MAX_RETENTION_BATCH:
        problems.add(
            block.children["batch"],
            f"must be at most {MAX_RETENTION_BATCH} (one pass is one transaction), got {batch}",
        )
    return Retention(
        effects_s,
        float(rejections) * DAY_S if rejections is not None else DEFAULT_RETENTION.rejections_s,
        batch if isinstance(batch, int) else DEFAULT_RETENTION.batch,
        float(leases) * DAY_S if leases is not None else DEFAULT_RETENTION.leases_s,
    )


def _parse_limits(root: Mapping, problems: Problems) -> Limits:
    """`limits: {header_timeout_s, body_timeout_s, max_requests, max_connections}`."""
    default = Limits()
    node = root.child("limits")
    if node is None:
        return default
    block = Mapping(
        node,
        problems,
        {"header_timeout_s", "body_timeout_s", "max_requests", "max_connections"},
    )
    if not block.valid:
        return default
    header = block.number("header_timeout_s", default=default.header_timeout_s, minimum=0.001)
    body = block.number("body_timeout_s", default=default.body_timeout_s, minimum=0.001)
    most = block.number("max_requests", default=default.max_requests, minimum=1, integer=True)
    connections = block.number(
        "max_connections", default=default.max_connections, minimum=1, integer=True
    )
    return Limits(
        float(header) if header is not None else default.header_timeout_s,
        float(body) if body is not None else default.body_timeout_s,
        most if isinstance(most, int) else default.max_requests,
        connections if isinstance(connections, int) else default.max_connections,
    )


def _parse_quotas(root: Mapping, problems: Problems) -> Quotas:
    """`quotas: {live_leases, acquires_per_s, burst}`; 0 is unlimited."""
    default = Quotas()
    node = root.child("quotas")
    if node is None:
        return default
    block = Mapping(node, problems, {"live_leases", "acquires_per_s", "burst"})
    if not block.valid:
        return default
    live = _limit(block, "live_leases", default.live_leases, integer=True)
    rate = _limit(block, "acquires_per_s", default.acquires_per_s, integer=False)
    burst = _limit(block, "burst", default.burst, integer=True)
    if burst == 0:
        problems.add(
            block.children["burst"],
            "must be at least 1 (no acquire could pass); acquires_per_s: 0 lifts the rate limit",
        )
        burst = default.burst
    return Quotas(int(live), float(rate), int(burst))


def _limit(block: Mapping, name: str, default: float, integer: bool) -> float:
    """A quota's value (0: unlimited), or its default after a problem. null is refused
    rather than read as unlimited: a key left empty by mistake must not lift a limit."""
    child = block.child(name)
    if child is not None and child.scalar() is None:
        block.problems.add(child, "null is not a limit: give a number, or 0 for unlimited")
        return default
    value = block.number(name, default=default, integer=integer)
    return default if value is None else float(value)


def _parse_pool(upstream: Mapping, problems: Problems) -> Pool:
    """An upstream's `pool: {fenced, pass_through}`: connections per process."""
    default = Pool()
    node = upstream.child("pool")
    if node is None:
        return default
    block = Mapping(node, problems, {"fenced", "pass_through"})
    if not block.valid:
        return default
    fenced = block.number("fenced", default=default.fenced, minimum=1, integer=True)
    passing = block.number("pass_through", default=default.pass_through, minimum=1, integer=True)
    return Pool(
        fenced if isinstance(fenced, int) else default.fenced,
        passing if isinstance(passing, int) else default.pass_through,
    )


def _parse_upstreams(root: Mapping, problems: Problems, base: Path) -> dict[str, Upstream]:
    node = root.child("upstreams", required=True)
    upstreams: dict[str, Upstream] = {}
    if node is None:
        return upstreams
    if not node.is_mapping:
        problems.add(node, f"expected a mapping of upstream names, got {node.describe()}")
        return upstreams
    for name, child in node.items():
        if name in upstreams:
            problems.add(child, "upstream name appears twice")
        upstream = Mapping(
            child, problems, {"url", "timeout_s", "connect_timeout_s", "pool", "ca_bundle"}
        )
        url = upstream.text("url")
        timeout = upstream.number("timeout_s", default=10, minimum=0.001)
        connect = upstream.number("connect_timeout_s", default=2, minimum=0.001)
        if url is not None and not _valid_http_url(url):
            problems.add(upstream.children["url"], f"expected an http(s) URL, got {url!r}")
        if (
            isinstance(timeout, int | float)
            and isinstance(connect, int | float)
            and connect > timeout
        ):
            problems.add(child, f"connect_timeout_s ({connect}) exceeds timeout_s ({timeout})")
        upstreams[name] = Upstream(
            name,
            (url or "").rstrip("/"),
            float(timeout or 10),
            float(connect or 2),
            _parse_pool(upstream, problems),
            _parse_ca_bundle(upstream, url, base),
        )
    if not upstreams:
        problems.add(node, "at least one upstream is needed")
    return upstreams


def _parse_ca_bundle(upstream: Mapping, url: str | None, base: Path) -> str | None:
    """An https upstream's `ca_bundle`: the CAs its certificate must chain to."""
    bundle = _certificates_file(upstream, "ca_bundle", base, required=False)
    if bundle is not None and url is not None and not url.lower().startswith("https://"):
        upstream.problems.add(
            upstream.children["ca_bundle"],
            f"only an https url is verified with a CA bundle, and the url is {url!r}",
        )
    return bundle


def _valid_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _parse_status_rules(
    mapping: Mapping | None, keys: tuple[str, ...], defaults: dict[str, tuple[str, ...]] | None
) -> StatusRules | None:
    """Status lists into rules; `defaults` fills keys that are absent (None: all required)."""
    exact: dict[int, tuple[Outcome, Node | None]] = {}
    classes: dict[int, tuple[Outcome, Node | None]] = {}
    for key in keys:
        outcome = Outcome(key)
        listed = mapping.text_list(key, required=defaults is None) if mapping else None
        entries: list[tuple[str, Node | None]]
        if listed is not None:
            entries = list(listed)
        elif defaults is not None and (mapping is None or mapping.child(key) is None):
            entries = [(value, None) for value in defaults[key]]
        else:
            return None
        for value, node in entries:
            found = _STATUS_PATTERN.match(value)
            target = exact if found and found.group(2) else classes
            if found is None:
                if mapping is not None and node is not None:
                    mapping.problems.add(node, f"expected a status like 404 or 5xx, got {value!r}")
                continue
            code = int(found.group(2) or found.group(1))
            if code in target and target[code][0] is not outcome:
                if mapping is not None and node is not None:
                    mapping.problems.add(node, f"{value} is mapped to two outcomes")
                continue
            target[code] = (outcome, node)
    return StatusRules(
        tuple((code, outcome) for code, (outcome, _) in sorted(exact.items())),
        tuple((code, outcome) for code, (outcome, _) in sorted(classes.items())),
        Outcome.UNKNOWN,
    )


_DEFAULT_OUTCOMES = {"committed": ("2xx",), "not_committed": ("4xx",), "unknown": ("408", "5xx")}


def _parse_reconcile(node: Node, problems: Problems, route: _RouteDraft) -> Reconcile | None:
    block = Mapping(node, problems, {"probe", "committed", "not_committed", "settle_s", "attempts"})
    if not block.valid:
        return None
    probe_node = block.child("probe", required=True)
    probe = None
    if probe_node is not None:
        spec = Mapping(probe_node, problems, {"method", "path"})
        method = spec.choice("method", ("GET", "HEAD"), "GET")
        path_raw = spec.text("path")
        if path_raw is not None:
            try:
                template = StringTemplate.parse(path_raw)
            except TemplateError as exc:
                problems.add(spec.children["path"], str(exc))
            else:
                known = set(route.params) | {"idempotency_key"}
                for name in template.names:
                    if name not in known:
                        problems.add(
                            spec.children["path"],
                            f"{{{name}}} is neither a path parameter of the route "
                            "nor {idempotency_key}",
                        )
                if not path_raw.startswith("/"):
                    problems.add(spec.children["path"], "the probe path must start with '/'")
                if "idempotency_key" in template.names and not route.idempotency_required:
                    problems.add(
                        spec.children["path"],
                        "{idempotency_key} needs idempotency.required: true on the route",
                    )
                probe = Probe(method, template)
    rules = _parse_status_rules(block, ("committed", "not_committed"), None)
    # settle_s says "after this long since dispatch the upstream will not apply the write
    # any more". The upstream may still apply a write the proxy gave up on at its timeout,
    # so a window shorter than the timeout contradicts the timeout itself: a "not found"
    # inside it would free the key of a write still on its way (a second order).
    timeout_s = route.upstream.timeout_s if route.upstream else 0.0
    settle = block.number("settle_s", default=timeout_s)
    if settle is not None and route.upstream is not None and settle < timeout_s:
        problems.add(
            block.children["settle_s"],
            f"settle_s ({settle:g}) is below upstream {route.upstream.name}'s timeout_s "
            f"({timeout_s:g}): a write that timed out may still land after a 'not found'; "
            f"use at least {timeout_s:g}",
        )
        settle = None
    attempts = block.number("attempts", default=5, minimum=1, integer=True)
    if probe is None or rules is None or settle is None or attempts is None:
        return None
    return Reconcile(probe, rules, float(settle), int(attempts))


@dataclass
class _RouteDraft:
    params: tuple[str, ...]
    idempotency_required: bool
    upstream: Upstream | None


_ROUTE_KEYS = {
    "name",
    "upstream",
    "match",
    "resource",
    "fence",
    "forward_fence_headers",
    "max_body_bytes",
    "max_in_flight",
    "idempotency",
    "outcomes",
    "reconcile",
    "upstream_idempotent",
}


@dataclass(frozen=True)
class _Matcher:
    """What a route matches, for the ambiguity check."""

    name: str
    methods: frozenset[str]
    path: PathTemplate
    node: Node


def _parse_route(
    node: Node, problems: Problems, upstreams: dict[str, Upstream], matchers: list[_Matcher]
) -> Route | None:
    spec = Mapping(node, problems, _ROUTE_KEYS)
    if not spec.valid:
        return None
    before = len(problems.items)
    name = spec.text("name")
    upstream_name = spec.text("upstream")
    upstream = upstreams.get(upstream_name) if upstream_name else None
    if upstream_name is not None and upstream is None:
        defined = ", ".join(sorted(upstreams)) or "none"
        problems.add(
            spec.children["upstream"],
            f"upstream {upstream_name!r} is not defined (defined: {defined})",
        )
    methods, path = _parse_match(spec, problems)
    if methods and path is not None:
        matchers.append(_Matcher(name or node.key, methods, path, node))
    fenced = spec.choice("fence", ("required", "none"), "required") == "required"
    resource = None
    resource_raw = spec.text("resource", default=None)
    if resource_raw is not None:
        try:
            resource = StringTemplate.parse(resource_raw)
        except TemplateError as exc:
            problems.add(spec.children["resource"], str(exc))
        else:
            if path is not None:
                for missing in (n for n in resource.names if n not in path.params):
                    problems.add(
                        spec.children["resource"],
                        f"{{{missing}}} is not a parameter of path {path.raw!r} "
                        f"(parameters: {', '.join(path.params) or 'none'})",
                    )
            unseparated = resource.unseparated()
            if unseparated is not None:
                first, second = unseparated
                problems.add(
                    spec.children["resource"],
                    f"{{{first}}} and {{{second}}} have no separator between them, so two "
                    "paths could render one resource; put one of . _ : @ / + = - between them",
                )
            sample = resource.render({n: "x" for n in resource.names})
            if not RESOURCE_RE.match(sample):
                problems.add(
                    spec.children["resource"],
                    f"{resource_raw!r} cannot render a valid resource name "
                    "(1-256 of A-Z a-z 0-9 . _ : @ / + = -)",
                )
    elif fenced:
        problems.add(node, "a fenced route (fence: required) needs a 'resource' template")
    forward = spec.flag("forward_fence_headers", False)
    max_body = spec.number("max_body_bytes", default=1_048_576, minimum=0, integer=True)
    max_in_flight = spec.number("max_in_flight", default=1, minimum=1, integer=True)
    idempotency = _parse_idempotency(spec, problems)
    upstream_idempotent = spec.flag("upstream_idempotent", False)
    if upstream_idempotent and not idempotency.required:
        problems.add(
            spec.children["upstream_idempotent"],
            "upstream_idempotent needs idempotency.required: true (a resend is matched by key)",
        )
    outcomes_node = spec.child("outcomes")
    outcomes = _parse_status_rules(
        Mapping(outcomes_node, problems, set(_DEFAULT_OUTCOMES)) if outcomes_node else None,
        tuple(_DEFAULT_OUTCOMES),
        _DEFAULT_OUTCOMES,
    )
    reconcile_node = spec.child("reconcile")
    reconcile = None
    if reconcile_node is not None:
        if not fenced:
            problems.add(reconcile_node, "reconcile only applies to fenced routes")
        draft = _RouteDraft(path.params if path else (), idempotency.required, upstream)
        reconcile = _parse_reconcile(reconcile_node, problems, draft)
    if len(problems.items) > before:
        return None
    assert name and upstream and methods and path and outcomes
    return Route(
        name=name,
        upstream=upstream,
        methods=methods,
        path=path,
        resource=resource,
        fenced=fenced,
        forward_fence_headers=forward,
        max_body_bytes=max_body,
        max_in_flight=max_in_flight,
        idempotency=idempotency,
        outcomes=outcomes,
        reconcile=reconcile,
        upstream_idempotent=upstream_idempotent,
    )


def _parse_match(spec: Mapping, problems: Problems) -> tuple[frozenset[str], PathTemplate | None]:
    node = spec.child("match", required=True)
    if node is None:
        return frozenset(), None
    match = Mapping(node, problems, {"methods", "path"})
    methods: set[str] = set()
    for value, element in match.text_list("methods", required=True) or ():
        if value.upper() not in HTTP_METHODS:
            problems.add(element, f"unknown HTTP method {value!r}")
        methods.add(value.upper())
    if match.valid and "methods" in match.children and not methods:
        problems.add(match.children["methods"], "at least one method is needed")
    raw = match.text("path")
    path = None
    if raw is not None:
        try:
            path = PathTemplate.parse(raw)
        except TemplateError as exc:
            problems.add(match.children["path"], f"{exc} in {raw!r}")
    return frozenset(methods), path


def _parse_idempotency(spec: Mapping, problems: Problems) -> Idempotency:
    node = spec.child("idempotency")
    if node is None:
        return Idempotency(False, 86400)
    block = Mapping(node, problems, {"required", "retain_s"})
    retain = block.number("retain_s", default=86400, minimum=1)
    return Idempotency(block.flag("required", False), float(retain or 86400))


def _parse_routes(
    root: Mapping, problems: Problems, upstreams: dict[str, Upstream]
) -> tuple[Route, ...]:
    node = root.child("routes", required=True)
    if node is None:
        return ()
    if not node.is_sequence:
        problems.add(node, f"expected a list of routes, got {node.describe()}")
        return ()
    routes: list[tuple[Route, Node]] = []
    names: dict[str, int] = {}
    # Every route whose match parsed, valid or not otherwise: an ambiguity is reported
    # with the file's other problems, not only once they are fixed.
    matchers: list[_Matcher] = []
    for element in node.elements():
        route = _parse_route(element, problems, upstreams, matchers)
        if route is None:
            continue
        if route.name in names:
            problems.add(
                element,
                f"route name {route.name!r} is already used on line {names[route.name]}",
            )
        names.setdefault(route.name, element.line)
        routes.append((route, element))
    for index, matcher in enumerate(matchers):
        for earlier in matchers[:index]:
            shared = matcher.methods & earlier.methods
            witness = matcher.path.overlaps(earlier.path) if shared else None
            if witness is not None:
                problems.add(
                    matcher.node,
                    f"route {matcher.name!r} and route {earlier.name!r} (line "
                    f"{earlier.node.line}) both match {sorted(shared)[0]} {witness}; "
                    "matching would be ambiguous",
                )
    if not routes and not problems:
        problems.add(node, "at least one route is needed")
    return tuple(route for route, _ in routes)
