"""Which releases may share one store: the rule of rolling upgrades, as pure functions.

Migrations expand first: a migration adds (a table, a column with a default or NULL, an
index, a function under a new name) and every release that worked on the schema before
still works on it after. What a newer release no longer needs is removed later, by a
*contraction*: a migration whose first lines declare the oldest release that still works
once it is applied,

    -- oldest release: 0.3.0

and that the release shipping it may apply only when no replica older than that is
running. The store keeps the contractions applied (`schema_contractions`), so:

* the schema's **floor** is the highest oldest release its contractions declare: a
  release below it refuses to start on the store (it would run SQL on what is gone);
* a migrating replica refuses to apply a contraction while a replica below its oldest
  release has been seen in the last `PEER_WINDOW_S` (the old one would break under it);
* each release serves beside the releases from `OLDEST_PEER` on (and may be rolled back
  to them while the schema's floor allows): it refuses to start while an older replica
  has been seen in the last `PEER_WINDOW_S`, and each replica records its own
  `OLDEST_PEER` in its row of `replicas`, so that an older release that knows this rule
  refuses to start beside a newer one that cannot serve beside it.

A version that does not parse (a checkout never installed says "unknown") cannot be
compared: it is never the reason for a refusal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# The oldest release this one serves beside on one store, and may be rolled back to.
# Raised when a release stops working beside an older one (it writes what the older one
# misreads, or it ships a contraction); never above this release's own version.
OLDEST_PEER = "0.1.0"
# A replica writes its row in `replicas` every 5 s (reconcile.prober): one seen within
# this window is taken to be running.
PEER_WINDOW_S = 30.0

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_DECLARATION = re.compile(r"^-- oldest release: (\S+)\s*$", re.MULTILINE)


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a release's version, or None if it is not one."""
    match = _VERSION.fullmatch(text or "")
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def older(version: str | None, than: str | None) -> bool:
    """Whether `version` is a release before `than`; False when either cannot be told."""
    mine, theirs = parse_version(version), parse_version(than)
    return mine is not None and theirs is not None and mine < theirs


def declared_oldest_release(sql: str) -> str | None:
    """What a migration declares with `-- oldest release: X.Y.Z` among its first comment
    lines, or None (an expansion). A declaration that is not a version is an error: a
    contraction that nothing would enforce."""
    head = []
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        head.append(line)
    match = _DECLARATION.search("\n".join(head))
    if match is None:
        return None
    if parse_version(match.group(1)) is None:
        raise ValueError(f"'-- oldest release: {match.group(1)}' is not a version (X.Y.Z)")
    return match.group(1)


@dataclass(frozen=True)
class Peer:
    """Another replica on the store, as its row in `replicas` says."""

    instance_id: str
    version: str
    oldest_peer: str | None  # None: a release from before this rule


@dataclass(frozen=True)
class Contraction:
    """An applied migration that declared the oldest release able to use the schema."""

    migration: int
    name: str
    oldest_release: str


def schema_floor(contractions: Iterable[Contraction]) -> Contraction | None:
    """The contraction with the highest oldest release: the schema's floor."""
    floor: Contraction | None = None
    for contraction in contractions:
        if floor is None or older(floor.oldest_release, contraction.oldest_release):
            floor = contraction
    return floor


def start_refusal(
    release: str, oldest_peer: str, contractions: Iterable[Contraction], peers: Iterable[Peer]
) -> str | None:
    """Why a replica of `release` (serving beside `oldest_peer` and later) must not start
    on a store with these contractions beside these running peers, or None."""
    floor = schema_floor(contractions)
    if floor is not None and older(release, floor.oldest_release):
        return (
            f"the store's schema needs fenceproxy {floor.oldest_release} or later (migration "
            f"{floor.migration:04d} {floor.name}); this is {release}: start a newer release, "
            "or restore the backup taken before that migration"
        )
    for peer in peers:
        if older(peer.version, oldest_peer):
            return (
                f"replica {peer.instance_id} runs fenceproxy {peer.version}, and {release} "
                f"serves beside {oldest_peer} or later only: upgrade or stop it first "
                f"(a replica counts as running for {PEER_WINDOW_S:g} s after its last beat)"
            )
        if older(release, peer.oldest_peer):
            return (
                f"replica {peer.instance_id} runs fenceproxy {peer.version}, which serves "
                f"beside {peer.oldest_peer} or later only; this is {release}: start "
                f"{peer.oldest_peer} or later"
            )
    return None


def contraction_refusal(
    migration: int, name: str, oldest_release: str, peers: Iterable[Peer]
) -> str | None:
    """Why migration `migration` (a contraction to `oldest_release`) must not be applied
    beside these running peers, or None."""
    behind = sorted(
        (p for p in peers if older(p.version, oldest_release)), key=lambda p: p.instance_id
    )
    if not behind:
        return None
    names = ", ".join(f"{p.instance_id} ({p.version})" for p in behind)
    return (
        f"migration {migration:04d} {name} removes what releases before {oldest_release} "
        f"use, and these replicas run one: {names}; upgrade them first (a replica counts "
        f"as running for {PEER_WINDOW_S:g} s after its last beat)"
    )
