"""What bftrainer writes in a trainer directory, and the proof that a folder is one.

``bftrainer run --fresh`` removes an earlier run's files. It must never remove a user's
folder that merely holds a file named ``spec.json``: a folder is a trainer directory only
when its ``spec.json`` is a launch spec that names that very folder (``Launcher.start``
writes it so), and even then only the files below are removed; anything else stays.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bftrainer.trainers import channel
from bftrainer.trainers.launch.base import STOP_GRACE
from bftrainer.trainers.launch.restarts import RESTARTS

# The files the launcher, the supervisor and the workers write (launch/worker.py's
# failure record among them), and the folders the supervisor makes.
FILES = frozenset(
    {
        channel.SPEC,
        channel.HOSTS,
        channel.EXEC,
        channel.METRICS,
        channel.RESULT,
        channel.EXIT,
        channel.CHECKPOINT,
        channel.SUPERVISOR_PID,
        channel.SUPERVISOR_LOG,
        channel.STOP_REQUEST,
        channel.DISCOVERY_HOSTS,
        STOP_GRACE,
        RESTARTS,
        "failure.json",
        "discover-hosts.sh",  # Horovod's discovery script (launch/supervisor.py)
    }
)
# The folders the supervisor makes: the ssh shim's (launch/backends.py) and torchrun's
# --log-dir, in which each agent's run folder is "<trainer id>-<generation>_<suffix>".
FOLDERS = frozenset({"bin", "torchrun"})
SHIMS = frozenset({"ssh"})
SPEC_KEYS = frozenset({"trainer_id", "script", "args", "trainer_dir", "backend"})


def is_trainer_dir(folder: Path) -> bool:
    """Whether ``folder``'s ``spec.json`` is a launch spec written for ``folder`` itself."""
    spec = folder / channel.SPEC
    try:
        if spec.is_symlink() or not spec.is_file():
            return False
        data = json.loads(spec.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or not data.keys() >= SPEC_KEYS:
        return False
    written_for = data["trainer_dir"]
    return isinstance(written_for, str) and Path(written_for) == folder.resolve()


def _ours(entry: Path) -> bool:
    name = entry.name
    if entry.is_symlink():
        return False
    if entry.is_dir():
        return name in FOLDERS
    if name in FILES:
        return entry.is_file()
    # An atomic write's leftover: ".NAME.XXXX.tmp" (checkpoint.write_atomic).
    stem = name[1:].rsplit(".", 2)[0] if name.startswith(".") and name.endswith(".tmp") else ""
    return stem in FILES and entry.is_file()


def remove_own_files(folder: Path) -> list[str]:
    """Remove what bftrainer wrote in the trainer directory ``folder`` (see
    :func:`is_trainer_dir`); the names of what is left, in order (a user's file in one
    of our folders as ``bin/name``: the folder stays with it)."""
    trainer_id = json.loads((folder / channel.SPEC).read_text()).get("trainer_id")
    left = []
    for entry in sorted(folder.iterdir()):
        if not _ours(entry):
            left.append(entry.name)
        elif entry.is_dir():
            kept = _remove_inside(entry, str(trainer_id))
            left += [f"{entry.name}/{name}" for name in kept]
            if not kept:
                entry.rmdir()
        else:
            entry.unlink()
    return left


def _remove_inside(folder: Path, trainer_id: str) -> list[str]:
    """Remove what bftrainer wrote in one of its ``FOLDERS``; the names left."""
    left = []
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink():
            ours = False
        elif folder.name == "bin":
            ours = entry.name in SHIMS and entry.is_file()
        else:  # torchrun's run folders of this trainer's generations
            head, sep, _ = entry.name.rpartition("_")
            prefix, dash, generation = head.rpartition("-")
            ours = bool(sep and dash) and prefix == trainer_id and generation.isdigit()
            ours = ours and entry.is_dir()
        if not ours:
            left.append(entry.name)
        elif entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return left
