"""The job table the MCP server and its worker processes share: one SQLite file in --state.

A job is claimed in one transaction: eligible is a pending job, or a running one whose
claim has expired (its worker stalled or died). Every claim bumps the job's
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


class JobStore:
    """The jobs file, opened by one process; safe to use from several of its threads."""

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        """`clock` is wall-clock time (claims are compared across processes)."""
        state_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
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
        result = json.dumps({"outcome": outcome.outcome, "detail": outcome.detail})
        with self._transaction() as db:
            db.execute(
                "UPDATE attempts SET phase = 'finished', outcome = ?, detail = ?, ended_at = ?"
                " WHERE job_id = ? AND generation = ?",
                (outcome.outcome, outcome.detail, now, claim.job_id, claim.generation),
            )
            retry_at = now + RETRY_DELAY_S if outcome.job_state == PENDING else None
            current = db.execute(
                "UPDATE jobs SET state = ?, result = ?, claimed_by = NULL,"
                " claim_expires_at = NULL, retry_at = ?, updated_at = ?"
                " WHERE job_id = ? AND generation = ? AND state = ?",
                (
                    outcome.job_state,
                    result,
                    retry_at,
                    now,
                    claim.job_id,
                    claim.generation,
                    RUNNING,
                ),
            ).rowcount
        return current == 1

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
        """Close the open attempts of a worker process that exited without finishing them."""
        with self._transaction() as db:
            db.execute(
                "UPDATE attempts SET outcome = 'worker_exited', detail = ?, ended_at = ?"
                " WHERE worker = ? AND pid = ? AND outcome IS NULL",
                (detail, self._clock(), worker, pid),
            )

    def status(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            job = self._db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            attempts = self._db.execute(
                "SELECT * FROM attempts WHERE job_id = ? ORDER BY generation", (job_id,)
            ).fetchall()
        if job is None:
            return None
        return {
            "job_id": job["job_id"],
            "rule_id": job["rule_id"],
            "route_to": job["route_to"],
            "state": job["state"],
            "generation": job["generation"],
            "claimed_by": job["claimed_by"],
            "rule_read": None if job["rule_read"] is None else json.loads(job["rule_read"]),
            "result": None if job["result"] is None else json.loads(job["result"]),
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
