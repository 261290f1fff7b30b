"""The farm's job ledger: one SQLite file (WAL) that makes a run idempotent and resumable.

Table ``jobs``: one row per job id: ``state`` (queued, running, done, failed, refused), ``attempts``,
the rung, ``worker``/``device``, predicted and measured peaks (bytes), times (seconds since the epoch),
the output folder, the error or diagnosis, and ``spec_hash`` (the job's workflow after overrides).
Table ``attempts``: one row per try with the worker, the predicted MiB it held on its device, and its
start and end on the worker (the interval Ray held the resources), and how it ended.

Invariants: a ``done`` job is never queued again (`sync` keeps it, `pending` skips it); a job left
``running`` by a driver that died is queued again by `recover`; every change is one transaction, so
a killed driver leaves the file consistent. One driver writes at a time: `claim` takes an exclusive
lock on ``<ledger>.lock`` (released when the driver's process ends, killed or not), and a second driver
on the same file is refused (WAL lets `farm status` read meanwhile).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from h3director.errors import InvalidInputError

STATES = ("queued", "running", "done", "failed", "refused")
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, line INTEGER, spec_hash TEXT, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    rung INTEGER NOT NULL DEFAULT 0, settings TEXT, worker TEXT, device TEXT, predicted_bytes INTEGER,
    measured_peak_bytes INTEGER, queued_at REAL, started_at REAL, finished_at REAL, output TEXT, error TEXT);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rung INTEGER, worker TEXT, node_id TEXT, predicted_mb INTEGER,
    started_at REAL, ended_at REAL, result TEXT, error TEXT, PRIMARY KEY (job_id, attempt));
"""


@dataclass(frozen=True)
class JobRow:
    """One job's row in the farm ledger: state, tries, planner rung and settings, where it ran, predicted and
    measured peak (bytes), start and end (Unix seconds), output path."""

    id: str
    state: str
    attempts: int
    rung: int
    settings: dict | None
    worker: str | None
    device: str | None
    predicted_bytes: int | None
    measured_peak_bytes: int | None
    started_at: float | None
    finished_at: float | None
    output: str | None
    error: str | None
    spec_hash: str | None = None

    @property
    def seconds(self) -> float | None:
        return None if self.started_at is None or self.finished_at is None else self.finished_at - self.started_at


