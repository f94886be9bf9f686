"""Has the authority lost history?

A promoted asynchronous standby holds only the WAL it had received: grants and
receipts acknowledged by the old primary after that point are gone, and a store that
went on as if nothing happened would issue their epochs again and forward their keys
again. PostgreSQL says when this may have happened without superuser rights:

- the timeline. A promoted standby, and a point-in-time restore, start a new one. The
  store records the timeline it writes on (store_meta.history_timeline); a database
  on another one is a different history. `pg_walfile_name(pg_current_wal_lsn())`
  names it at once (its first 8 hex digits), executable by any role and on the
  managed services that expose the WAL functions; `pg_control_checkpoint()` names it
  only after the first checkpoint on the new timeline.
- the WAL position. Within one process, the position only grows on one timeline: a
  position behind one seen before is the database restored from a copy of its files
  (a volume snapshot), which keeps the timeline.

Whether the branch point came after everything acknowledged cannot be told from the
new primary alone, so a new timeline is always treated as lost history (see
docs/how-to/deployment.md, "PostgreSQL standbys and failover", for when that is certain not
to happen and what recovery costs). Recovery (`recovery_statements`) raises every
epoch past anything the old primary could have issued, ends every lease, and opens the
recovery window, in which an idempotency key the store does not know is unknown, not
new (proxy/fenced.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# As `store fence-restore`'s default: more acquisitions and revocations than any one
# resource sees between the last replicated grant and a failover.
FAILOVER_EPOCH_ADVANCE = 1_000_000


@dataclass(frozen=True)
class Position:
    """Where a primary's history is: its timeline, its WAL position (an LSN, as a
    number) and a transaction id (`xid`): of a position told by the server, the next it
    will issue; of one seen, one past the newest this process committed (0: none)."""

    timeline: int
    lsn: int
    xid: int = 0


@dataclass(frozen=True)
class RecoveryWindow:
    """Open since `opened_at` (the store's clock), for `reason`."""

    opened_at: float
    reason: str


# Commits wait for a synchronous standby only with these (and a non-empty
# synchronous_standby_names); `local` and `off` never wait for one.
_WAITING_COMMITS = frozenset({"on", "remote_apply", "remote_write"})
DOCS = 'docs/how-to/deployment.md, "PostgreSQL standbys and failover"'


@dataclass(frozen=True)
class Replication:
    """What the primary says of its standbys, as any role sees it: how many stream from
    it (pg_stat_replication's rows), the settings that make commits wait for them, and
    each one's sync_state (None where the role lacks pg_read_all_stats)."""

    standbys: int
    synchronous_standby_names: str
    synchronous_commit: str
    sync_states: tuple[str | None, ...] = ()

    @property
    def commits_wait(self) -> bool:
        return (
            self.synchronous_commit in _WAITING_COMMITS
            and self.synchronous_standby_names.strip() != ""
        )

    def warning(self) -> str | None:
        """Why a failover to a standby may lose acknowledged writes, or None."""
        if self.standbys == 0:
            return None
        if not self.commits_wait:
            why = (
                "synchronous_standby_names is empty"
                if self.synchronous_standby_names.strip() == ""
                else f"synchronous_commit is {self.synchronous_commit}"
            )
            return (
                f"{self.standbys} standby(s) replicate the store asynchronously ({why}): a "
                "failover to one may lose acknowledged grants and writes; the store then "
                "recovers (every epoch raised, every lease ended, keys it lost refused in "
                f"the recovery window): see {DOCS}"
            )
        lagging = [state for state in self.sync_states if state in ("async", "potential")]
        if lagging:
            return (
                f"{len(lagging)} of {self.standbys} standbys are not synchronous "
                f"(sync_state {', '.join(sorted(set(lagging)))}): promote only a synchronous "
                f"one, or the store recovers as after a loss: see {DOCS}"
            )
        return None

    def as_json(self) -> dict[str, object]:
        return {
            "standbys": self.standbys,
            "synchronous_standby_names": self.synchronous_standby_names,
            "synchronous_commit": self.synchronous_commit,
            "sync_states": list(self.sync_states),
            "warning": self.warning(),
        }


def replication_of(row: Mapping[str, Any]) -> Replication | None:
    """From a row with `standbys`, `sync_states`, `synchronous_standby_names` and
    `synchronous_commit` (NULL on SQLite, which has no standby)."""
    if row["standbys"] is None:
        return None
    return Replication(
        int(row["standbys"]),
        str(row["synchronous_standby_names"]),
        str(row["synchronous_commit"]),
        tuple(row["sync_states"] or ()),
    )


def parse_position(walfile: str, lsn: str) -> Position:
    """From `pg_walfile_name(pg_current_wal_lsn())` and `pg_current_wal_lsn()::text`:
    the file name's first 8 hex digits are the timeline; an LSN is `high/low` in hex."""
    high, low = lsn.split("/")
    return Position(int(walfile[:8], 16), (int(high, 16) << 32) + int(low, 16))


def judge(recorded_timeline: int | None, current: Position, seen: Position | None) -> str | None:
    """Why the database may no longer hold everything this store acknowledged, or None.

    `recorded_timeline`: the timeline the store last wrote on (None: never checked, as
    before this check existed); `seen`: the last position this process saw (None: it
    saw none). Any timeline but the last one this process saw is lost history, a move
    back to an older one included (an old primary that came back, never rewound: it
    lacks all that was written on the newer one). On the timeline it saw, a position
    behind the one it saw is a restore from a copy of the files (a volume snapshot)."""
    if seen is not None and seen.timeline != current.timeline:
        return (
            f"the database is on timeline {current.timeline}, this replica last saw timeline "
            f"{seen.timeline}: a standby was promoted, an old primary came back or a backup "
            "was restored, and what was acknowledged on the other may be lost"
        )
    if recorded_timeline is not None and recorded_timeline != current.timeline:
        return (
            f"the database is on timeline {current.timeline}, the store wrote on timeline "
            f"{recorded_timeline}: a standby was promoted or a backup restored, and what "
            "was acknowledged after its branch point may be lost"
        )
    if seen is not None and current.lsn < seen.lsn:
        return (
            f"the database's WAL went back from {format_lsn(seen.lsn)} to "
            f"{format_lsn(current.lsn)} on timeline {current.timeline}: it was restored "
            "from a copy of its files, and what was acknowledged since may be lost"
        )
    if seen is not None and current.xid < seen.xid:
        return (
            f"the database went back: its next transaction id is {current.xid}, and "
            f"transaction {seen.xid - 1} committed on it (timeline {current.timeline}): it "
            "was restored from a copy of its files, and what was acknowledged since may "
            "be lost"
        )
    return None


@dataclass(frozen=True)
class Server:
    """The server a recovery was made on: its timeline and when its postmaster started
    (the store's record, store_meta.history_timeline and history_server_started)."""

    timeline: int
    started: float


def recovered_on(recorded: Server | None, now: Server) -> bool:
    """Was the loss a replica found recovered already, by another replica, on the
    server as it is now? Only a recovery made on this very server since it last
    changed counts: a promotion changes its timeline, and a restore in place or an old
    primary coming back restart it. An open recovery window does not count: a restore
    brings back the window of its snapshot, with the floors of that time."""
    return recorded == now


NOTICE = "fenceproxy history "


def parse_notice(message: str) -> tuple[Position, Position] | None:
    """What `fenceproxy_history_position()` tells (migration 0018), or None for any other
    notice: the position to judge (the inserted WAL, the next transaction id) and the
    one to keep (the flushed WAL, one past the transaction's own id if it has one)."""
    if not message.startswith(NOTICE):
        return None
    walfile, flushed, inserted, next_xid, own_xid = message[len(NOTICE) :].split()
    judged = parse_position(walfile, inserted)
    kept = parse_position(walfile, flushed)
    own = int(own_xid)
    return (
        Position(judged.timeline, judged.lsn, int(next_xid)),
        Position(kept.timeline, kept.lsn, own + 1 if own else 0),
    )


def advance(seen: Position | None, current: Position) -> Position:
    """The position kept once `current` was judged no loss: the newest WAL position and
    transaction id on its timeline (after a recovery, the position recovered at)."""
    if seen is None or seen.timeline != current.timeline:
        return current
    return Position(current.timeline, max(seen.lsn, current.lsn), max(seen.xid, current.xid))


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
