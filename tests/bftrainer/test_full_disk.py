"""A full disk is a full disk: submit and cancel on a state directory whose file
system has no room left say so in one line naming the path (they said "state.db is
damaged"), and the store stays as it was. A 2 MB tmpfs filled to the last byte (root
only; skipped where mount is not allowed); the daemon on the fake Slurm."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

from tests.bftrainer.fake_slurm import FakeDaemon, FakeSlurm

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def fill(fs: Path) -> None:
    """Write until the file system has no byte left."""
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def test_submit_and_cancel_on_a_full_disk_say_the_disk_is_full(
    tmp_path: Path, tiny_fs: Path
) -> None:
    slurm = FakeSlurm(tmp_path / "slurm", ["n1", "n2"])
    daemon = FakeDaemon(slurm, tiny_fs / "state", tmp_path / "daemon.log")
    try:
        # One poll: the daemon writes nothing more meanwhile (a poll of an hour needs a
        # holder lease of two at least: leases are renewed at the polls).
        config = tmp_path / "daemon.toml"
        config.write_text("[daemon]\nholder_lease_s = 7200.0\n")
        daemon.start("--config", str(config), poll_s=3600)
        first = daemon.submit(TRAINER)
        db = tiny_fs / "state" / "state.db"
        fill(tiny_fs)
        # Arguments too long for the room left: the row cannot be written.
        big = [f"--note{i}=" + "x" * 100_000 for i in range(4)]
        submit = daemon.cli("submit", str(TRAINER), "--backend", "torchrun", *big)
        cancel = daemon.cli("cancel", first)
        for done in (submit, cancel):
            assert done.returncode == 1, (done.stdout, done.stderr)
            assert "Traceback" not in done.stderr and "damaged" not in done.stderr, done.stderr
            (line,) = [ln for ln in done.stderr.splitlines() if ln.strip()]
            assert "full" in line and str(db.parent) in line, line
        (tiny_fs / "filler").unlink()
        trainers = {t["id"]: t for t in daemon.status()["trainers"]}
        assert list(trainers) == [first] and trainers[first]["state"] == "queued"
    finally:
        daemon.kill()


def test_run_on_a_full_disk_says_so_in_one_line(tmp_path: Path, tiny_fs: Path) -> None:
    (tmp_path / "hosts").write_text("localhost\n")
    fill(tiny_fs)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bftrainer", "run"),
            *("--backend", "torchrun", "--hosts-file", "hosts"),
            *("--trainer-dir", str(tiny_fs / "t"), str(TRAINER)),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    assert "No space left on device" in line and str(tiny_fs / "t") in line, line
