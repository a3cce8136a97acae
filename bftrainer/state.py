"""The daemon's durable state: one SQLite database (WAL mode) in an owner-only directory.

Everything the daemon must not forget lives here: the trainers and their queue, the
allocations handed to them, the holder jobs that keep their nodes, the pool events, the
metrics the trainers reported, and a few daemon settings. The daemon writes; ``submit``,
``status`` and ``cancel`` run from other processes at the same time (WAL lets readers go
on while a writer commits; writers wait for each other up to the busy timeout).

Every write is one transaction, committed with ``synchronous=FULL`` before the method
returns, so whatever the daemon acts on after a call is on disk: a process killed with
SIGKILL loses nothing it committed. Several writes that must go together share one
``with store.transaction():`` block.

One daemon per state directory: ``DaemonLock`` holds an exclusive ``flock`` on
``daemon.lock`` for the daemon's life (the kernel drops it when the process dies, however
it dies), and ``daemon_running`` tells other commands whether a daemon holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import re
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

DB_NAME = "state.db"
LOCK_NAME = "daemon.lock"
ENV_STATE_DIR = "BFTRAINER_STATE_DIR"
SCHEMA_VERSION = 4
BUSY_TIMEOUT_S = 30.0

TRAINER_STATES = ("queued", "running", "waiting", "done", "failed", "cancelled")
TERMINAL_STATES = frozenset({"done", "failed", "cancelled"})
# Which trainer state may follow which. `waiting`: started once, holds no node now (its
# workers checkpointed and stopped) and resumes when nodes come back.
_NEXT_STATES: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "waiting", "failed", "cancelled"}),
    "running": frozenset({"waiting", "done", "failed", "cancelled"}),
    "waiting": frozenset({"running", "done", "failed", "cancelled"}),
    "done": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}
BACKENDS = ("horovod", "torchrun")
# Seconds a grow / a shrink costs a trainer when the user does not say (the allocator's
# scale-up and scale-down costs), per backend: measured on 2 cores in
# ../shared/notes/elastic-backends.md and docs/benchmarks.md.
DEFAULT_RESCALE_S: dict[str, tuple[float, float]] = {
    "horovod": (15.0, 5.0),
    "torchrun": (20.0, 20.0),
}
HOLDER_STATES = ("pending", "running", "ended")
_HOLDER_NEXT: dict[str, frozenset[str]] = {
    "pending": frozenset({"running", "ended"}),
    "running": frozenset({"ended"}),
    "ended": frozenset(),
}


# ---------------------------------------------------------------------- errors


class StateError(Exception):
    """Something is wrong with the state directory or its database."""


class StateDirError(StateError):
    """The state directory cannot be used: not a directory, another owner, writable by
    others, or cannot be created."""


class SchemaError(StateError):
    """The database is not a bftrainer state database this version can read."""


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


class StateBusyError(StateError):
    """Another process kept the database locked for longer than the busy timeout."""


# ---------------------------------------------------------------------- the directory


def resolve_state_dir(
    option: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """The state directory: ``--state-dir`` if given, else ``$BFTRAINER_STATE_DIR``, else
    ``$XDG_STATE_HOME/bftrainer`` (``~/.local/state/bftrainer`` when unset or relative,
    as the XDG base-directory specification says). Absolute; not created here."""
    env = os.environ if env is None else env
    if option:
        return Path(option).expanduser().absolute()
    if env.get(ENV_STATE_DIR):
        return Path(env[ENV_STATE_DIR]).expanduser().absolute()
    xdg = env.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "bftrainer"


def check_state_dir(path: Path) -> None:
    """Refuse a state directory that is not ours alone: it holds the trainers' commands,
    so another user who can write there could run code as us."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise StateDirError(f"state directory {path} does not exist") from None
    except OSError as exc:
        raise StateDirError(f"cannot use state directory {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"state directory {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise StateDirError(
            f"state directory {path} belongs to uid {st.st_uid}, not to you (uid "
            f"{os.geteuid()}): use your own (--state-dir or ${ENV_STATE_DIR})"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateDirError(
            f"state directory {path} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):03o}): run `chmod 700 {path}`"
        )


def _check_existing_db(path: Path, state_dir: Path) -> None:
    """For the commands that only read or flag: the database must already be a file
    with content; they never create one."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise StateDirError(f"no bftrainer state in {state_dir} (no {DB_NAME})") from None
    except OSError as exc:
        raise StateDirError(f"cannot use {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StateDirError(f"{path} is not a regular file (a folder?): not a state database")
    if st.st_size == 0:
        raise SchemaError(f"{path} is empty (0 bytes): not a bftrainer state database")


def _blame_the_directory_if_read_only(state_dir: Path, exc: sqlite3.Error) -> None:
    """SQLite says "readonly database" or "unable to open" when it is the directory that
    cannot be written (its -wal and -shm files live there): name the directory."""
    if not os.access(state_dir, os.W_OK | os.X_OK) or "readonly" in str(exc):
        raise StateDirError(f"state directory {state_dir} is not writable ({exc})") from None


def ensure_state_dir(path: Path) -> Path:
    """Create the state directory (mode 0700, parents as needed) or check the existing
    one (``check_state_dir``). Returns it."""
    if not path.exists():
        try:
            path.mkdir(parents=True, mode=0o700)
        except FileExistsError:
            pass  # another process created it first; checked below
        except OSError as exc:
            raise StateDirError(f"cannot create state directory {path}: {exc.strerror}") from None
        else:
            path.chmod(0o700)  # mkdir's mode goes through the umask
    check_state_dir(path)
    return path


# ---------------------------------------------------------------------- the daemon lock


def _read_only_uri(db: Path) -> tuple[str, bool]:
    """A URI that reads ``db`` and writes nothing, and whether it reads it as immutable.

    SQLite's plain read-only mode still creates -wal and -shm files when they are
    missing and writes read marks into -shm, and a read-write connection checkpoints the
    WAL into state.db and deletes both on close. With a -wal and -shm (a daemon runs, or
    was killed), ``readonly_shm`` reads the WAL through a read-only -shm. With no -wal
    (the daemon stopped cleanly: state.db holds every commit), ``immutable`` reads the
    file alone, without locks; ``Store.close`` then checks that it did not change. A -wal
    without its -shm (rare) can only be read by making the -shm: plain read-only mode.
    """
    wal, shm = (Path(f"{db}{suffix}").exists() for suffix in ("-wal", "-shm"))
    base = "file:" + urllib.parse.quote(str(db.absolute())) + "?mode=ro"
    if not wal:
        return base + "&immutable=1", True
    return (base + "&readonly_shm=1" if shm else base), False


def _identity(path: Path) -> tuple[int, ...]:
    st = path.stat()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class DaemonLock:
    """An exclusive ``flock`` on ``<state_dir>/daemon.lock``, held while the daemon lives.

    The file holds the daemon's pid for ``daemon_running``. The kernel releases the lock
    when the process ends, even by SIGKILL, so a stale file never blocks a restart.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> DaemonLock:
        """Take the lock or raise ``DaemonRunningError`` at once (never waits)."""
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DaemonRunningError(self.state_dir, _read_pid(self.path)) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (the pid stays in the file; it means nothing without the lock)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> DaemonLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def daemon_running(state_dir: Path) -> int | None:
    """The pid of the daemon holding ``state_dir``'s lock, or None when no daemon does.

    (0 when a process holds the lock but its pid could not be read.)
    """
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return _read_pid(path) or 0
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- rows


@dataclass(frozen=True)
class TrainerRow:
    """One trainer: what was submitted, where it stands, what it last reported."""

    id: str
    script: str
    args: tuple[str, ...]
    backend: str
    min_nodes: int
    max_nodes: int
    work_samples: int | None
    rescale_up_s: float
    rescale_down_s: float
    state: str
    submitted_s: float
    started_s: float | None
    finished_s: float | None
    cancel_requested: bool
    samples_done: int
    throughput_sps: float | None
    goodput_sps: float | None
    batch_size: int | None
    reason: str
    trainer_dir: str | None
    # The running supervisor's handle; None before the first start and while a restart
    # is pending (Store.decide_restart).
    supervisor: str | None
    # Times the daemon started the trainer's supervisor again after it died or gave up
    # for a reason other than the trainer's own script.
    restarts: int = 0

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class AllocationRow:
    """The node set given to a trainer at ``time_s`` (empty: no node). With S slots per
    node (``--slots-per-node``) a node is listed once per slot, and ``slots`` says which
    slots of each node (0..S-1, in the order the trainer got them); empty at S = 1."""

    trainer_id: str
    nodes: tuple[str, ...]
    time_s: float
    slots: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class HolderRow:
    """One holder job keeping one node, and the trainer it serves (None: none yet)."""

    job_id: str
    node: str
    state: str
    submitted_s: float
    started_s: float | None = None
    ended_s: float | None = None
    trainer_id: str | None = None
    reason: str = ""
    # The time limit asked for (None: none); the scheduler ends the holder this long
    # after it starts.
    limit_s: float | None = None

    @property
    def live(self) -> bool:
        return self.state != "ended"

    def ends_by_s(self, poll_interval_s: float = 0.0) -> float | None:
        """When the scheduler ends this holder at the latest (None: no limit, or not
        started). ``started_s`` is when the daemon saw it run, up to a poll after it
        did: ``poll_interval_s`` takes that back, so that the end is never late."""
        if self.limit_s is None or self.started_s is None:
            return None
        return self.started_s - poll_interval_s + self.limit_s


@dataclass(frozen=True)
class PoolEventRow:
    """A change of the pool as the daemon saw it; ``windows_s``: node -> seconds left
    (None: open-ended) for the nodes in the pool after the change."""

    id: int
    time_s: float
    joined: tuple[str, ...]
    left: tuple[str, ...]
    windows_s: dict[str, float | None]
    stale: bool


@dataclass(frozen=True)
class MetricRow:
    """One metrics record a trainer reported (``metrics.jsonl``'s ``record``)."""

    id: int
    trainer_id: str
    time_s: float
    record: dict[str, Any]


# ---------------------------------------------------------------------- the schema

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
)
assert len(MIGRATIONS) == SCHEMA_VERSION


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _trainer(row: sqlite3.Row) -> TrainerRow:
    return TrainerRow(
        id=row["id"],
        script=row["script"],
        args=tuple(json.loads(row["args"])),
        backend=row["backend"],
        min_nodes=row["min_nodes"],
        max_nodes=row["max_nodes"],
        work_samples=row["work_samples"],
        rescale_up_s=row["rescale_up_s"],
        rescale_down_s=row["rescale_down_s"],
        state=row["state"],
        submitted_s=row["submitted_s"],
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
    )


def _allocation(trainer_id: str, row: sqlite3.Row) -> AllocationRow:
    slots = json.loads(row["slots"]) if row["slots"] else {}
    return AllocationRow(
        trainer_id,
        tuple(json.loads(row["nodes"])),
        row["time_s"],
        {n: tuple(s) for n, s in slots.items()},
    )


def _holder(row: sqlite3.Row) -> HolderRow:
    return HolderRow(
        job_id=row["job_id"],
        node=row["node"],
        state=row["state"],
        submitted_s=row["submitted_s"],
        started_s=row["started_s"],
        ended_s=row["ended_s"],
        trainer_id=row["trainer_id"],
        reason=row["reason"],
        limit_s=row["limit_s"],
    )


def trainer_dir(state_dir: Path, trainer_id: str) -> Path:
    """``<state_dir>/trainers/<id>/``, the trainer's directory when the daemon runs it
    (see the contract of the trainer directory), created owner-only."""
    if not re.fullmatch(r"t\d{4,}", trainer_id):
        raise ValueError(f"bad trainer id {trainer_id!r}")
    path = state_dir / "trainers" / trainer_id
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def trainer_id_of(seq: int) -> str:
    """``t0001``: short; zero-padded to 4 digits so ids sort by submission up to t9999
    (beyond, sort by ``(len(id), id)``, as ``Store.trainers`` does by sequence)."""
    return f"t{seq:04d}"


# ---------------------------------------------------------------------- the store


class Store:
    """The state database of one state directory. Open with ``Store.open(state_dir)``.

    Safe to share between threads of one process (one connection behind a lock); other
    processes open their own ``Store``. Times are epoch seconds; methods that record a
    time take ``now_s`` (default: ``time.time()``).
    """

    def __init__(
        self, conn: sqlite3.Connection, path: Path, unchanged: tuple[int, ...] | None = None
    ) -> None:
        self._conn = conn
        self.path = path
        self._lock = threading.RLock()
        self._depth = 0
        self._unchanged = unchanged  # read as immutable: the file's identity when opened

    # ------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        state_dir: Path,
        *,
        create: bool = True,
        read_only: bool = False,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
    ) -> Store:
        """Open ``<state_dir>/state.db``, migrated to this version; with ``create`` (the
        daemon, ``submit``) the directory and database are made if missing, without it
        (``status``, ``cancel``) a missing one is a ``StateDirError``. ``read_only``
        (``status``, ``logs``, ``report``; implies not ``create``): no byte of the state
        directory is written, see ``_read_only_uri``.

        Raises ``StateDirError`` for a directory that is not ours alone and
        ``SchemaError`` for a database that is not ours or is newer than this code.
        """
        path = state_dir / DB_NAME
        if read_only:
            create = False
        if create:
            ensure_state_dir(state_dir)
            if not os.access(state_dir, os.W_OK | os.X_OK):
                raise StateDirError(f"state directory {state_dir} is not writable")
            # Create the file owner-only; SQLite gives its -wal and -shm files that mode.
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        else:
            check_state_dir(state_dir)
            _check_existing_db(path, state_dir)
        unchanged = None
        if read_only:
            uri, immutable = _read_only_uri(path)
            unchanged = _identity(path) if immutable else None
            conn = sqlite3.connect(
                uri, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False, uri=True
            )
        else:
            conn = sqlite3.connect(
                path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        conn.row_factory = sqlite3.Row
        store = cls(conn, path, unchanged)
        try:
            store._setup(busy_timeout_s, create=create)
        except sqlite3.DatabaseError as exc:
            conn.close()
            _blame_the_directory_if_read_only(state_dir, exc)
            raise SchemaError(f"{path} is not a usable bftrainer state database: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return store

    def _setup(self, busy_timeout_s: float, *, create: bool = True) -> None:
        c = self._conn
        c.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        if not create:
            # status, cancel, logs: never create, migrate or convert; say what is wrong.
            c.execute("PRAGMA foreign_keys = ON")
            version = self._check_version()
            if version != SCHEMA_VERSION:
                raise SchemaError(
                    f"{self.path} has schema version {version}, not {SCHEMA_VERSION}: "
                    + (
                        "not a bftrainer state database"
                        if version == 0
                        else "start the daemon of this version once to migrate it"
                    )
                )
            check = [r[0] for r in c.execute("PRAGMA quick_check(3)").fetchall()]
            if check != ["ok"]:
                raise SchemaError(f"{self.path} fails SQLite's integrity check: {'; '.join(check)}")
            return
        mode = c.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise SchemaError(f"{self.path}: cannot switch to WAL mode (got {mode!r})")
        c.execute("PRAGMA synchronous = FULL")  # a commit is on disk when it returns
        c.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    def _migrate(self) -> None:
        # Checked first without the write lock: opening an up-to-date database (status,
        # cancel) never waits for the daemon's writes.
        if self._check_version() == SCHEMA_VERSION:
            return
        with self.transaction():
            version = self._check_version()  # another process may have migrated meanwhile
            if version == 0:
                tables = self._conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                ).fetchone()[0]
                if tables:
                    raise SchemaError(
                        f"{self.path} holds tables but no bftrainer schema version: "
                        "not a bftrainer state database"
                    )
            for v in range(version, SCHEMA_VERSION):
                log.info("migrating %s from schema version %d to %d", self.path, v, v + 1)
                for statement in _statements(MIGRATIONS[v]):
                    self._conn.execute(statement)
            if version != SCHEMA_VERSION:
                self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _check_version(self) -> int:
        version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"{self.path} has schema version {version}, newer than this bftrainer "
                f"understands ({SCHEMA_VERSION}): upgrade bftrainer, or use another "
                "state directory"
            )
        return version

    def close(self) -> None:
        """Close; a store read as immutable raises ``StateError`` if the file changed
        meanwhile (a daemon started and checkpointed): what was read may be torn."""
        with self._lock:
            self._conn.close()
        if self._unchanged is not None and _identity(self.path) != self._unchanged:
            raise StateError(f"{self.path} changed while it was read: run the command again")

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    # ------------------------------------------------------------- transactions

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic, durable write: everything inside commits together or not at all.

        Takes the write lock at the start (``BEGIN IMMEDIATE``), so a read-then-write
        inside never sees a row another process changes before the commit. Nests: an inner
        block joins the outer one.
        """
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) or "busy" in str(exc):
                    raise StateBusyError(
                        f"{self.path} stayed locked by another process: {exc}"
                    ) from None
                raise
            self._depth = 1
            try:
                yield
            except BaseException:
                self._depth = 0
                self._conn.execute("ROLLBACK")
                raise
            self._depth = 0
            try:
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _query(self, sql: str, params: Sequence[object] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    # ------------------------------------------------------------- trainers

    def submit(
        self,
        script: str | os.PathLike[str],
        args: Sequence[str] = (),
        *,
        backend: str = "horovod",
        min_nodes: int = 1,
        max_nodes: int = 1,
        work_samples: int | None = None,
        rescale_up_s: float = 0.0,
        rescale_down_s: float = 0.0,
        now_s: float | None = None,
    ) -> str:
        """Queue a trainer; returns its id (``t0001``, ...), committed."""
        if backend not in BACKENDS:
            raise InvalidTrainerError(f"backend {backend!r}: expected one of {BACKENDS}")
        if min_nodes < 1:
            raise InvalidTrainerError(f"min_nodes {min_nodes}: must be at least 1")
        if max_nodes < min_nodes:
            raise InvalidTrainerError(f"max_nodes {max_nodes} is below min_nodes {min_nodes}")
        if work_samples is not None and work_samples <= 0:
            raise InvalidTrainerError(f"work_samples {work_samples}: must be positive")
        if rescale_up_s < 0 or rescale_down_s < 0:
            raise InvalidTrainerError(
                f"rescale costs must be >= 0 s, got up {rescale_up_s}, down {rescale_down_s}"
            )
        args = [str(a) for a in args]
        now = time.time() if now_s is None else now_s
        with self.transaction():
            cur = self._conn.execute(
                "INSERT INTO trainers (id, script, args, backend, min_nodes, max_nodes,"
                " work_samples, rescale_up_s, rescale_down_s, state, submitted_s)"
                " VALUES ('', ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?)",
                (
                    os.fspath(script),
                    _json(args),
                    backend,
                    min_nodes,
                    max_nodes,
                    work_samples,
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
        return _trainer(rows[0])

    def trainers(self, states: Iterable[str] | None = None) -> list[TrainerRow]:
        """All trainers (or those in ``states``), in submission order."""
        if states is None:
            rows = self._query("SELECT * FROM trainers ORDER BY seq")
        else:
            wanted = list(states)
            _check_states(wanted, TRAINER_STATES, "trainer")
            marks = ",".join("?" * len(wanted))
            rows = self._query(
                f"SELECT * FROM trainers WHERE state IN ({marks}) ORDER BY seq", wanted
            )
        return [_trainer(r) for r in rows]

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
        (see ``_NEXT_STATES``). The first ``running`` sets ``started_s``; a final state
        sets ``finished_s``. Moving to the state it is in only updates ``reason``."""
        _check_states([state], TRAINER_STATES, "trainer")
        now = time.time() if now_s is None else now_s
        with self.transaction():
            row = self.trainer(trainer_id)
            if state != row.state and state not in _NEXT_STATES[row.state]:
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
                    _json(list(alloc.nodes)),
                    _json({n: list(s) for n, s in kept.items()}) if kept else None,
                ),
            )
        return alloc

    def current_allocations(self) -> dict[str, AllocationRow]:
        """trainer id -> its latest allocation (trainers never allocated are absent)."""
        rows = self._query("SELECT trainer_id, time_s, nodes, slots FROM current_allocations")
        return {r["trainer_id"]: _allocation(r["trainer_id"], r) for r in rows}

    def current_allocation(self, trainer_id: str) -> tuple[str, ...]:
        """The nodes a trainer holds now (empty if none or never allocated)."""
        rows = self._query(
            "SELECT nodes FROM current_allocations WHERE trainer_id = ?", (trainer_id,)
        )
        return tuple(json.loads(rows[0]["nodes"])) if rows else ()

    def allocation_history(self, trainer_id: str) -> list[AllocationRow]:
        rows = self._query(
            "SELECT time_s, nodes, slots FROM allocations WHERE trainer_id = ? ORDER BY id",
            (trainer_id,),
        )
        return [_allocation(trainer_id, r) for r in rows]

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
        ``limit_s`` (None: none). ``HolderConflictError`` when the node already has a
        live holder in the state."""
        _check_states([state], HOLDER_STATES, "holder")
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
                    "INSERT INTO holders (job_id, node, state, submitted_s, started_s,"
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
        rows = self._query("SELECT * FROM holders WHERE job_id = ?", (job_id,))
        if not rows:
            raise UnknownHolderError(job_id)
        return _holder(rows[0])

    def holders(self, *, live_only: bool = True) -> list[HolderRow]:
        """Holders not yet ended (or all of them), oldest first."""
        where = "WHERE state != 'ended'" if live_only else ""
        rows = self._query(f"SELECT * FROM holders {where} ORDER BY submitted_s, job_id")
        return [_holder(r) for r in rows]

    def set_holder_state(
        self, job_id: str, state: str, *, reason: str = "", now_s: float | None = None
    ) -> HolderRow:
        """Move a holder pending -> running -> ended (or pending -> ended). Setting the
        state it is in is a no-op; going back is a ``TransitionError``."""
        _check_states([state], HOLDER_STATES, "holder")
        now = time.time() if now_s is None else now_s
        with self.transaction():
            row = self.holder(job_id)
            if state == row.state:
                return row
            if state not in _HOLDER_NEXT[row.state]:
                raise TransitionError(f"holder job {job_id} cannot go from {row.state} to {state}")
            self._conn.execute(
                "UPDATE holders SET state = ?, reason = ?,"
                " started_s = CASE WHEN ? = 'running' THEN ? ELSE started_s END,"
                " ended_s = CASE WHEN ? = 'ended' THEN ? ELSE ended_s END WHERE job_id = ?",
                (state, reason or row.reason, state, now, state, now, job_id),
            )
            return self.holder(job_id)

    def assign_holder(self, job_id: str, trainer_id: str | None) -> HolderRow:
        """Say which trainer a holder's node serves now (None: none)."""
        with self.transaction():
            self.holder(job_id)
            if trainer_id is not None:
                self.trainer(trainer_id)
            self._conn.execute(
                "UPDATE holders SET trainer_id = ? WHERE job_id = ?", (trainer_id, job_id)
            )
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
                (now, _json(list(j)), _json(list(lft)), _json(w), int(stale)),
            )
        return PoolEventRow(int(cur.lastrowid or 0), now, j, lft, w, stale)

    def pool_events(self, *, after_id: int = 0, limit: int | None = None) -> list[PoolEventRow]:
        """Pool events with id > ``after_id``, oldest first."""
        sql = "SELECT * FROM pool_events WHERE id > ? ORDER BY id"
        params: list[object] = [after_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [
            PoolEventRow(
                r["id"],
                r["time_s"],
                tuple(json.loads(r["joined"])),
                tuple(json.loads(r["left_nodes"])),
                json.loads(r["windows"]),
                bool(r["stale"]),
            )
            for r in self._query(sql, params)
        ]

    def last_pool_event(self) -> PoolEventRow | None:
        rows = self._query("SELECT max(id) FROM pool_events")
        last = rows[0][0]
        return None if last is None else self.pool_events(after_id=last - 1, limit=1)[0]

    # ------------------------------------------------------------- metrics

    def add_metric(
        self, trainer_id: str, record: Mapping[str, Any], *, now_s: float | None = None
    ) -> MetricRow:
        now = time.time() if now_s is None else now_s
        with self.transaction():
            self.trainer(trainer_id)
            cur = self._conn.execute(
                "INSERT INTO metrics (trainer_id, time_s, record) VALUES (?, ?, ?)",
                (trainer_id, now, _json(dict(record))),
            )
        return MetricRow(int(cur.lastrowid or 0), trainer_id, now, dict(record))

    def metrics(self, trainer_id: str, *, after_id: int = 0) -> list[MetricRow]:
        rows = self._query(
            "SELECT * FROM metrics WHERE trainer_id = ? AND id > ? ORDER BY id",
            (trainer_id, after_id),
        )
        return [
            MetricRow(r["id"], r["trainer_id"], r["time_s"], json.loads(r["record"])) for r in rows
        ]

    # ------------------------------------------------------------- settings

    def get_setting(self, key: str, default: Any = None) -> Any:
        rows = self._query("SELECT value FROM settings WHERE key = ?", (key,))
        return json.loads(rows[0]["value"]) if rows else default

    def set_setting(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable daemon setting."""
        with self.transaction():
            self._conn.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, _json(value)),
            )

    def settings(self) -> dict[str, Any]:
        return {r["key"]: json.loads(r["value"]) for r in self._query("SELECT * FROM settings")}


def _check_states(states: Iterable[str], known: Sequence[str], what: str) -> None:
    for s in states:
        if s not in known:
            raise ValueError(f"unknown {what} state {s!r}: expected one of {', '.join(known)}")


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (no ';' inside our literals)."""
    return [s.strip() for s in script.split(";") if s.strip()]
