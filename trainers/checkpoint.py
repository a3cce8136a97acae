"""Atomic checkpoints: a reader sees the previous checkpoint or the new one, never half.

``torch.save`` goes to a temporary file in the same directory, which is flushed, fsynced
and renamed over the target; the directory is fsynced so the rename survives a crash.
:class:`CheckpointWriter` does that on a thread of its own, off the training loop.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

logger = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read (names the file)."""


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through ``fill(file)`` so that readers see the old file or the new
    one, never half: a temporary file beside it, fsynced, renamed over it, the directory
    fsynced so the rename survives a crash."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def save_checkpoint(state: Any, path: Path) -> None:
    """``torch.save(state)`` to ``path`` atomically."""
    import torch

    write_atomic(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path) -> Any | None:
    """The state saved at ``path``; None when there is no checkpoint yet."""
    import torch

    path = Path(path)
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load checkpoint: {e}") from e


class CheckpointWriter:
    """Writes checkpoints on a thread of its own, so that no step waits on the disk.

    One write at a time, and at most one waiting: a commit that arrives while the disk
    is still busy replaces the waiting one (the newer state supersedes it). A failed
    write is raised, naming the file, at the next :meth:`submit` or :meth:`wait`.
    :meth:`wait` returns once everything submitted is on disk (before a stop, a reset,
    the end of the work, or a read of the file).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: tuple[Any, Path] | None = None
        self._busy = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def submit(self, state: Any, path: Path) -> None:
        with self._cond:
            self._raise_error()
            self._waiting = (state, Path(path))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="bftrainer-checkpoint", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            while self._waiting is not None or self._busy:
                self._cond.wait()
            self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"checkpoint write failed: {error}") from error

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._waiting is None:
                    self._thread = None
                    self._cond.notify_all()
                    return
                state, path = self._waiting
                self._waiting = None
                self._busy = True
            try:
                save_checkpoint(state, path)
            except BaseException as e:  # raised on the training thread at its next call
                logger.warning("%s: checkpoint write failed: %s", path, e)
                with self._cond:
                    self._error = e
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
