"""Output folders that never mix an earlier run's files with this one's.

A command writes into a fresh temporary folder beside ``--out`` and renames it into
place only when everything was written: an interrupted run leaves the earlier output
as it was, and a finished one replaces it whole (no subfolder of an earlier run with
other policies survives beside the new ones). An existing folder is replaced only if
it is an earlier output of the same command (it holds ``marker``) or empty; any other
folder is refused, so ``--out .`` cannot delete a user's files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OutputDirError(ValueError):
    """``--out`` names something this command must not replace."""


def check_output_dir(out: Path, marker: str) -> None:
    """Refuse ``out`` up front (before a long run) unless it is new, empty or an
    earlier output of this command, which holds ``marker``."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise OutputDirError(f"{out}: exists and is not a folder")
    if any(out.iterdir()) and not (out / marker).is_file():
        raise OutputDirError(
            f"{out}: not empty and not an earlier output (no {marker}); "
            "choose a new or empty folder"
        )


@contextmanager
def replaced_on_success(out: Path, marker: str) -> Iterator[Path]:
    """Yield a temporary folder to write into; on success it becomes ``out``."""
    check_output_dir(out, marker)
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it 0700
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
