"""The database's tables, their migrations, and how a row is written to and read from them.

``MIGRATIONS[k]`` takes a database from version k to k + 1; ``PRAGMA user_version`` says
which version a file has. Columns that hold lists or maps hold compact JSON read back only
by this package.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bftrainer.state.errors import DamagedRecordError
from bftrainer.state.rows import (
    BACKENDS,
    HOLDER_STATES,
    TRAINER_STATES,
    AllocationRow,
    HolderRow,
    MetricRow,
    PoolEventRow,
    TrainerRow,
)

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


class _Fields:
    """One row's fields, each read with its check: a value bftrainer never writes there
    (another type, out of range, JSON of another shape) is a
    ``DamagedRecordError`` naming the store, the table, the row and the field, here,
    not a traceback wherever the value is used later."""

    def __init__(self, db: Path, table: str, row: sqlite3.Row, record: str) -> None:
        self.db, self.table, self.row, self.record = db, table, row, record

    def damaged(self, field: str, problem: str) -> DamagedRecordError:
        return DamagedRecordError(self.db, self.table, self.record, field, problem)

    def bad(self, field: str, value: object, expected: str) -> DamagedRecordError:
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return self.damaged(field, f"is {shown}, expected {expected}")

    def raw(self, field: str) -> object:
        return self.row[field]  # every column is there: checked when the store opened

    def text(self, field: str, choices: Sequence[str] = ()) -> str:
        value = self.raw(field)
        if not isinstance(value, str) or (choices and value not in choices):
            raise self.bad(field, value, f"one of {', '.join(choices)}" if choices else "text")
        return value

    def text_or_none(self, field: str) -> str | None:
        return None if self.raw(field) is None else self.text(field)

    def whole(self, field: str, least: int = 0, most: int | None = None) -> int:
        value = self.raw(field)
        if not isinstance(value, int) or value < least or (most is not None and value > most):
            within = f">= {least}" if most is None else f"from {least} to {most}"
            raise self.bad(field, value, f"a whole number {within}")
        return value

    def whole_or_none(self, field: str, least: int = 0) -> int | None:
        return None if self.raw(field) is None else self.whole(field, least)

    def number(
        self, field: str, *, least: float = -math.inf, above: bool = False, finite: bool = True
    ) -> float:
        """A number >= ``least`` (> ``least`` when ``above``), finite unless ``finite``
        is False."""
        value = self.raw(field)
        if (
            not isinstance(value, int | float)
            or not (value > least if above else value >= least)
            or (finite and not math.isfinite(value))
        ):
            what = "a finite number" if finite else "a number"
            if least > -math.inf:
                what += f" {'>' if above else '>='} {least:g}"
            raise self.bad(field, value, what)
        return value

    def number_or_none(
        self, field: str, *, least: float = -math.inf, above: bool = False, finite: bool = True
    ) -> float | None:
        if self.raw(field) is None:
            return None
        return self.number(field, least=least, above=above, finite=finite)

    def json(self, field: str, expected: str, fits: Callable[[Any], bool]) -> Any:
        """The field's JSON text, parsed; it must parse to what ``fits``."""
        text = self.raw(field)
        if not isinstance(text, str):
            raise self.bad(field, text, f"JSON text of {expected}")
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            raise self.bad(field, text, f"JSON text of {expected}") from None
        if not fits(value):
            raise self.bad(field, text, expected)
        return value


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _slots(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(s, list)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in s)
        for s in value.values()
    )


def _windows(value: Any) -> bool:
    return isinstance(value, dict) and all(
        w is None or (isinstance(w, int | float) and not isinstance(w, bool) and not math.isnan(w))
        for w in value.values()
    )


_NAMES = "a list of names"


