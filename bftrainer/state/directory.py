"""The state directory: where it is, that it is ours alone, and how to read it untouched.

It holds the trainers' commands, so a directory another user can write is refused (they
could run code as us). The read-only commands (``status``, ``logs``, ``report``) must not
write a byte there: ``read_only_uri`` says how SQLite can read it that way.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from bftrainer.common.names import not_regular
from bftrainer.state.errors import SchemaError, StateDirError

DB_NAME = "state.db"
ENV_STATE_DIR = "BFTRAINER_STATE_DIR"


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


def check_existing_db(path: Path, state_dir: Path) -> None:
    """For the commands that only read or flag: the database must already be a file
    with content; they never create one."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise StateDirError(f"no bftrainer state in {state_dir} (no {DB_NAME})") from None
    except OSError as exc:
        raise StateDirError(f"cannot use {path}: {exc.strerror}") from None
    _check_regular(path, st.st_mode)
    if st.st_size == 0:
        raise SchemaError(f"{path} is empty (0 bytes): not a bftrainer state database")


def check_db_file(path: Path) -> None:
    """For the commands that create the database when missing (the daemon, ``submit``),
    once it exists: a regular file, looked at before SQLite opens it (given a FIFO or a
    folder it fails with a bare "disk I/O error" or "unable to open")."""
    try:
        st = path.stat()
    except OSError as exc:
        raise StateDirError(f"cannot use {path}: {exc.strerror}") from None
    _check_regular(path, st.st_mode)


def _check_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise StateDirError(f"{not_regular(path, mode)}: not a state database")


def blame_the_directory_if_read_only(state_dir: Path, exc: sqlite3.Error) -> None:
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


def read_only_uri(db: Path) -> tuple[str, bool]:
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


def file_identity(path: Path) -> tuple[int, ...]:
    """What changes when a file is rewritten (inode, size, mtime): how a store read as
    immutable sees that a daemon wrote meanwhile."""
    st = path.stat()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def trainer_dir(state_dir: Path, trainer_id: str) -> Path:
    """``<state_dir>/trainers/<id>/``, the trainer's directory when the daemon runs it
    (docs/trainers.md, "The trainer directory"), created owner-only."""
    if not re.fullmatch(r"t\d{4,}", trainer_id):
        raise ValueError(f"bad trainer id {trainer_id!r}")
    path = state_dir / "trainers" / trainer_id
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path
