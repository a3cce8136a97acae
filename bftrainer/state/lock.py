"""One daemon per state directory: an exclusive ``flock`` on ``daemon.lock``.

The kernel drops the lock when the process dies, however it dies, so a stale file never
blocks a restart; ``daemon_running`` tells other commands whether a daemon holds it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

from bftrainer.state.errors import DaemonRunningError

LOCK_NAME = "daemon.lock"


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
