"""The job table the MCP server and its worker processes share: one SQLite file in --state.

A job is claimed in one transaction: eligible is a pending job, or a running one whose
claim has expired (its worker stalled). A worker process that exited gives its claim
back at once (`worker_gone`); a job that fails the same way MAX_SAME_FAILURES times in
a row (a worker error, a worker that dies) is `failed` with that reason. Every claim bumps the job's
`generation` and appends an attempt row; a worker writes its attempt row freely, but
changes the job row only while its generation is the job's current one, so a worker
that was replaced can never overwrite its successor's outcome.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

DB_NAME: Final = "jobs.db"
BUSY_TIMEOUT_MS: Final = 5000
# A job sent back to pending waits this long before it can be claimed again, so that
# a proxy that is down is not asked again in a tight loop by every worker.
RETRY_DELAY_S: Final = 1.0

# What a job's current claim concluded from its attempt's outcome.
PENDING: Final = "pending"
RUNNING: Final = "running"
DONE: Final = "done"
BLOCKED: Final = "blocked"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
STATES: Final = (PENDING, RUNNING, DONE, BLOCKED, FAILED, CANCELLED)

# A job's write whose answer was lost on its way back (a reset, a connection closed
# before the answer) and that the proxy could not be asked about under the job's key:
# it may have been applied, so the job is blocked, never "nothing was done".
ANSWER_LOST: Final = "answer_lost"

# Attempts that end this way are tried again, but not forever: a worker that raises on
# an answer it cannot read, or dies, would do so on every claim.
COUNTED_FAILURES: Final = frozenset({"worker_error", "worker_exited"})
MAX_SAME_FAILURES: Final = 3
# How often a blocked job looks again whether its effect was settled (by default).
BLOCKED_RECHECK_S: Final = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    rule_id TEXT NOT NULL,
    route_to TEXT NOT NULL,
    state TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    claimed_by TEXT,
    claim_expires_at REAL,
    retry_at REAL,
    rule_read TEXT,
    result TEXT,
    retried_generation INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, created_at);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL REFERENCES jobs (job_id),
    generation INTEGER NOT NULL,
    worker TEXT NOT NULL,
    pid INTEGER NOT NULL,
    epoch INTEGER,
    phase TEXT NOT NULL,
    outcome TEXT,
    detail TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    PRIMARY KEY (job_id, generation)
);
"""


@dataclass(frozen=True)
class Claim:
    """One worker's turn at a job: valid while `generation` is the job's current one."""

    job_id: str
    rule_id: str
    route_to: str
    generation: int
    worker: str


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, and the state it leaves the job in if the claim is current."""

    outcome: str  # written, stale_epoch, lease_expired, outcome_unknown, ...
    job_state: str
    detail: str | None = None
    effect_id: str | None = None  # the job's own write in doubt, when it is blocked on it
    # Its probe schedule as the proxy had it when the job blocked, when it could be read:
    # {"next_probe_at": T} (the proxy's clock) or {"next_probe_at": None} (none scheduled).
    probe_schedule: dict[str, float | None] | None = None


@dataclass(frozen=True)
class BlockedJob:
    """A blocked job due to look again at the settlement it waits for."""

    job_id: str
    rule_id: str
    generation: int
    effect_id: str | None  # None: blocked by someone else's effect; nothing was written


def _utc(at: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


def blocked_next_step(
    effect_id: str | None, recheck_at: float | None, result: dict[str, Any] | None = None
) -> str:
    """What a blocked job's result says happens next, for the model to relay; `result`
    is the job's result, whose `next_probe_at` (when present) is the probe schedule."""
    looks_again = "It looks again at the settlement periodically"
    if recheck_at is not None:
        looks_again += f" (next at {_utc(recheck_at)})"
    looks_again += ", or at once with retry_job."
    if effect_id is None and result is not None and result.get("outcome") == ANSWER_LOST:
        return (
            "The answer to this job's write was lost on its way back: the write may or may"
            " not have been applied, and it will not be sent as a new write. It was sent"
            " with the job's id as its Idempotency-Key, so the proxy's record of that key"
            " says which: once nothing on the rule is in doubt at the proxy, the job runs"
            " again under the same key, done if the proxy has its write applied, written"
            " once if not. " + looks_again
        )
    if effect_id is None:
        return (
            "Nothing of this job was sent. Another write to the rule is in doubt at the"
            " proxy; once it is settled, this job runs. " + looks_again
        )
    resolve = (
        f"`fenceproxy reconcile resolve {effect_id} --outcome committed --reason ...`"
        " (or `--outcome not-committed`)"
    )
    schedule = {} if result is None else result
    if "next_probe_at" not in schedule:
        settles = (
            "the proxy settles it by probe if the route has one; otherwise an operator"
            f" checks the upstream and runs {resolve}."
        )
    elif (probe_at := schedule["next_probe_at"]) is None:
        settles = (
            "the proxy has no probe scheduled for it (the route has none, or its probes"
            f" gave up), so an operator must check the upstream and run {resolve}."
        )
    else:
        settles = (
            f"the proxy asks the upstream about it at {_utc(probe_at)} (its probe) and"
            f" settles it by the answer; an operator may settle it sooner with {resolve}."
        )
    return (
        f"Nothing will be resent. The write (effect {effect_id}) may or may not have"
        f" landed: {settles} This job follows the settlement: committed is done, not"
        " committed runs once more. " + looks_again
    )


