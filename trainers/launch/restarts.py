"""A trainer's restarts: one budget, kept in its directory, for whoever restarts it.

A trainer is started again after a failure that is not its own script's (its workers
lost to a crash, its supervisor killed) at most ``MAX_RESTARTS`` times in a row without
a new commit in between: a trainer that commits between failures is making progress
and is never given up, one that cannot get past its checkpoint is, after the third try.

Two parts restart a trainer and both take from this one budget: the supervisor, when
its workers end (torchrun's agents restart nothing themselves, ``--max-restarts=0``;
Horovod's own recovery, a rollback to the in-memory commit, is not a restart), and the
daemon, when the supervisor itself is gone. The count lives in the trainer directory
(``restarts.json``), so a supervisor started again continues it instead of starting a
fresh one. A lost host is not a failure: the trainer goes on without it, uncounted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bftrainer.common import strict_json
from bftrainer.trainers import channel

MAX_RESTARTS = 3
RESTARTS = "restarts.json"


@dataclass(frozen=True)
class Restart:
    """One restart asked for: its number since the last commit, and whether it may run."""

    number: int
    allowed: bool
    why: str

    def gave_up(self) -> str:
        """The failure's reason, in one line, once the budget is spent."""
        return (
            f"gave up after {self.number - 1} restarts without a new commit; the last: {self.why}"
        )


def _commit_of(trainer_dir: Path) -> int | None:
    """The last commit, as its checkpoint's modification time (None before the first)."""
    try:
        return (trainer_dir / channel.CHECKPOINT).stat().st_mtime_ns
    except FileNotFoundError:
        return None


def take(trainer_dir: Path, why: str) -> Restart:
    """Count one restart of the trainer in ``trainer_dir`` for ``why``.

    A directory that is gone (deleted by hand: the trainer starts over from nothing) has
    a fresh budget. One that cannot be written raises ``OSError``: the trainer could not
    commit there either, so its caller fails it rather than restart it without a bound.
    """
    if not trainer_dir.is_dir():
        return Restart(1, True, why)
    commit = _commit_of(trainer_dir)
    try:
        recorded = channel.read_json(trainer_dir / RESTARTS)
    except channel.ChannelError:  # not ours (we write it whole): counted afresh
        recorded = None
    count = 0
    if isinstance(recorded, dict) and recorded.get("commit") == commit:
        kept = recorded.get("count")
        count = kept if isinstance(kept, int) and kept >= 0 else 0
    number = count + 1
    record = {"commit": commit, "count": number, "last": why}
    channel.write_text_atomic(trainer_dir / RESTARTS, strict_json.dumps(record) + "\n")
    return Restart(number, number <= MAX_RESTARTS, why)
