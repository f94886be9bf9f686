"""Has the authority lost history? (issue 18 §1)

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
docs/deployment.md, "PostgreSQL standbys and failover", for when that is certain not
to happen and what recovery costs). Recovery (`recovery_statements`) raises every
epoch past anything the old primary could have issued, ends every lease, and opens the
recovery window, in which an idempotency key the store does not know is unknown, not
new (proxy/fenced.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# As `store fence-restore`'s default: more acquisitions and revocations than any one
# resource sees between the last replicated grant and a failover.
FAILOVER_EPOCH_ADVANCE = 1_000_000


@dataclass(frozen=True)
class Position:
    """Where a primary's WAL is: its timeline and its LSN (as a number)."""

    timeline: int
    lsn: int


@dataclass(frozen=True)
class RecoveryWindow:
    """Open since `opened_at` (the store's clock), for `reason`."""

    opened_at: float
    reason: str


def parse_position(walfile: str, lsn: str) -> Position:
    """From `pg_walfile_name(pg_current_wal_lsn())` and `pg_current_wal_lsn()::text`:
    the file name's first 8 hex digits are the timeline; an LSN is `high/low` in hex."""
    high, low = lsn.split("/")
    return Position(int(walfile[:8], 16), (int(high, 16) << 32) + int(low, 16))


def judge(recorded_timeline: int | None, current: Position, seen: Position | None) -> str | None:
    """Why the database may no longer hold everything this store acknowledged, or None.

    `recorded_timeline`: the timeline the store last wrote on (None: never checked, as
    before this check existed); `seen`: the last position this process saw (None: it
    saw none)."""
    wrote_on = recorded_timeline
    if wrote_on is None and seen is not None:
        wrote_on = seen.timeline
    if wrote_on is not None and wrote_on != current.timeline:
        return (
            f"the database is on timeline {current.timeline}, the store wrote on timeline "
            f"{wrote_on}: a standby was promoted or a backup restored, and what "
            "was acknowledged after its branch point may be lost"
        )
    if seen is not None and seen.timeline == current.timeline and current.lsn < seen.lsn:
        return (
            f"the database's WAL went back from {format_lsn(seen.lsn)} to "
            f"{format_lsn(current.lsn)} on timeline {current.timeline}: it was restored "
            "from a copy of its files, and what was acknowledged since may be lost"
        )
    return None


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