class JobStore:
    """The jobs file, opened by one process; safe to use from several of its threads."""

    def __init__(
        self,
        state_dir: Path,
        clock: Callable[[], float] = time.time,
        blocked_recheck_s: float = BLOCKED_RECHECK_S,
    ) -> None:
        """`clock` is wall-clock time (claims are compared across processes)."""
        state_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._blocked_recheck_s = blocked_recheck_s
        # The MCP SDK runs synchronous tools on worker threads, hence one connection
        # shared under a lock rather than one per thread.
        self._db = sqlite3.connect(
            state_dir / DB_NAME, isolation_level=None, check_same_thread=False
        )
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        # WAL: the server's status reads never wait for a worker's claim.
        self._db.execute("PRAGMA journal_mode=WAL")
        # executescript runs (and commits) on its own; IF NOT EXISTS makes it safe for
        # every process that opens the file.
        self._db.executescript(_SCHEMA)
        columns = {row["name"] for row in self._db.execute("PRAGMA table_info(jobs)")}
        if "retried_generation" not in columns:  # a job table of an earlier version
            self._db.execute(
                "ALTER TABLE jobs ADD COLUMN retried_generation INTEGER NOT NULL DEFAULT 0"
            )

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE: take the write lock first, so two claimers cannot both read
        the same eligible job and then both update it."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def enqueue(self, rule_id: str, route_to: str) -> str:
        job_id = uuid.uuid4().hex
        now = self._clock()
        with self._transaction() as db:
            db.execute(
                "INSERT INTO jobs (job_id, rule_id, route_to, state, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, rule_id, route_to, PENDING, now, now),
            )
        return job_id

    def claim(self, worker: str, pid: int, claim_ttl_s: float) -> Claim | None:
        """Claim the oldest eligible job for `worker`, or None if there is none."""
        now = self._clock()
        with self._transaction() as db:
            row = db.execute(
                "SELECT job_id, rule_id, route_to, generation FROM jobs"
                " WHERE (state = ? AND (retry_at IS NULL OR retry_at <= ?))"
                " OR (state = ? AND claim_expires_at < ?)"
                " ORDER BY created_at LIMIT 1",
                (PENDING, now, RUNNING, now),
            ).fetchone()
            if row is None:
                return None
            generation: int = row["generation"] + 1
            db.execute(
                "UPDATE jobs SET state = ?, generation = ?, claimed_by = ?,"
                " claim_expires_at = ?, updated_at = ? WHERE job_id = ?",
                (RUNNING, generation, worker, now + claim_ttl_s, now, row["job_id"]),
            )
            db.execute(
                "INSERT INTO attempts (job_id, generation, worker, pid, phase, started_at)"
                " VALUES (?, ?, ?, ?, 'claimed', ?)",
                (row["job_id"], generation, worker, pid, now),
            )
        return Claim(row["job_id"], row["rule_id"], row["route_to"], generation, worker)

    def progress(
        self,
        claim: Claim,
        claim_ttl_s: float,
        *,
        phase: str,
        epoch: int | None = None,
        rule_read: dict[str, Any] | None = None,
    ) -> bool:
        """Note the attempt's phase and extend the claim; False if the claim is no longer
        current (the job was claimed again), in which case the job row is left alone."""
        now = self._clock()
        with self._transaction() as db:
            db.execute(
                "UPDATE attempts SET phase = ?, epoch = COALESCE(?, epoch)"
                " WHERE job_id = ? AND generation = ?",
                (phase, epoch, claim.job_id, claim.generation),
            )
            current = db.execute(
                "UPDATE jobs SET claim_expires_at = ?, updated_at = ?,"
                " rule_read = COALESCE(?, rule_read)"
                " WHERE job_id = ? AND generation = ? AND state = ?",
                (
                    now + claim_ttl_s,
                    now,
                    None if rule_read is None else json.dumps(rule_read),
                    claim.job_id,
                    claim.generation,
                    RUNNING,
                ),
            ).rowcount
        return current == 1

    def finish(self, claim: Claim, outcome: Outcome) -> bool:
        """Record the attempt's outcome (always: attempts are appended, never replaced) and,
        only if the claim is still current, the job's new state. False: the claim was stale."""
        now = self._clock()
        with self._transaction() as db:
            db.execute(
                "UPDATE attempts SET phase = 'finished', outcome = ?, detail = ?, ended_at = ?"
                " WHERE job_id = ? AND generation = ?",
                (outcome.outcome, outcome.detail, now, claim.job_id, claim.generation),
            )
            return self._conclude(db, claim.job_id, claim.generation, outcome, now)

    def _conclude(
        self, db: sqlite3.Connection, job_id: str, generation: int, outcome: Outcome, now: float
    ) -> bool:
        """The job row after its current attempt ended (False: `generation` is not
        current, and nothing changes)."""
        job_state = outcome.job_state
        detail = outcome.detail
        if job_state == PENDING and outcome.outcome in COUNTED_FAILURES:
            same = self._same_failures(db, job_id, outcome)
            if same >= MAX_SAME_FAILURES:
                job_state = FAILED
                detail = f"{detail} ({same} attempts in a row ended so)"
        retry_at = {PENDING: now + RETRY_DELAY_S, BLOCKED: now + self._blocked_recheck_s}.get(
            job_state
        )
        result: dict[str, Any] = {"outcome": outcome.outcome, "detail": detail}
        if outcome.effect_id is not None:
            result["effect_id"] = outcome.effect_id
        if outcome.probe_schedule is not None:
            result.update(outcome.probe_schedule)
        current = db.execute(
            "UPDATE jobs SET state = ?, result = ?, claimed_by = NULL,"
            " claim_expires_at = NULL, retry_at = ?, updated_at = ?"
            " WHERE job_id = ? AND generation = ? AND state = ?",
            (job_state, json.dumps(result), retry_at, now, job_id, generation, RUNNING),
        ).rowcount
        return current == 1

    @staticmethod
    def _same_failures(db: sqlite3.Connection, job_id: str, outcome: Outcome) -> int:
        """How many of the job's latest attempts since it was last retried (this one
        included) ended as `outcome`, in a row."""
        rows = db.execute(
            "SELECT attempts.outcome, attempts.detail FROM attempts JOIN jobs USING (job_id)"
            " WHERE job_id = ? AND attempts.generation > jobs.retried_generation"
            " AND attempts.outcome IS NOT NULL ORDER BY attempts.generation DESC",
            (job_id,),
        ).fetchall()
        same = 0
        for row in rows:
            if (row["outcome"], row["detail"]) != (outcome.outcome, outcome.detail):
                break
            same += 1
        return same

    def has_lapsed_claim(self, worker: str) -> bool:
        """Whether `worker` is in the middle of an attempt whose claim has expired or whose
        job was claimed again since (by another worker that found it expired first)."""
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM attempts JOIN jobs USING (job_id)"
                " WHERE attempts.worker = ? AND attempts.outcome IS NULL"
                " AND (attempts.generation != jobs.generation OR jobs.claim_expires_at < ?)",
                (worker, self._clock()),
            ).fetchone()
        return row is not None

    def worker_gone(self, worker: str, pid: int, detail: str) -> None:
        """Close the open attempts of a worker process that exited without finishing
        them, and give back the claims it still held: a process that is gone writes
        nothing more, so its job need not wait for the claim to expire. (A worker that
        is only stopped keeps its claim until it lapses; its generation fences it.)"""
        now = self._clock()
        exited = Outcome("worker_exited", PENDING, detail)
        with self._transaction() as db:
            open_attempts = db.execute(
                "SELECT job_id, generation FROM attempts"
                " WHERE worker = ? AND pid = ? AND outcome IS NULL",
                (worker, pid),
            ).fetchall()
            db.execute(
                "UPDATE attempts SET outcome = 'worker_exited', detail = ?, ended_at = ?"
                " WHERE worker = ? AND pid = ? AND outcome IS NULL",
                (detail, now, worker, pid),
            )
            for attempt in open_attempts:
                self._conclude(db, attempt["job_id"], attempt["generation"], exited, now)

    def blocked_due(self) -> list[BlockedJob]:
        """Blocked jobs whose time to look again at their settlement has come."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, rule_id, generation, result FROM jobs"
                " WHERE state = ? AND retry_at <= ? ORDER BY retry_at",
                (BLOCKED, self._clock()),
            ).fetchall()
        return [self._blocked(row) for row in rows]

    def blocked_job(self, job_id: str) -> BlockedJob | None:
        with self._lock:
            row = self._db.execute(
                "SELECT job_id, rule_id, generation, result FROM jobs"
                " WHERE job_id = ? AND state = ?",
                (job_id, BLOCKED),
            ).fetchone()
        return None if row is None else self._blocked(row)

    @staticmethod
    def _blocked(row: sqlite3.Row) -> BlockedJob:
        result = json.loads(row["result"]) if row["result"] else {}
        return BlockedJob(row["job_id"], row["rule_id"], row["generation"], result.get("effect_id"))

    def follow_settlement(self, blocked: BlockedJob, outcome: Outcome | None) -> bool:
        """A blocked job after a look at its settlement: `outcome` (done, or pending to
        run again at once), or None for still in doubt (looked at again later). False
        if the job is no longer that blocked job (cancelled meanwhile, ...)."""
        now = self._clock()
        with self._transaction() as db:
            if outcome is None:
                changed = db.execute(
                    "UPDATE jobs SET retry_at = ? WHERE job_id = ? AND generation = ?"
                    " AND state = ?",
                    (now + self._blocked_recheck_s, blocked.job_id, blocked.generation, BLOCKED),
                ).rowcount
                return changed == 1
            result = {"outcome": outcome.outcome, "detail": outcome.detail}
            changed = db.execute(
                "UPDATE jobs SET state = ?, result = ?, retry_at = NULL, updated_at = ?"
                " WHERE job_id = ? AND generation = ? AND state = ?",
                (
                    outcome.job_state,
                    json.dumps(result),
                    now,
                    blocked.job_id,
                    blocked.generation,
                    BLOCKED,
                ),
            ).rowcount
        return changed == 1

    def blocked_on_rule(self, rule_id: str) -> dict[str, Any] | None:
        """The status of a blocked job of `rule_id`, if there is one."""
        with self._lock:
            row = self._db.execute(
                "SELECT job_id FROM jobs WHERE rule_id = ? AND state = ?"
                " ORDER BY created_at LIMIT 1",
                (rule_id, BLOCKED),
            ).fetchone()
        return None if row is None else self.status(row["job_id"])

    def cancel(self, job_id: str) -> str | None:
        """Cancel a pending or blocked job; None if done, else why it cannot be."""
        now = self._clock()
        with self._transaction() as db:
            row = db.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                return f"no job {job_id!r}"
            if row["state"] == RUNNING:
                return (
                    "the job is running: its write may be on its way, and stopping the"
                    " worker now would leave that unknown; wait for it to end"
                )
            if row["state"] not in (PENDING, BLOCKED):
                return f"the job is already {row['state']}"
            db.execute(
                "UPDATE jobs SET state = ?, retry_at = NULL, updated_at = ? WHERE job_id = ?",
                (CANCELLED, now, job_id),
            )
        return None

    def retry(self, job_id: str) -> str | None:
        """Run a failed or cancelled job again (its failure count starts over); None if
        done, else why it cannot be."""
        now = self._clock()
        with self._transaction() as db:
            row = db.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                return f"no job {job_id!r}"
            if row["state"] not in (FAILED, CANCELLED):
                return f"the job is {row['state']}: only a failed or cancelled job is retried"
            db.execute(
                "UPDATE jobs SET state = ?, retry_at = NULL, retried_generation = generation,"
                " updated_at = ? WHERE job_id = ?",
                (PENDING, now, job_id),
            )
        return None

    def list_jobs(self, state: str | None, limit: int) -> list[dict[str, Any]]:
        """The newest jobs first, in `state` if given."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, rule_id, route_to, state, generation, result, created_at,"
                " updated_at FROM jobs WHERE ? IS NULL OR state = ?"
                " ORDER BY created_at DESC LIMIT ?",
                (state, state, limit),
            ).fetchall()
        return [
            {
                "job_id": row["job_id"],
                "rule_id": row["rule_id"],
                "route_to": row["route_to"],
                "state": row["state"],
                "attempts": row["generation"],
                "result": None if row["result"] is None else json.loads(row["result"]),
                "created_at": row["created_at"],
                "updated_at": row["updated_at"],
            }
            for row in rows
        ]

    def status(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            job = self._db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            attempts = self._db.execute(
                "SELECT * FROM attempts WHERE job_id = ? ORDER BY generation", (job_id,)
            ).fetchall()
        if job is None:
            return None
        result = None if job["result"] is None else json.loads(job["result"])
        if result is not None and job["state"] == BLOCKED:
            result["next"] = blocked_next_step(result.get("effect_id"), job["retry_at"], result)
        return {
            "job_id": job["job_id"],
            "rule_id": job["rule_id"],
            "route_to": job["route_to"],
            "state": job["state"],
            "generation": job["generation"],
            "claimed_by": job["claimed_by"],
            "rule_read": None if job["rule_read"] is None else json.loads(job["rule_read"]),
            "result": result,
            "attempts": [
                {
                    "generation": attempt["generation"],
                    "worker": attempt["worker"],
                    "pid": attempt["pid"],
                    "epoch": attempt["epoch"],
                    "phase": attempt["phase"],
                    "outcome": attempt["outcome"],
                    "detail": attempt["detail"],
                }
                for attempt in attempts
            ],
        }
