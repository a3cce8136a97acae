"""The database's tables, their migrations, and how a row is written to and read from them.

``MIGRATIONS[k]`` takes a database from version k to k + 1; ``PRAGMA user_version`` says
which version a file has. Columns that hold lists or maps hold compact JSON read back only
by this package.
"""

from __future__ import annotations

import json
import math
import sqlite3

from bftrainer.state.rows import AllocationRow, HolderRow, TrainerRow

SCHEMA_VERSION = 8
# What a database of SCHEMA_VERSION holds: checked when it is opened, so that a store
# with a table dropped is named at start, not by a traceback at the first write.
TABLES = (
    "trainers",
    "allocations",
    "holders",
    "pool_events",
    "metrics",
    "settings",
    "orders",
)
VIEWS = ("current_allocations",)

# MIGRATIONS[k] takes a database from version k to k + 1.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE trainers (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        script TEXT NOT NULL,
        args TEXT NOT NULL,
        backend TEXT NOT NULL,
        min_nodes INTEGER NOT NULL CHECK (min_nodes >= 1),
        max_nodes INTEGER NOT NULL CHECK (max_nodes >= min_nodes),
        work_samples INTEGER CHECK (work_samples IS NULL OR work_samples > 0),
        rescale_up_s REAL NOT NULL,
        rescale_down_s REAL NOT NULL,
        state TEXT NOT NULL CHECK (state IN
            ('queued', 'running', 'waiting', 'done', 'failed', 'cancelled')),
        submitted_s REAL NOT NULL,
        started_s REAL,
        finished_s REAL,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        samples_done INTEGER NOT NULL DEFAULT 0,
        throughput_sps REAL,
        goodput_sps REAL,
        batch_size INTEGER,
        reason TEXT NOT NULL DEFAULT '',
        trainer_dir TEXT,
        supervisor TEXT
    );
    CREATE INDEX trainers_state ON trainers(state);
    CREATE TABLE allocations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        trainer_id TEXT NOT NULL REFERENCES trainers(id),
        time_s REAL NOT NULL,
        nodes TEXT NOT NULL
    );
    CREATE INDEX allocations_trainer ON allocations(trainer_id, id);
    CREATE VIEW current_allocations AS
        SELECT a.trainer_id, a.time_s, a.nodes FROM allocations a
        WHERE a.id = (SELECT MAX(b.id) FROM allocations b WHERE b.trainer_id = a.trainer_id);
    CREATE TABLE holders (
        job_id TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'ended')),
        submitted_s REAL NOT NULL,
        started_s REAL,
        ended_s REAL,
        trainer_id TEXT REFERENCES trainers(id),
        reason TEXT NOT NULL DEFAULT ''
    );
    CREATE UNIQUE INDEX holders_live_node ON holders(node) WHERE state != 'ended';
    CREATE TABLE pool_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time_s REAL NOT NULL,
        joined TEXT NOT NULL,
        left_nodes TEXT NOT NULL,
        windows TEXT NOT NULL,
        stale INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE metrics (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        trainer_id TEXT NOT NULL REFERENCES trainers(id),
        time_s REAL NOT NULL,
        record TEXT NOT NULL
    );
    CREATE INDEX metrics_trainer ON metrics(trainer_id, id);
    CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    # 2: the holder's time limit, so that the loop knows when the scheduler ends it.
    """
    ALTER TABLE holders ADD COLUMN limit_s REAL;
    """,
    # 3: how often the daemon restarted a trainer's supervisor.
    """
    ALTER TABLE trainers ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0;
    """,
    # 4: which slots of each node a trainer holds, when several trainers share a node.
    """
    ALTER TABLE allocations ADD COLUMN slots TEXT;
    DROP VIEW current_allocations;
    CREATE VIEW current_allocations AS
        SELECT a.trainer_id, a.time_s, a.nodes, a.slots FROM allocations a
        WHERE a.id = (SELECT MAX(b.id) FROM allocations b WHERE b.trainer_id = a.trainer_id);
    """,
    # 5: a search trial's promise, the rungs its pruner has passed it (bftrainer/hpo/).
    """
    ALTER TABLE trainers ADD COLUMN rungs INTEGER NOT NULL DEFAULT 0 CHECK (rungs >= 0);
    """,
    # 6: one trainer record (issue 43): the columns take the names the allocator, the
    # centre's protocol and the replay use (SQLite rewrites the CHECKs that name them).
    """
    ALTER TABLE trainers RENAME COLUMN min_nodes TO n_min;
    ALTER TABLE trainers RENAME COLUMN max_nodes TO n_max;
    ALTER TABLE trainers RENAME COLUMN submitted_s TO submit_s;
    ALTER TABLE holders RENAME COLUMN submitted_s TO submit_s;
    """,
    # 7: a job id names one live holder, not one for ever: a scheduler gives an id again
    # once its ids wrap (LSF's MAX_JOBID, 999,999 unless raised) or restart (a Slurm
    # rebuilt without FirstJobId), and a new holder with an ended one's id was refused.
    # Rows keep their order (seq); the ended ones are kept as they were.
    """
    CREATE TABLE holders_v7 (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL,
        node TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'ended')),
        submit_s REAL NOT NULL,
        started_s REAL,
        ended_s REAL,
        trainer_id TEXT REFERENCES trainers(id),
        reason TEXT NOT NULL DEFAULT '',
        limit_s REAL
    );
    INSERT INTO holders_v7 (job_id, node, state, submit_s, started_s, ended_s, trainer_id,
        reason, limit_s)
        SELECT job_id, node, state, submit_s, started_s, ended_s, trainer_id, reason, limit_s
        FROM holders ORDER BY submit_s, job_id;
    DROP TABLE holders;
    ALTER TABLE holders_v7 RENAME TO holders;
    CREATE UNIQUE INDEX holders_live_node ON holders(node) WHERE state != 'ended';
    CREATE UNIQUE INDEX holders_live_job ON holders(job_id) WHERE state != 'ended';
    CREATE INDEX holders_job ON holders(job_id, seq);
    """,
    # 8: a step's orders as one record (issue 43), kept in the step's transaction and
    # marked done once carried out: a restart does what was committed and not done
    # (bftrainer/daemon/order_log.py).
    """
    CREATE TABLE orders (
        step INTEGER PRIMARY KEY AUTOINCREMENT,
        time_s REAL NOT NULL,
        record TEXT NOT NULL,
        done_s REAL
    );
    CREATE INDEX orders_undone ON orders(step) WHERE done_s IS NULL;
    """,
)
assert len(MIGRATIONS) == SCHEMA_VERSION


