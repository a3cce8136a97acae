"""Output folders that never mix an earlier run's files with this one's.

A command writes into a fresh temporary folder beside ``--out`` and renames it into
place only when everything was written: an interrupted run leaves the earlier output
as it was, and a finished one replaces it whole (no subfolder of an earlier run with
other policies survives beside the new ones).

An existing folder is replaced only if it is empty or an earlier output of the same
command: it holds ``MARKER``, which only this module writes and which lists every file
written then. A file not in that list (a user's notes, a folder merely holding a
``summary.json``) makes the folder refused, so nothing bftrainer did not write is ever
removed. Both checks, and whether the folder can be made at all, come before the work.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bftrainer.common import strict_json

MARKER = ".bftrainer-output.json"


class OutputDirError(ValueError):
    """``--out`` names something this command must not replace or cannot create."""


def _written_files(out: Path) -> set[str]:
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() or p.is_symlink()}


def _nested_outputs(out: Path) -> set[str]:
    """Files of bftrainer outputs nested in ``out`` (a subfolder with its own marker
    listing them, e.g. ``bftrainer report``'s ``report/`` in a replay's folder): ours
    too, and stale once ``out`` is replaced."""
    own: set[str] = set()
    for marker in out.rglob(MARKER):
        sub = marker.parent
        if sub == out:
            continue
        try:
            files = json.loads(marker.read_text()).get("files")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(files, list):
            rel = sub.relative_to(out).as_posix()
            own |= {f"{rel}/{f}" for f in files} | {f"{rel}/{MARKER}"}
    return own


def _manifest(out: Path, command: str) -> set[str] | None:
    """The files listed by ``out``'s marker for ``command``; None if it has none."""
    try:
        data = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("command") != command:
        return None
    files = data.get("files")
    return {str(f) for f in files} if isinstance(files, list) else None


def check_output_dir(out: Path, command: str) -> None:
    """Refuse ``out`` up front (before a long run) unless it is new, empty or an
    earlier output of ``command`` with nothing added since, and its parent is writable."""
    if out.exists() or out.is_symlink():
        if out.is_symlink() or not out.is_dir():
            raise OutputDirError(f"{out}: exists and is not a folder")
        if any(out.iterdir()):
            listed = _manifest(out, command)
            if listed is None:
                raise OutputDirError(
                    f"{out}: not empty and not an earlier output of bftrainer {command} "
                    f"(no {MARKER}); choose a new or empty folder"
                )
            foreign = sorted(_written_files(out) - listed - {MARKER} - _nested_outputs(out))
            if foreign:
                raise OutputDirError(
                    f"{out}: holds {foreign[0]}, which bftrainer did not write; move it "
                    "or choose another folder"
                )
    check_can_create(out.absolute().parent)


def refuse_inputs_inside(out: Path, inputs: Iterable[tuple[str, str | Path | None]]) -> None:
    """Refuse up front an ``out`` that holds one of the command's inputs (by identity: a
    link, another spelling of the path): the new output replaces the folder whole, and
    the input with it, a file no command can rebuild."""
    if not out.is_dir():
        return
    root = out.resolve()
    for flag, given in inputs:
        if given is None or not Path(given).exists():
            continue
        path = Path(given).resolve()
        if path == root or root in path.parents:
            raise OutputDirError(
                f"{out}: holds {flag} {given}, which the new output would replace; move it "
                "or choose another folder"
            )


def check_can_create(folder: Path) -> None:
    """Refuse up front a ``folder`` that cannot be written into or made: the work of a
    long run is lost if this is found only when writing its results."""
    if folder.exists() or folder.is_symlink():
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise OutputDirError(f"{folder}: not a writable folder")
        return
    parent = folder.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputDirError(f"{folder}: cannot be created ({parent} is not a writable folder)")


@contextmanager
def replaced_on_success(out: Path, command: str) -> Iterator[Path]:
    """Yield a temporary folder to write into; on success it becomes ``out``."""
    check_output_dir(out, command)
    out = out.absolute()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(out)
        tmp = Path(
            tempfile.mkdtemp(
                prefix=f".{out.name}.{os.getpid()}.", suffix=".partial", dir=out.parent
            )
        )
    except OSError as e:
        raise OutputDirError(f"{out}: cannot be created: {e.strerror}") from None
    try:
        yield tmp
        files = sorted(_written_files(tmp))
        (tmp / MARKER).write_text(strict_json.dumps({"command": command, "files": files}, indent=1))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it 0700
        if out.exists():
            old = Path(
                tempfile.mkdtemp(
                    prefix=f".{out.name}.{os.getpid()}.", suffix=".old", dir=out.parent
                )
            )
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _remove_orphans(out: Path) -> None:
    """Remove the temporary folders that a killed run for ``out`` left beside it: named
    ``.<out>.<pid>.*.partial`` by a process that no longer runs. A folder of a run still
    going, or of another name, is left alone, and so is a ``.old`` one: a kill between
    the two renames of the swap leaves the earlier output there."""
    for tmp in out.parent.glob(f".{glob.escape(out.name)}.*.partial"):
        if not tmp.is_dir() or tmp.is_symlink():
            continue
        pid = tmp.name[len(out.name) + 2 :].split(".", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: running
    return True
