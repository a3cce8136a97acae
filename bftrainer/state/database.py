"""One state database opened, checked and migrated, and the transaction that groups writes.

The mechanism under ``Store``: which SQLite connection (WAL, ``synchronous=FULL``, or a
read-only one that writes nothing), which schema version, and ``transaction``, the one
way to make several writes one commit.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from bftrainer.state.directory import (
    DB_NAME,
    blame_the_directory_if_read_only,
    check_db_file,
    check_existing_db,
    check_state_dir,
    ensure_state_dir,
    file_identity,
    read_only_uri,
)
from bftrainer.state.errors import (
    DAMAGED_HINT,
    SchemaError,
    StateBusyError,
    StateDirError,
    StateError,
    StoreChangedError,
)
from bftrainer.state.schema import MIGRATIONS, SCHEMA_VERSION, TABLES, VIEWS, statements

log = logging.getLogger(__name__)
T = TypeVar("T")

BUSY_TIMEOUT_S = 30.0


# Pauses before a read-only open looks again at a -wal and -shm that a writer made or
# deleted while it opened (``Database.open``): a genuine fault is named 0.26 s later.
READ_ONLY_RETRIES_S = (0.01, 0.05, 0.2)
# Pauses before ``read_again`` reads afresh a store that changed under its read.
READ_AGAIN_S = (0.05, 0.2, 0.5, 1.0)
SQLITE_READONLY, SQLITE_CANTOPEN = 8, 14  # SQLite's primary result codes


def _text(data: bytes) -> str | bytes:
    """A TEXT value as str; one that is not UTF-8 stays bytes, for the row's check to
    name its field (SQLite's own decoding fails the whole query, naming no row)."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return data


@functools.cache
def expected_columns() -> dict[str, tuple[str, ...]]:
    """Each table's columns at SCHEMA_VERSION: those of a database built afresh by the
    migrations, in memory (once per process)."""
    conn = sqlite3.connect(":memory:")
    try:
        for script in MIGRATIONS:
            for statement in statements(script):
                conn.execute(statement)
        return {
            table: tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall())
            for table in TABLES
        }
    finally:
        conn.close()


