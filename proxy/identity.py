"""Which store this proxy instance last used, remembered outside the store.

Epochs must never restart below ones already acknowledged. A store that was
deleted and created again empty, replaced by another file or database, or
restored from an old backup hands out epochs from wherever its records stand,
and it cannot tell by itself: an empty store looks like a new one. So every
store has a random id created with its schema (`store_identity`), and every
proxy instance keeps, in a small file of its own (`fenceproxy-instance-<id>.json`
in the state directory), the id of the store it last started on. At start:

* no file: the instance's first start; the store's id is recorded;
* the same id: a restart; recorded again (with the start time);
* another id: refused, with one line naming the situation, unless the store was
  fenced by `fenceproxy store fence-restore` after this instance last started
  (every epoch is then past anything issued before) or `serve --new-store` says to
  start on it as it is.

The file must not live with the store's own files (`rm state/fenceproxy.db*` must
not take it along): by default it is in the SQLite database's directory under its
own name, or, for PostgreSQL, in the configuration file's directory;
`serve --state-dir` or FENCEPROXY_STATE_DIR choose another.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from policies.store_backends import StoreBackend, store_backend
from store import Store, StoreError, StoreIdentity
from store.sqlite import parse_sqlite_url

STATE_DIR_ENV = "FENCEPROXY_STATE_DIR"


class StoreIdentityRefused(StoreError):
    """The store is not the one this instance last used; starting could reissue epochs."""


@dataclass(frozen=True)
class IdentityCheck:
    """What `serve` asks of the start: where the instance's memory is, and whether the
    operator said to accept whatever store is there (`--new-store`)."""

    memory: Path
    new_store: bool = False


def memory_file(state_dir: Path, instance_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", instance_id)
    return state_dir / f"fenceproxy-instance-{safe}.json"


def default_state_dir(store_url: str, config_path: str | None) -> Path:
    """The SQLite database's directory, or the configuration file's for PostgreSQL."""
    if store_backend(store_url) is StoreBackend.SQLITE:
        return parse_sqlite_url(store_url)[0].parent
    return Path(config_path).parent if config_path else Path("state")


def redacted(store_url: str) -> str:
    """The store URL without a password, fit for a file and a log line."""
    parts = urlsplit(store_url)
    if parts.password is None:
        return store_url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}"))


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


def _read(memory: Path) -> dict[str, object] | None:
    try:
        text = memory.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read this instance's store memory {memory}: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("store_id"), str):
        raise StoreError(f"{memory} is not a fenceproxy instance memory; move it away to go on")
    return data


def _write(memory: Path, data: dict[str, object]) -> None:
    """Atomically, and durably: a crash leaves the old memory or the new one."""
    try:
        memory.parent.mkdir(parents=True, exist_ok=True)
        partial = memory.with_name(f".{memory.name}.partial")
        with partial.open("w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, memory)
        directory = os.open(memory.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as exc:
        raise StoreError(f"cannot record the store's identity in {memory}: {exc}") from exc


def refusal(store_label: str, instance_id: str, remembered: str, found: StoreIdentity) -> str:
    return (
        f"the store {store_label} (store id {found.store_id}, created {_when(found.created_at)}) "
        f"is not the store {remembered} that instance {instance_id} last used: it was deleted, "
        "replaced or recreated, and its epochs could restart below acknowledged ones; run "
        "`fenceproxy store fence-restore` on it, or start with `serve --new-store` to accept it"
    )


async def check_store_identity(
    store: Store, check: IdentityCheck, store_url: str
) -> StoreIdentity | None:
    """Refuse (StoreIdentityRefused) a store this instance does not know; otherwise
    remember it. Returns the identity this instance used before, if another."""
    found = await store.identity()
    started_at = await store.now()
    remembered = _read(check.memory)
    previous: StoreIdentity | None = None
    if remembered is not None and remembered["store_id"] != found.store_id:
        last_start = remembered.get("started_at")
        fenced_since = (
            found.fenced_at is not None
            and isinstance(last_start, int | float)
            and found.fenced_at >= last_start
        )
        if not (check.new_store or fenced_since):
            raise StoreIdentityRefused(
                refusal(redacted(store_url), store.instance_id, str(remembered["store_id"]), found)
            )
        previous = StoreIdentity(str(remembered["store_id"]), 0.0, None)
    _write(
        check.memory,
        {
            "instance_id": store.instance_id,
            "store": redacted(store_url),
            "store_id": found.store_id,
            "started_at": started_at,
        },
    )
    return previous