def to_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def trainer_from_row(row: sqlite3.Row) -> TrainerRow:
    return TrainerRow(
        id=row["id"],
        script=row["script"],
        args=tuple(json.loads(row["args"])),
        backend=row["backend"],
        n_min=row["n_min"],
        n_max=row["n_max"],
        work_samples=math.inf if row["work_samples"] is None else row["work_samples"],
        rescale_up_s=row["rescale_up_s"],
        rescale_down_s=row["rescale_down_s"],
        state=row["state"],
        submit_s=row["submit_s"],
        started_s=row["started_s"],
        finished_s=row["finished_s"],
        cancel_requested=bool(row["cancel_requested"]),
        samples_done=row["samples_done"],
        throughput_sps=row["throughput_sps"],
        goodput_sps=row["goodput_sps"],
        batch_size=row["batch_size"],
        reason=row["reason"],
        trainer_dir=row["trainer_dir"],
        supervisor=row["supervisor"],
        restarts=row["restarts"],
        rungs=row["rungs"],
    )


def allocation_from_row(trainer_id: str, row: sqlite3.Row) -> AllocationRow:
    slots = json.loads(row["slots"]) if row["slots"] else {}
    return AllocationRow(
        trainer_id,
        tuple(json.loads(row["nodes"])),
        row["time_s"],
        {n: tuple(s) for n, s in slots.items()},
    )


def holder_from_row(row: sqlite3.Row) -> HolderRow:
    return HolderRow(
        job_id=row["job_id"],
        node=row["node"],
        state=row["state"],
        submit_s=row["submit_s"],
        started_s=row["started_s"],
        ended_s=row["ended_s"],
        trainer_id=row["trainer_id"],
        reason=row["reason"],
        limit_s=row["limit_s"],
    )


def statements(script: str) -> list[str]:
    """Split a migration script into statements (no ';' inside our literals)."""
    return [s.strip() for s in script.split(";") if s.strip()]
