"""Faults of the daemon's own host, on the real local Slurm: a full disk under the state
directory gives one clear line and a clean stop, and nothing recorded is lost."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.state import StateError, Store
from tests.conftest import REPO, SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm]


def test_a_full_disk_stops_the_daemon_with_one_line_and_loses_nothing(
    slurm_cluster: SlurmCluster, tiny_fs: Path
) -> None:
    state = tiny_fs / "state"
    env = {**os.environ, **slurm_cluster.env, "PYTHONPATH": str(REPO)}
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bftrainer",
            "daemon",
            "--scheduler",
            "slurm",
            "--bf-partition",
            "bf",
            "--job-name",
            "bftrainer-faults-test",
            "--state-dir",
            str(state),
            "--poll-interval",
            "0.5",
            "--env",
            f"SLURM_CONF={slurm_cluster.conf}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until(lambda: (state / "daemon.lock").exists(), 30, "the daemon up")
        wait_until(lambda: _pool_recorded(state), 30, "the daemon's first record")
        filler = tiny_fs / "filler"
        # Unbuffered: a buffered file keeps the tail of a short write, and its close
        # fails on the full disk (as soon as the store's size moves the last write off
        # a 64 KiB boundary).
        with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
        log, _ = daemon.communicate(timeout=60)
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, 9)
            daemon.wait(timeout=10)
    assert daemon.returncode == 1, log
    assert "Traceback" not in log, log
    lines = [line for line in log.splitlines() if "cannot be written" in line]
    assert len(lines) == 1 and "start the daemon again" in lines[0], log
    print(lines[0])
    (tiny_fs / "filler").unlink()
    # What was recorded before the disk filled is intact, and the store opens clean.
    with Store.open(state) as store:
        assert store.get_setting("pool")["time_s"] is not None
        assert store._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _pool_recorded(state: Path) -> bool:
    try:
        with Store.open(state) as store:
            return store.get_setting("pool") is not None
    except StateError:
        return False