def trainer_from_row(db: Path, row: sqlite3.Row) -> TrainerRow:
    """A ``trainers`` row, each field checked (``DamagedRecordError``)."""
    tid = row["id"]
    label = tid if isinstance(tid, str) and tid else f"seq {row['seq']}"
    f = _Fields(db, "trainers", row, label)
    n_min = f.whole("n_min", 1)
    work = f.raw("work_samples")
    return TrainerRow(
        id=f.text("id"),
        script=f.text("script"),
        args=tuple(f.json("args", "a list of arguments (text)", _names)),
        backend=f.text("backend", BACKENDS),
        n_min=n_min,
        n_max=f.whole("n_max", n_min),
        work_samples=math.inf if work is None else f.number("work_samples", least=0, above=True),
        rescale_up_s=f.number("rescale_up_s", least=0),
        rescale_down_s=f.number("rescale_down_s", least=0),
        state=f.text("state", TRAINER_STATES),
        submit_s=f.number("submit_s"),
        started_s=f.number_or_none("started_s"),
        finished_s=f.number_or_none("finished_s"),
        cancel_requested=bool(f.whole("cancel_requested", 0, 1)),
        samples_done=f.whole("samples_done"),
        # Rates: inf is a rate too (status shows "-"); a negative one is not.
        throughput_sps=f.number_or_none("throughput_sps", least=0, finite=False),
        goodput_sps=f.number_or_none("goodput_sps", least=0, finite=False),
        batch_size=f.whole_or_none("batch_size"),
        reason=f.text("reason"),
        trainer_dir=f.text_or_none("trainer_dir"),
        supervisor=f.text_or_none("supervisor"),
        restarts=f.whole("restarts"),
        rungs=f.whole("rungs"),
    )


def allocation_from_row(db: Path, row: sqlite3.Row) -> AllocationRow:
    """An ``allocations`` row (with its ``id``), each field checked."""
    label = f"{row['id']} (trainer {row['trainer_id']})"
    f = _Fields(db, "allocations", row, label)
    kept = f.raw("slots") not in (None, "")  # NULL: one slot per node
    slots = f.json("slots", "a map of node to slot numbers", _slots) if kept else {}
    return AllocationRow(
        f.text("trainer_id"),
        tuple(f.json("nodes", _NAMES, _names)),
        f.number("time_s"),
        {n: tuple(s) for n, s in slots.items()},
    )


def holder_from_row(db: Path, row: sqlite3.Row) -> HolderRow:
    """A ``holders`` row, each field checked."""
    f = _Fields(db, "holders", row, f"{row['seq']} (job {row['job_id']})")
    return HolderRow(
        job_id=f.text("job_id"),
        node=f.text("node"),
        state=f.text("state", HOLDER_STATES),
        submit_s=f.number("submit_s"),
        started_s=f.number_or_none("started_s"),
        ended_s=f.number_or_none("ended_s"),
        trainer_id=f.text_or_none("trainer_id"),
        reason=f.text("reason"),
        limit_s=f.number_or_none("limit_s", least=0, above=True),
    )


def pool_event_from_row(db: Path, row: sqlite3.Row) -> PoolEventRow:
    """A ``pool_events`` row, each field checked."""
    f = _Fields(db, "pool_events", row, str(row["id"]))
    return PoolEventRow(
        f.whole("id"),
        f.number("time_s"),
        tuple(f.json("joined", _NAMES, _names)),
        tuple(f.json("left_nodes", _NAMES, _names)),
        f.json("windows", "a map of node to seconds (or null)", _windows),
        bool(f.whole("stale", 0, 1)),
    )


def metric_from_row(db: Path, row: sqlite3.Row) -> MetricRow:
    """A ``metrics`` row, each field checked (the record's own fields are the trainer's:
    its readers skip a record they cannot use)."""
    label = f"{row['id']} (trainer {row['trainer_id']})"
    f = _Fields(db, "metrics", row, label)
    return MetricRow(
        f.whole("id"),
        f.text("trainer_id"),
        f.number("time_s"),
        f.json("record", "a JSON object", lambda v: isinstance(v, dict)),
    )


def setting_from_row(db: Path, row: sqlite3.Row) -> Any:
    """A ``settings`` row's value (any JSON; its reader checks the shape)."""
    f = _Fields(db, "settings", row, repr(row["key"]))
    return f.json("value", "JSON", lambda v: True)


def statements(script: str) -> list[str]:
    """Split a migration script into statements (no ';' inside our literals)."""
    return [s.strip() for s in script.split(";") if s.strip()]
