"""Atomic checkpoints: a reader sees the previous checkpoint or the new one, never half.

``torch.save`` goes to a temporary file in the same directory, which is flushed, fsynced
and renamed over the target; the directory is fsynced so the rename survives a crash.
"""

from __future__ import annotations

import logging
import os
import tempfile
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
