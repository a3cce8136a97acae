"""The state store's errors: one type per failure kind, all under ``StateError``.

A command catches ``StateError`` to print one line and exit; the daemon catches the
narrower ones (``HolderConflictError``, ``TransitionError``) where a step can go on.
"""

from __future__ import annotations

from pathlib import Path


class StateError(Exception):
    """Something is wrong with the state directory or its database."""


class StateDirError(StateError):
    """The state directory cannot be used: not a directory, another owner, writable by
    others, or cannot be created."""


class SchemaError(StateError):
    """The database is not a bftrainer state database this version can read."""


# What every "the store is damaged" line ends with: what the user can do about it.
DAMAGED_HINT = "the store is damaged; move it away to start afresh, or restore it from a copy"


class DamagedRecordError(StateError):
    """A row holds what bftrainer never writes there (text for a number, a negative
    count, JSON of another shape): named by store, table, row and field when the row is
    read, instead of a traceback wherever the value is used later."""

    def __init__(self, db: Path, table: str, record: str, field: str, problem: str) -> None:
        self.db, self.table, self.record, self.field = db, table, record, field
        super().__init__(f"{db}: {table} row {record}: {field} {problem}; {DAMAGED_HINT}")


class DaemonRunningError(StateError):
    """Another daemon holds the state directory's lock; ``pid`` is its process id."""

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        self.state_dir = state_dir
        self.pid = pid
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"a bftrainer daemon ({who}) already runs on state directory {state_dir}")


class UnknownTrainerError(StateError, KeyError):
    """No trainer has this id."""

    def __init__(self, trainer_id: str) -> None:
        self.trainer_id = trainer_id
        super().__init__(f"no trainer {trainer_id!r}")

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownHolderError(StateError, KeyError):
    """No holder has this job id."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no holder job {job_id!r}")

    def __str__(self) -> str:
        return str(self.args[0])


class TransitionError(StateError):
    """A state change that is not allowed (a done trainer cannot run again)."""


class InvalidTrainerError(StateError, ValueError):
    """A trainer submission with a bad field (limits, backend, ...), named."""


class HolderConflictError(StateError):
    """A node already has a live (pending or running) holder in the state."""


class StoreChangedError(StateError):
    """A store read as immutable changed while it was read (a daemon started and wrote):
    what was read may be torn; read it again."""


class StateBusyError(StateError):
    """Another process kept the database locked for longer than the busy timeout."""
