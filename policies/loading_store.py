"""A policy file's store: its URL, its connection pool, and how long it keeps what it
records (`retention`)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from policies.keys import DAY_S
from policies.model import (
    DEFAULT_RETENTION,
    Retention,
    Route,
    StorePool,
)
from policies.nodes import Mapping, Problems
from policies.store_backends import StoreBackend, store_backend

# In the query string of a PostgreSQL URL (`?statement_cache_size=0`, `&...`).
_DRIVER_ONLY_PARAMETER = re.compile(r"[?&]statement_cache_size=")
# Without a `store:` key: a SQLite file in state/ beside the policy file.
DEFAULT_STORE = "sqlite:///state/fenceproxy.db"


def parse_store(root: Mapping, problems: Problems, base: Path) -> str:
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
        not store.startswith("sqlite:///")
        or not store[len("sqlite:///") :].partition("?")[0]
        or "\0" in store  # no file name holds one; sqlite3.connect raises ValueError
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


def parse_store_pool(root: Mapping, problems: Problems) -> StorePool:
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


# One retention pass is one transaction: it must stay short (SQLite's writer, and the
# admissions queued behind it, wait for it).
MAX_RETENTION_BATCH = 10_000


def parse_retention(root: Mapping, problems: Problems, routes: tuple[Route, ...]) -> Retention:
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
