"""The daemon's durable state: one SQLite database (WAL mode) in an owner-only directory.

Everything the daemon must not forget lives here: the trainers and their queue, the
allocations handed to them, the holder jobs that keep their nodes, the pool events, the
metrics the trainers reported, and a few daemon settings. The daemon writes; ``submit``,
``status`` and ``cancel`` run from other processes at the same time (WAL lets readers go
on while a writer commits; writers wait for each other up to the busy timeout).

Every write is committed with ``synchronous=FULL`` before the method returns, so whatever
the daemon acts on after a call is on disk: a process killed with SIGKILL loses nothing
it committed. Writes that must go together (a daemon step) share one
``with store.transaction():`` block: inside it no method commits, and the block commits
once at its end, or leaves nothing when it raises or the process dies first.

One daemon per state directory: ``DaemonLock`` holds an exclusive ``flock`` on
``daemon.lock`` for the daemon's life, and ``daemon_running`` tells other commands
whether a daemon holds it.

The modules, from the bottom: ``errors``; ``directory`` (where the state lives and that it
is ours alone); ``lock`` (one daemon per directory); ``rows`` (what the store returns,
and which states may follow which); ``schema`` (tables, migrations, row encoding);
``database`` (the connection and ``transaction``); ``store`` (the tables' reads and
writes). Callers import from ``bftrainer.state``.
"""

from bftrainer.state.database import BUSY_TIMEOUT_S, read_again
from bftrainer.state.directory import (
    DB_NAME,
    ENV_STATE_DIR,
    check_state_dir,
    ensure_state_dir,
    resolve_state_dir,
    trainer_dir,
)
from bftrainer.state.errors import (
    DaemonRunningError,
    DamagedRecordError,
    HolderConflictError,
    InvalidTrainerError,
    SchemaError,
    StateBusyError,
    StateDirError,
    StateError,
    StoreChangedError,
    TransitionError,
    UnknownHolderError,
    UnknownTrainerError,
)
from bftrainer.state.lock import LOCK_NAME, DaemonLock, daemon_running
from bftrainer.state.rows import (
    BACKENDS,
    DEFAULT_RESCALE_S,
    HOLDER_STATES,
    TERMINAL_STATES,
    TRAINER_STATES,
    AllocationRow,
    HolderRow,
    MetricRow,
    OrdersRow,
    PoolEventRow,
    TrainerRow,
    trainer_id_of,
)
from bftrainer.state.schema import MIGRATIONS, SCHEMA_VERSION
from bftrainer.state.store import Store

__all__ = [
    "BACKENDS",
    "BUSY_TIMEOUT_S",
    "DB_NAME",
    "DEFAULT_RESCALE_S",
    "ENV_STATE_DIR",
    "HOLDER_STATES",
    "LOCK_NAME",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "TRAINER_STATES",
    "AllocationRow",
    "DaemonLock",
    "DaemonRunningError",
    "DamagedRecordError",
    "HolderConflictError",
    "HolderRow",
    "InvalidTrainerError",
    "MetricRow",
    "OrdersRow",
    "PoolEventRow",
    "SchemaError",
    "StateBusyError",
    "StateDirError",
    "StateError",
    "Store",
    "StoreChangedError",
    "TrainerRow",
    "TransitionError",
    "UnknownHolderError",
    "UnknownTrainerError",
    "check_state_dir",
    "daemon_running",
    "ensure_state_dir",
    "read_again",
    "resolve_state_dir",
    "trainer_dir",
    "trainer_id_of",
]