class Ledger:
    """The SQLite ledger at `path` (created with its folder)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def claim(self) -> None:
        """Make this the only driver of the ledger until `close` (or this process's end). Raises
        `InvalidInputError` when another driver holds it: its running jobs are not ours to recover."""
        try:
            import fcntl
        except ImportError:         # no flock (Windows): one driver at a time is the user's to keep
            return
        lock = open(self.path.with_name(self.path.name + ".lock"), "a")  # noqa: SIM115 (held until close)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise InvalidInputError(f"another farm run is using {str(self.path)!r}; wait for it to end (see "
                                    "`h3director farm status`) or give this run another --out") from None
        self._lock = lock

    def close(self) -> None:
        self.db.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _tx(self, sql: str, args: tuple = ()) -> None:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(sql, args)

    # --- a run's start -------------------------------------------------------------------------

    def sync(self, job_id: str, line: int, spec_hash: str) -> JobRow:
        """Register a job from the file. A known id keeps its row (a done job stays done); its spec
        must be unchanged: a different one is recorded as the returned row's `error`, not run."""
        row = self.get(job_id)
        if row is None:
            self._tx("INSERT INTO jobs (id, line, spec_hash, state, queued_at) VALUES (?, ?, ?, 'queued', ?)",
                     (job_id, line, spec_hash, time.time()))
            return self.get(job_id)
        if row.spec_hash != spec_hash and row.state == "done":
            return JobRow(**{**row.__dict__, "error": f"job {job_id} is done in this ledger with a different "
                             "workflow; give the changed job a new id (or use another --out)"})
        if row.state in ("failed", "refused") or row.spec_hash != spec_hash:
            self._tx("UPDATE jobs SET state='queued', spec_hash=?, line=?, error=NULL, rung=0 WHERE id=?",
                     (spec_hash, line, job_id))
        return self.get(job_id)

    def recover(self) -> list[str]:
        """Queue again every job a dead driver left running (its Ray tasks died with it); their ids."""
        ids = [r[0] for r in self.db.execute("SELECT id FROM jobs WHERE state='running'")]
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("UPDATE jobs SET state='queued' WHERE state='running'")
            self.db.execute("UPDATE attempts SET result='driver lost', ended_at=NULL WHERE result IS NULL")
        return ids

    # --- transitions ---------------------------------------------------------------------------

    def refuse(self, job_id: str, line: int, reason: str) -> None:
        """A job that will not run (bad line, unknown node, fits no worker)."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("INSERT OR IGNORE INTO jobs (id, line, state, queued_at) VALUES (?, ?, 'refused', ?)",
                            (job_id, line, time.time()))
            self.db.execute("UPDATE jobs SET state='refused', error=? WHERE id=? AND state != 'done'", (reason, job_id))

    def start_attempt(self, job_id: str, rung: int, settings: dict, predicted_bytes: int, predicted_mb: int) -> int:
        """Mark the job running on `rung`; returns the attempt number (1-based)."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            attempt = self.db.execute("SELECT attempts FROM jobs WHERE id=?", (job_id,)).fetchone()[0] + 1
            self.db.execute("UPDATE jobs SET state='running', attempts=?, rung=?, settings=?, predicted_bytes=?, "
                            "error=NULL WHERE id=?", (attempt, rung, json.dumps(settings), predicted_bytes, job_id))
            self.db.execute("INSERT OR REPLACE INTO attempts (job_id, attempt, rung, predicted_mb) VALUES (?, ?, ?, ?)",
                            (job_id, attempt, rung, predicted_mb))
        return attempt

    def end_attempt(self, job_id: str, attempt: int, result: str, *, worker: str | None = None,
                    node_id: str | None = None, started_at: float | None = None, ended_at: float | None = None,
                    error: str | None = None) -> None:
        """Record how one attempt ended ("done", "oom", "worker lost", "error") and where it ran."""
        self._tx("UPDATE attempts SET result=?, worker=?, node_id=?, started_at=?, ended_at=?, error=? "
                 "WHERE job_id=? AND attempt=?",
                 (result, worker, node_id, started_at, ended_at, error, job_id, attempt))

    def requeue(self, job_id: str, reason: str) -> None:
        self._tx("UPDATE jobs SET state='queued', error=? WHERE id=?", (reason, job_id))

    def finish(self, job_id: str, attempt: int, *, worker: str, node_id: str | None, device: str,
               measured_peak_bytes: int | None, started_at: float, finished_at: float, output: str) -> None:
        """The job and its attempt are done, in one transaction (call after its outputs are written:
        a driver killed before this redoes the job, whose outputs were never committed)."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("UPDATE jobs SET state='done', worker=?, device=?, measured_peak_bytes=?, started_at=?, "
                            "finished_at=?, output=?, error=NULL WHERE id=?",
                            (worker, device, measured_peak_bytes, started_at, finished_at, output, job_id))
            self.db.execute("UPDATE attempts SET result='done', worker=?, node_id=?, started_at=?, ended_at=?, "
                            "error=NULL WHERE job_id=? AND attempt=?",
                            (worker, node_id, started_at, finished_at, job_id, attempt))

    def fail(self, job_id: str, error: str, *, worker: str | None = None, device: str | None = None,
             started_at: float | None = None, finished_at: float | None = None) -> None:
        self._tx("UPDATE jobs SET state='failed', error=?, worker=COALESCE(?, worker), device=COALESCE(?, device), "
                 "started_at=COALESCE(?, started_at), finished_at=COALESCE(?, finished_at) WHERE id=?",
                 (error, worker, device, started_at, finished_at, job_id))

    # --- reading -------------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRow | None:
        rows = self.rows("WHERE id=?", (job_id,))
        return rows[0] if rows else None

    def rows(self, where: str = "", args: tuple = ()) -> list[JobRow]:
        cursor = self.db.execute(
            "SELECT id, state, attempts, rung, settings, worker, device, predicted_bytes, measured_peak_bytes, "
            f"started_at, finished_at, output, error, spec_hash FROM jobs {where} ORDER BY line, id", args)
        return [JobRow(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None, *r[5:]) for r in cursor]

    def counts(self) -> dict[str, int]:
        found = dict(self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
        return {state: found.get(state, 0) for state in STATES}

    def attempts(self, job_id: str | None = None) -> list[dict]:
        """Attempt rows as dicts (all jobs, or one), in start order."""
        where, args = ("WHERE job_id=?", (job_id,)) if job_id else ("", ())
        cursor = self.db.execute("SELECT job_id, attempt, rung, worker, node_id, predicted_mb, started_at, ended_at, "
                                 f"result, error FROM attempts {where} ORDER BY started_at, job_id, attempt", args)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]


__all__ = ["JobRow", "Ledger"]
