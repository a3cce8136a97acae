"""A trainer's one restart budget: at most 3 restarts in a row without a new commit,
counted in its directory for the supervisor and the daemon alike."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bftrainer.trainers import channel
from bftrainer.trainers.launch import restarts
from bftrainer.trainers.launch.restarts import MAX_RESTARTS, take


def commit(trainer_dir: Path, at_ns: int) -> None:
    """A new checkpoint, as a commit leaves it (its modification time is the commit's)."""
    path = trainer_dir / channel.CHECKPOINT
    path.write_bytes(b"state")
    os.utime(path, ns=(at_ns, at_ns))


def test_three_restarts_without_a_commit_then_it_gives_up_naming_the_last(
    tmp_path: Path,
) -> None:
    taken = [take(tmp_path, f"crash {i}") for i in range(1, MAX_RESTARTS + 2)]
    assert [r.number for r in taken] == [1, 2, 3, 4]
    assert [r.allowed for r in taken] == [True, True, True, False]
    assert taken[-1].gave_up() == "gave up after 3 restarts without a new commit; the last: crash 4"


def test_a_new_commit_gives_a_fresh_budget(tmp_path: Path) -> None:
    commit(tmp_path, 1_000_000_000)
    for _ in range(MAX_RESTARTS):
        assert take(tmp_path, "crash").allowed
    commit(tmp_path, 2_000_000_000)  # progress between two failures
    again = take(tmp_path, "crash")
    assert (again.number, again.allowed) == (1, True)


def test_the_count_outlives_the_process_that_took_it(tmp_path: Path) -> None:
    """The daemon restarting a dead supervisor continues the supervisor's count."""
    code = (
        "import sys; from pathlib import Path; "
        "from bftrainer.trainers.launch.restarts import take; "
        "print(take(Path(sys.argv[1]), 'workers lost').number)"
    )
    numbers = [
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for _ in range(2)
    ]
    assert numbers == ["1", "2"]
    assert take(tmp_path, "supervisor killed").number == 3


def test_a_deleted_directory_starts_over_and_a_foreign_file_is_counted_afresh(
    tmp_path: Path,
) -> None:
    assert take(tmp_path / "gone", "its directory was deleted").number == 1
    (tmp_path / restarts.RESTARTS).write_text("not json")
    assert take(tmp_path, "crash").number == 1
