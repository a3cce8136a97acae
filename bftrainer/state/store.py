"""The store: the reads and writes of the daemon's tables, one method each.

Trainers and their queue, the allocations handed to them, the holder jobs that keep their
nodes, the pool events, the trainers' metrics and the daemon's settings. Each write
method is one ``transaction`` block: alone it commits; inside a caller's block it joins
that block's single commit.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bftrainer.state.database import Database
from bftrainer.state.errors import (
    HolderConflictError,
    InvalidTrainerError,
    TransitionError,
    UnknownHolderError,
    UnknownTrainerError,
)
from bftrainer.state.rows import (
    BACKENDS,
    HOLDER_NEXT,
    HOLDER_STATES,
    NEXT_STATES,
    TERMINAL_STATES,
    TRAINER_STATES,
    AllocationRow,
    HolderRow,
    MetricRow,
    OrdersRow,
    PoolEventRow,
    TrainerRow,
    check_states,
    trainer_id_of,
)
from bftrainer.state.schema import (
    allocation_from_row,
    holder_from_row,
    metric_from_row,
    pool_event_from_row,
    setting_from_row,
    to_json,
    trainer_from_row,
)

log = logging.getLogger(__name__)


class Store(Database):
    """The state database of one state directory. Open with ``Store.open(state_dir)``.

    Safe to share between threads of one process (one connection behind a lock); other
    processes open their own ``Store``. Times are epoch seconds; methods that record a
    time take ``now_s`` (default: ``time.time()``).
    """

    # ------------------------------------------------------------- trainers

    def submit(
        self,
        script: str | os.PathLike[str],
        args: Sequence[str] = (),
        *,
        backend: str = "horovod",
        n_min: int = 1,
        n_max: int = 1,
        work_samples: float = math.inf,
        rescale_up_s: float = 0.0,
        rescale_down_s: float = 0.0,
        now_s: float | None = None,
    ) -> str:
        """Queue a trainer; returns its id (``t0001``, ...), committed."""
        if backend not in BACKENDS:
            raise InvalidTrainerError(f"backend {backend!r}: expected one of {BACKENDS}")
        if n_min < 1:
            raise InvalidTrainerError(f"n_min {n_min}: must be at least 1")
        if n_max < n_min:
            raise InvalidTrainerError(f"n_max {n_max} is below n_min {n_min}")
        if isinstance(work_samples, bool) or not isinstance(work_samples, int | float):
            raise InvalidTrainerError(
                f"work_samples {work_samples!r}: expected a number (math.inf: until the "
                "trainer's own stop)"
            )
        if not work_samples > 0:
            raise InvalidTrainerError(f"work_samples {work_samples}: must be positive")
        if rescale_up_s < 0 or rescale_down_s < 0:
            raise InvalidTrainerError(
                f"rescale costs must be >= 0 s, got up {rescale_up_s}, down {rescale_down_s}"
            )
        args = [str(a) for a in args]
        now = time.time() if now_s is None else now_s
        with self.transaction():
            cur = self._conn.execute(
                "INSERT INTO trainers (id, script, args, backend, n_min, n_max,"
                " work_samples, rescale_up_s, rescale_down_s, state, submit_s)"
                " VALUES ('', ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?)",
                (
                    os.fspath(script),
                    to_json(args),
                    backend,
                    n_min,
                    n_max,
                    None if math.isinf(work_samples) else work_samples,
                    float(rescale_up_s),
                    float(rescale_down_s),
                    now,
                ),
            )
            seq = int(cur.lastrowid or 0)
            trainer_id = trainer_id_of(seq)
            self._conn.execute("UPDATE trainers SET id = ? WHERE seq = ?", (trainer_id, seq))
        log.info("trainer %s queued: %s", trainer_id, script)
        return trainer_id

    def trainer(self, trainer_id: str) -> TrainerRow:
        rows = self._query("SELECT * FROM trainers WHERE id = ?", (trainer_id,))
        if not rows:
            raise UnknownTrainerError(trainer_id)
        return trainer_from_row(self.path, rows[0])

    def trainers(self, states: Iterable[str] | None = None) -> list[TrainerRow]:
        """All trainers (or those in ``states``), in submission order."""
        if states is None:
            rows = self._query("SELECT * FROM trainers ORDER BY seq")
        else:
            wanted = list(states)
            check_states(wanted, TRAINER_STATES, "trainer")
            marks = ",".join("?" * len(wanted))
            rows = self._query(
                f"SELECT * FROM trainers WHERE state IN ({marks}) ORDER BY seq", wanted
            )
        return [trainer_from_row(self.path, r) for r in rows]

    def trainer_counts(self) -> dict[str, int]:
        """How many trainers are in each state (every state, 0 included): one query,
        not a read of every row (the daemon's metrics ask at every step)."""
        rows = self._query("SELECT state, COUNT(*) AS n FROM trainers GROUP BY state")
        counts = dict.fromkeys(TRAINER_STATES, 0)
        counts.update({r["state"]: int(r["n"]) for r in rows})
        return counts

    def request_cancel(self, trainer_id: str) -> TrainerRow:
        """Flag a trainer for cancellation (the daemon stops it); returns the row after.
        A finished trainer is returned unchanged."""
        with self.transaction():
            row = self.trainer(trainer_id)
            if row.finished or row.cancel_requested:
                return row
            self._conn.execute(
                "UPDATE trainers SET cancel_requested = 1 WHERE id = ?", (trainer_id,)
            )
            return self.trainer(trainer_id)

    def set_trainer_state(
        self,
        trainer_id: str,
        state: str,
        *,
        reason: str | None = None,
        now_s: float | None = None,
    ) -> TrainerRow:
        """Move a trainer to ``state``; ``TransitionError`` if that move is not allowed
        (see ``NEXT_STATES``). The first ``running`` sets ``started_s``; a final state
        sets ``finished_s``. Moving to the state it is in only updates ``reason``."""
        check_states([state], TRAINER_STATES, "trainer")
        now = time.time() if now_s is None else now_s
        with self.transaction():
            row = self.trainer(trainer_id)
            if state != row.state and state not in NEXT_STATES[row.state]:
                raise TransitionError(f"trainer {trainer_id} cannot go from {row.state} to {state}")
            started = row.started_s
            if started is None and state in ("running", "waiting"):
                started = now
            finished = now if state in TERMINAL_STATES and row.finished_s is None else None
            self._conn.execute(
                "UPDATE trainers SET state = ?, reason = ?, started_s = ?,"
                " finished_s = COALESCE(finished_s, ?) WHERE id = ?",
                (state, row.reason if reason is None else reason, started, finished, trainer_id),
            )
            if state != row.state:
                log.debug("trainer %s: %s -> %s %s", trainer_id, row.state, state, reason or "")
            return self.trainer(trainer_id)

    def set_launch(
        self, trainer_id: str, *, trainer_dir: str | os.PathLike[str], supervisor: str | None
    ) -> TrainerRow:
        """Record where the trainer runs: its directory and its supervisor's handle."""
        with self.transaction():
            self.trainer(trainer_id)
            self._conn.execute(
                "UPDATE trainers SET trainer_dir = ?, supervisor = ? WHERE id = ?",
                (os.fspath(trainer_dir), supervisor, trainer_id),
            )
            return self.trainer(trainer_id)

    def decide_restart(self, trainer_id: str) -> TrainerRow:
        """Count one more restart of the trainer's supervisor and forget the dead one, in
        one transaction: a daemon that restarts before the new supervisor is started
        finds ``supervisor`` empty and resumes the pending restart, instead of seeing the
        same dead supervisor again and counting its death twice."""
        with self.transaction():
            self.trainer(trainer_id)
            self._conn.execute(
                "UPDATE trainers SET restarts = restarts + 1, supervisor = NULL WHERE id = ?",
                (trainer_id,),
            )
            return self.trainer(trainer_id)

    def set_rungs(self, trainer_id: str, rungs: int) -> TrainerRow:
        """Mark a search trial's promise: the rungs its pruner has passed it."""
        if isinstance(rungs, bool) or not isinstance(rungs, int) or rungs < 0:
            raise ValueError(f"trainer {trainer_id}: rungs {rungs!r}, expected a whole number >= 0")
        with self.transaction():
            self.trainer(trainer_id)
            self._conn.execute("UPDATE trainers SET rungs = ? WHERE id = ?", (rungs, trainer_id))
            return self.trainer(trainer_id)

    def update_progress(
        self,
        trainer_id: str,
        *,
        samples_done: int | None = None,
        throughput_sps: float | None = None,
        goodput_sps: float | None = None,
        batch_size: int | None = None,
    ) -> TrainerRow:
        """Record a trainer's latest progress (fields left None keep their value).
        ``samples_done`` never goes down: a report older than the last one is ignored
        for it."""
        with self.transaction():
            row = self.trainer(trainer_id)
            self._conn.execute(
                "UPDATE trainers SET samples_done = ?, throughput_sps = ?, goodput_sps = ?,"
                " batch_size = ? WHERE id = ?",
                (
                    max(row.samples_done, samples_done or 0),
                    row.throughput_sps if throughput_sps is None else throughput_sps,
                    row.goodput_sps if goodput_sps is None else goodput_sps,
                    row.batch_size if batch_size is None else batch_size,
                    trainer_id,
                ),
            )
            return self.trainer(trainer_id)

    # ------------------------------------------------------------- allocations

    def record_allocation(
        self,
        trainer_id: str,
        nodes: Iterable[str],
        *,
        slots: Mapping[str, Sequence[int]] | None = None,
        now_s: float | None = None,
    ) -> AllocationRow:
        """Record the node set a trainer is given now (empty: none), and with slots
        which slots of each node. Kept as history."""
        kept = {n: tuple(s) for n, s in sorted((slots or {}).items()) if s}
        alloc = AllocationRow(
            trainer_id, tuple(sorted(nodes)), time.time() if now_s is None else now_s, kept
        )
        with self.transaction():
            self.trainer(trainer_id)
            self._conn.execute(
                "INSERT INTO allocations (trainer_id, time_s, nodes, slots) VALUES (?, ?, ?, ?)",
                (
                    trainer_id,
                    alloc.time_s,
                    to_json(list(alloc.nodes)),
                    to_json({n: list(s) for n, s in kept.items()}) if kept else None,
                ),
            )
        return alloc

    def current_allocations(self) -> dict[str, AllocationRow]:
        """trainer id -> its latest allocation (trainers never allocated are absent)."""
        # The view current_allocations, with each row's id (to name a damaged one).
        rows = self._query(
            "SELECT id, trainer_id, time_s, nodes, slots FROM allocations"
            " WHERE id IN (SELECT MAX(id) FROM allocations GROUP BY trainer_id)"
        )
        allocs = [allocation_from_row(self.path, r) for r in rows]
        return {a.trainer_id: a for a in allocs}

    def current_allocation(self, trainer_id: str) -> tuple[str, ...]:
        """The nodes a trainer holds now (empty if none or never allocated)."""
        rows = self._query(
            "SELECT id, trainer_id, time_s, nodes, slots FROM allocations"
            " WHERE trainer_id = ? ORDER BY id DESC LIMIT 1",
            (trainer_id,),
        )
        return allocation_from_row(self.path, rows[0]).nodes if rows else ()

    def allocation_history(self, trainer_id: str) -> list[AllocationRow]:
        rows = self._query(
            "SELECT id, trainer_id, time_s, nodes, slots FROM allocations"
            " WHERE trainer_id = ? ORDER BY id",
            (trainer_id,),
        )
        return [allocation_from_row(self.path, r) for r in rows]

    # ------------------------------------------------------------- holders

    def add_holder(
        self,
        job_id: str,
        node: str,
        *,
        trainer_id: str | None = None,
        state: str = "pending",
        limit_s: float | None = None,
        now_s: float | None = None,
    ) -> HolderRow:
        """Record a holder job just submitted for ``node`` with a time limit of
        ``limit_s`` (None: none). ``HolderConflictError`` when the node, or the job id,
        already has a live holder in the state (an ended holder's id may come again:
        schedulers' ids wrap)."""
        check_states([state], HOLDER_STATES, "holder")
        if limit_s is not None and not (math.isfinite(limit_s) and limit_s > 0):
            raise ValueError(f"holder job {job_id}: time limit {limit_s!r} s is not positive")
        now = time.time() if now_s is None else now_s
        with self.transaction():
            live = self._query(
                "SELECT job_id FROM holders WHERE node = ? AND state != 'ended'", (node,)
            )
            if live:
                raise HolderConflictError(
                    f"node {node} already has live holder job {live[0]['job_id']}"
                )
            try:
                self._conn.execute(
                    "INSERT INTO holders (job_id, node, state, submit_s, started_s,"
                    " ended_s, trainer_id, limit_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        job_id,
                        node,
                        state,
                        now,
                        now if state == "running" else None,
                        now if state == "ended" else None,
                        trainer_id,
                        limit_s,
                    ),
                )
            except sqlite3.IntegrityError as exc:
                raise HolderConflictError(f"holder job {job_id} for {node}: {exc}") from None
            return self.holder(job_id)

    def holder(self, job_id: str) -> HolderRow:
        """The holder of ``job_id``: the live one, or the latest to end."""
        return holder_from_row(self.path, self._latest_holder(job_id))

    def _latest_holder(self, job_id: str) -> sqlite3.Row:
        rows = self._query(
            "SELECT * FROM holders WHERE job_id = ? ORDER BY seq DESC LIMIT 1", (job_id,)
        )
        if not rows:
            raise UnknownHolderError(job_id)
        return rows[0]

    def holders(self, *, live_only: bool = True) -> list[HolderRow]:
        """Holders not yet ended (or all of them), oldest first."""
        where = "WHERE state != 'ended'" if live_only else ""
        rows = self._query(f"SELECT * FROM holders {where} ORDER BY submit_s, seq")
        return [holder_from_row(self.path, r) for r in rows]

    def set_holder_state(
        self, job_id: str, state: str, *, reason: str = "", now_s: float | None = None
    ) -> HolderRow:
        """Move a holder pending -> running -> ended (or pending -> ended). Setting the
        state it is in is a no-op; going back is a ``TransitionError``."""
        check_states([state], HOLDER_STATES, "holder")
        now = time.time() if now_s is None else now_s
        with self.transaction():
            found = self._latest_holder(job_id)
            row = holder_from_row(self.path, found)
            if state == row.state:
                return row
            if state not in HOLDER_NEXT[row.state]:
                raise TransitionError(f"holder job {job_id} cannot go from {row.state} to {state}")
            self._conn.execute(
                "UPDATE holders SET state = ?, reason = ?,"
                " started_s = CASE WHEN ? = 'running' THEN ? ELSE started_s END,"
                " ended_s = CASE WHEN ? = 'ended' THEN ? ELSE ended_s END WHERE seq = ?",
                (state, reason or row.reason, state, now, state, now, found["seq"]),
            )
            return self.holder(job_id)

    def assign_holder(self, job_id: str, trainer_id: str | None) -> HolderRow:
        """Say which trainer a holder's node serves now (None: none)."""
        with self.transaction():
            seq = self._latest_holder(job_id)["seq"]
            if trainer_id is not None:
                self.trainer(trainer_id)
            self._conn.execute("UPDATE holders SET trainer_id = ? WHERE seq = ?", (trainer_id, seq))
            return self.holder(job_id)

    # ------------------------------------------------------------- pool events

    def add_pool_event(
        self,
        *,
        joined: Iterable[str] = (),
        left: Iterable[str] = (),
        windows_s: Mapping[str, float | None] | None = None,
        stale: bool = False,
        now_s: float | None = None,
    ) -> PoolEventRow:
        now = time.time() if now_s is None else now_s
        j, lft, w = tuple(sorted(joined)), tuple(sorted(left)), dict(windows_s or {})
        with self.transaction():
            cur = self._conn.execute(
                "INSERT INTO pool_events (time_s, joined, left_nodes, windows, stale)"
                " VALUES (?, ?, ?, ?, ?)",
                (now, to_json(list(j)), to_json(list(lft)), to_json(w), int(stale)),
            )
        return PoolEventRow(int(cur.lastrowid or 0), now, j, lft, w, stale)

    def pool_events(self, *, after_id: int = 0, limit: int | None = None) -> list[PoolEventRow]:
        """Pool events with id > ``after_id``, oldest first."""
        sql = "SELECT * FROM pool_events WHERE id > ? ORDER BY id"
        params: list[object] = [after_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [pool_event_from_row(self.path, r) for r in self._query(sql, params)]

    def last_pool_event(self) -> PoolEventRow | None:
        rows = self._query("SELECT max(id) FROM pool_events")
        last = rows[0][0]
        return None if last is None else self.pool_events(after_id=last - 1, limit=1)[0]

    # ------------------------------------------------------------- orders

    def add_orders(self, record: str, *, now_s: float) -> int:
        """Keep a step's orders (in its transaction); their step number."""
        with self.transaction():
            cur = self._conn.execute(
                "INSERT INTO orders (time_s, record) VALUES (?, ?)", (now_s, record)
            )
        return int(cur.lastrowid or 0)

    def orders(self, *, undone_only: bool = True) -> list[OrdersRow]:
        """The kept orders, oldest first: those not yet carried out, or all kept."""
        where = " WHERE done_s IS NULL" if undone_only else ""
        return [
            OrdersRow(r["step"], r["time_s"], r["record"], r["done_s"])
            for r in self._query(f"SELECT * FROM orders{where} ORDER BY step")
        ]

    def orders_done(self, *, now_s: float, keep: int) -> None:
        """Mark every kept order carried out; keep the last ``keep`` steps' orders (a
        journal: what a step ordered, for a person reading the store), not all."""
        with self.transaction():
            self._conn.execute("UPDATE orders SET done_s = ? WHERE done_s IS NULL", (now_s,))
            self._conn.execute(
                "DELETE FROM orders WHERE step <= (SELECT max(step) FROM orders) - ?", (keep,)
            )

    # ------------------------------------------------------------- metrics

    def add_metric(
        self, trainer_id: str, record: Mapping[str, Any], *, now_s: float | None = None
    ) -> MetricRow:
        now = time.time() if now_s is None else now_s
        with self.transaction():
            self.trainer(trainer_id)
            cur = self._conn.execute(
                "INSERT INTO metrics (trainer_id, time_s, record) VALUES (?, ?, ?)",
                (trainer_id, now, to_json(dict(record))),
            )
        return MetricRow(int(cur.lastrowid or 0), trainer_id, now, dict(record))

    def metrics(self, trainer_id: str, *, after_id: int = 0) -> list[MetricRow]:
        rows = self._query(
            "SELECT * FROM metrics WHERE trainer_id = ? AND id > ? ORDER BY id",
            (trainer_id, after_id),
        )
        return [metric_from_row(self.path, r) for r in rows]

    # ------------------------------------------------------------- checks

    def check_records(self) -> None:
        """Read every record a daemon restores from (the trainers, the live holders, the
        current allocations, the settings, the last pool event): a damaged one is named
        when the daemon starts (``DamagedRecordError``), not by a traceback at a step."""
        self.trainers()
        self.holders(live_only=True)
        self.current_allocations()
        self.settings()
        self.last_pool_event()

    # ------------------------------------------------------------- settings

    def get_setting(self, key: str, default: Any = None) -> Any:
        rows = self._query("SELECT key, value FROM settings WHERE key = ?", (key,))
        return setting_from_row(self.path, rows[0]) if rows else default

    def set_setting(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable daemon setting."""
        with self.transaction():
            self._conn.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, to_json(value)),
            )

    def settings(self) -> dict[str, Any]:
        rows = self._query("SELECT key, value FROM settings")
        return {r["key"]: setting_from_row(self.path, r) for r in rows}