def _raced_a_writer(exc: sqlite3.DatabaseError) -> bool:
    """The errors a read-only open gets when a writer makes or deletes the -wal and -shm
    it chose by: it could not open them, or would have had to create one."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (SQLITE_READONLY, SQLITE_CANTOPEN)


def read_again(read: Callable[[], T]) -> T:
    """``read()`` (which opens the store read-only and reads it), done afresh after a
    short pause while a writer changes the files under it (``StoreChangedError``: a
    daemon or ``submit`` opened or closed the store right then). The last try's error
    is raised, 1.75 s after the first."""
    for pause_s in (*READ_AGAIN_S, None):
        try:
            return read()
        except StoreChangedError:
            if pause_s is None:
                raise
        time.sleep(pause_s)
    raise AssertionError("unreachable: the last try returns or raises")


class Database:
    """One connection to ``<state_dir>/state.db``, behind a lock; ``Store`` adds the tables.

    Safe to share between threads of one process; other processes open their own.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        unchanged: tuple[int, ...] | None = None,
        *,
        read_only: bool = False,
        wait_for_writers: bool = False,
    ) -> None:
        self._conn = conn
        self.path = path
        self._read_only = read_only
        self._lock = threading.RLock()
        self._depth = 0
        self._unchanged = unchanged  # read as immutable: the file's identity when opened
        # The daemon: another process holding the write lock past the busy timeout is
        # waited for (said once), not a StateBusyError that ends the daemon.
        self.wait_for_writers = wait_for_writers

    # ------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        state_dir: Path,
        *,
        create: bool = True,
        read_only: bool = False,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
        wait_for_writers: bool = False,
    ) -> Self:
        """Open ``<state_dir>/state.db``, migrated to this version; with ``create`` (the
        daemon, ``submit``) the directory and database are made if missing, without it
        (``status``, ``cancel``) a missing one is a ``StateDirError``. ``read_only``
        (``status``, ``logs``, ``report``; implies not ``create``): no byte of the state
        directory is written, see ``read_only_uri``.

        ``wait_for_writers`` (the daemon): a write waits for as long as another process
        holds the write lock, saying so once, instead of ``StateBusyError`` after
        ``busy_timeout_s``.

        Raises ``StateDirError`` for a directory that is not ours alone and
        ``SchemaError`` for a database that is not ours, is newer than this code, or
        lacks a table.
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
            check_db_file(path)
        else:
            check_state_dir(state_dir)
            check_existing_db(path, state_dir)
        for retry_s in (*READ_ONLY_RETRIES_S, None):
            unchanged = None
            if read_only:
                uri, immutable = read_only_uri(path)
                unchanged = file_identity(path) if immutable else None
                conn = sqlite3.connect(
                    uri,
                    timeout=busy_timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                    uri=True,
                )
            else:
                conn = sqlite3.connect(
                    path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
                )
            conn.row_factory = sqlite3.Row
            conn.text_factory = _text
            store = cls(
                conn, path, unchanged, read_only=read_only, wait_for_writers=wait_for_writers
            )
            try:
                store._setup(busy_timeout_s, create=create)
            except sqlite3.DatabaseError as exc:
                conn.close()
                # A reader chooses how to read by the -wal and -shm it finds; a writer
                # that opens or closes right then makes or deletes them under it
                # ("unable to open database file", "attempt to write a readonly
                # database"): look again a little later and choose anew.
                if read_only and retry_s is not None and _raced_a_writer(exc):
                    time.sleep(retry_s)
                    continue
                blame_the_directory_if_read_only(state_dir, exc)
                raise SchemaError(
                    f"{path} is not a usable bftrainer state database: {exc}"
                ) from None
            except BaseException:
                conn.close()
                raise
            return store
        raise AssertionError("unreachable: the last try returns or raises")

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
            self._check_tables()
            return
        mode = c.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise SchemaError(f"{self.path}: cannot switch to WAL mode (got {mode!r})")
        c.execute("PRAGMA synchronous = FULL")  # a commit is on disk when it returns
        c.execute("PRAGMA foreign_keys = ON")
        self._migrate()
        self._check_tables()

    def _check_tables(self) -> None:
        """Every table and view of this version is there, each table with its columns
        (one line naming the first missing one, instead of a traceback at the first read
        or write of it)."""
        have = {
            (r[0], r[1])
            for r in self._conn.execute("SELECT type, name FROM sqlite_master").fetchall()
        }
        for kind, names in (("table", TABLES), ("view", VIEWS)):
            for name in names:
                if (kind, name) not in have:
                    raise SchemaError(
                        f"{self.path} has no {kind} {name!r} (schema version "
                        f"{SCHEMA_VERSION}): {DAMAGED_HINT}"
                    )
        for table, columns in expected_columns().items():
            found = {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})").fetchall()}
            for column in columns:
                if column not in found:
                    raise SchemaError(
                        f"{self.path}: table {table!r} has no column {column!r} (schema "
                        f"version {SCHEMA_VERSION}): {DAMAGED_HINT}"
                    )

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
                for statement in statements(MIGRATIONS[v]):
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
        if self._unchanged is not None and file_identity(self.path) != self._unchanged:
            raise StoreChangedError(f"{self.path} changed while it was read: run the command again")

    def __enter__(self) -> Self:
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
        """Group writes into one commit: everything inside lands together or not at all.

        Outside any block every write method commits on its own. Inside
        ``with store.transaction():`` none does: the outermost block commits once when it
        ends, and rolls everything back when it raises; a process that dies first leaves
        nothing of it. This is how a daemon step is written as one step.

        An inner block (every write method opens one) is a savepoint: when it raises, its
        own writes are undone and the outer block may catch the error and go on. Should
        SQLite roll back the whole transaction after an error (an interrupted write does),
        every later write in the block and the block's end raise ``StateError``, so that
        no write of the step commits on its own.

        Takes the write lock at the start (``BEGIN IMMEDIATE``), so a read-then-write
        inside never sees a row another process changes before the commit. Holds the
        store's thread lock to the end: other threads wait, and never read what is not
        committed. Keep a block to writes and act after it: other processes' writers
        (``submit``, ``cancel``) wait for its commit.
        """
        with self._lock:
            if self._depth:
                with self._savepoint():
                    yield
                return
            self._begin()
            self._depth = 1
            try:
                yield
                self._check_not_lost()
            except BaseException:
                self._depth = 0
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            self._depth = 0
            try:
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _begin(self) -> None:
        """``BEGIN IMMEDIATE``: the write lock, waited for up to the busy timeout, or for
        as long as it takes with ``wait_for_writers`` (one warning, one line when done)."""
        waited_s: float | None = None
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if not self.wait_for_writers:
                    raise StateBusyError(
                        f"{self.path} stayed locked by another process: {exc}"
                    ) from None
                if waited_s is None:
                    waited_s = time.monotonic()
                    log.warning(
                        "%s: another process holds the write lock; waiting for it "
                        "(nothing is lost meanwhile)",
                        self.path,
                    )
        if waited_s is not None:
            log.info(
                "%s: the write lock is free again after %.0f s; going on",
                self.path,
                time.monotonic() - waited_s,
            )

    @contextlib.contextmanager
    def _savepoint(self) -> Iterator[None]:
        """A block inside a block: undone alone when it raises."""
        self._check_not_lost()
        name = f"s{self._depth}"
        self._conn.execute(f"SAVEPOINT {name}")
        self._depth += 1
        try:
            yield
            self._check_not_lost()
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute(f"ROLLBACK TO {name}")
                self._conn.execute(f"RELEASE {name}")
            raise
        finally:
            self._depth -= 1
        self._conn.execute(f"RELEASE {name}")

    def _check_not_lost(self) -> None:
        """Inside a block, the transaction must still be open: SQLite ends it by itself
        after some errors (an interrupt, a full disk), and a write after that would
        commit alone."""
        if not self._conn.in_transaction:
            raise StateError(
                f"{self.path}: SQLite rolled back this transaction after an earlier error;"
                " nothing of it is written"
            )

    def _query(self, sql: str, params: Sequence[object] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                # A read-only connection chose how to read by the -wal and -shm at its
                # open; a writer that opened or closed since made or deleted them.
                if self._read_only and _raced_a_writer(exc):
                    raise StoreChangedError(
                        f"{self.path} changed while it was read (a writer opened or closed "
                        "it): run the command again"
                    ) from None
                raise
