"""How the user commands reach a daemon's state directory: its store opened or read
with one clear line for each way it cannot be used (no daemon, not writable, full,
damaged, changed under a read), and a trainer id of this user (centre mode)."""

from __future__ import annotations

import errno
import os
import pwd
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import click

from bftrainer.cli import UsageError
from bftrainer.common.names import BadNameError, check_trainer_id
from bftrainer.state import (
    StateError,
    Store,
    StoreChangedError,
    check_state_dir,
    daemon_running,
    read_again,
    resolve_state_dir,
)

T = TypeVar("T")


def my_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def own_trainer(trainer_id: str, socket_dir: Path | None) -> str:
    """The local id of ``trainer_id`` (``t0001`` or, in centre mode, ``alice/t0001``);
    another user's trainer is asked of the allocator, which refuses it in one line."""
    user, sep, local = trainer_id.rpartition("/")
    try:
        check_trainer_id(local, "TRAINER_ID")
    except BadNameError as exc:
        raise UsageError(str(exc)) from None
    if not sep or socket_dir is None:
        return trainer_id
    if user != my_user():
        from bftrainer.centre import protocol
        from bftrainer.cli.centre_client import ask

        ask(socket_dir, protocol.STATUS, {"trainer": trainer_id})
    return local


@contextmanager
def open_store(
    state_dir: Path | None, *, need_daemon: bool, read_only: bool = False
) -> Iterator[Store]:
    """The store of an existing state directory; one clear line when it cannot be used.
    ``read_only``: nothing in the directory changes, and a store that changed under the
    read raises ``StoreChangedError`` (``read_store`` reads it again)."""
    path = resolve_state_dir(state_dir)
    try:
        check_state_dir(path)
    except StateError as exc:
        raise click.ClickException(
            f"{exc} (is a daemon set up? see bftrainer daemon --help)"
        ) from None
    if need_daemon and daemon_running(path) is None:
        raise click.ClickException(
            f"no bftrainer daemon is running for state directory {path}: start one with "
            "`bftrainer daemon --scheduler slurm|lsf` (docs/deployment.md)"
        )
    try:
        store = Store.open(path, create=False, read_only=read_only)
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield store
    except StoreChangedError:
        raise
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    except sqlite3.OperationalError as exc:
        if "readonly" in str(exc):
            raise click.ClickException(f"state directory {path} is not writable ({exc})") from None
        if disk_full(exc):
            raise click.ClickException(_full(path, exc)) from None
        raise click.ClickException(f"{store.path} is damaged: {exc!r}") from None
    except OSError as exc:
        if disk_full(exc):
            raise click.ClickException(_full(path, exc)) from None
        raise
    except (sqlite3.DatabaseError, ValueError, TypeError, KeyError, AttributeError) as exc:
        # Tables, columns and rows are checked where they are opened and read (a
        # StateError above, naming the row and field); this names what is left of a
        # store that is not as bftrainer wrote it. Never changed.
        raise click.ClickException(f"{store.path} is damaged: {exc!r}") from None
    finally:
        try:
            store.close()
        except StoreChangedError:
            raise
        except StateError as exc:
            raise click.ClickException(str(exc)) from None


def read_store(
    state_dir: Path | None, read: Callable[[Store], T], *, need_daemon: bool = False
) -> T:
    """``read(store)`` on a read-only open of an existing state directory (status, logs,
    cancel's look first): nothing in it changes. Opened and read afresh when a writer
    changed the files under the read (a daemon or ``submit`` opening or closing the store
    right then); one clear line when that goes on, or the store cannot be used."""

    def once() -> T:
        with open_store(state_dir, need_daemon=need_daemon, read_only=True) as store:
            return read(store)

    try:
        return read_again(once)
    except StoreChangedError as exc:
        raise click.ClickException(str(exc)) from None


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the file system (or the user's quota) has no room left."""
    if isinstance(exc, sqlite3.OperationalError):
        return getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL" or "disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _full(path: Path, exc: BaseException) -> str:
    what = "over quota" if getattr(exc, "errno", None) == errno.EDQUOT else "full"
    return (
        f"the disk holding state directory {path} is {what} ({exc}): nothing was changed; "
        "free some space and try again"
    )
