"""scripts/slurm/local-cluster.sh trusts only its caller's own state folder and signals
only the daemons it started (issue 10). These run the script with their own folder and
ports, never touching a cluster on the default ones."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLUSTER_SCRIPT

IS_ROOT = os.geteuid() == 0
HAS_SLURM = all(shutil.which(p) for p in ("slurmctld", "slurmd", "sinfo"))


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _ports() -> tuple[int, int, int]:
    """Ports no cluster of this machine uses: slurmctld, slurmd, and a base whose two
    node ports (base+1, base+2) are free. Fixed ports would meet another test run's
    cluster (concurrent sessions each run their own)."""
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        ctld, slurmd = a.getsockname()[1], b.getsockname()[1]
    for base in range(30000, 60000, 7):
        if all(_free(base + i) for i in (1, 2)) and {ctld, slurmd}.isdisjoint({base + 1, base + 2}):
            return ctld, slurmd, base
    raise AssertionError("no two free consecutive ports between 30001 and 60000")


PORTS = _ports()


def script(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SLURM_LOCAL_DIR": str(state),
        "SLURM_LOCAL_CTLD_PORT": str(PORTS[0]),
        "SLURM_LOCAL_SLURMD_PORT": str(PORTS[1]),
        "SLURM_LOCAL_NODE_PORT": str(PORTS[2]),
        "NNODES": "2",
        "SLURM_LOCAL_INSTALL": "0",
    }
    return subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120
    )


def daemons_using(state: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", str(state)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "slurm" in line and "pgrep" not in line]


@pytest.mark.skipif(not IS_ROOT, reason="needs root to make a folder owned by another user")
@pytest.mark.parametrize("command", ["start", "stop", "status"])
def test_a_state_folder_owned_by_someone_else_is_refused(tmp_path: Path, command: str) -> None:
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    (state / "slurm.conf").write_text("SlurmctldHost=evil\n")
    os.chown(state, 65534, 65534)  # nobody: as if another user had made it first
    done = script(state, command)
    assert done.returncode == 1, done.stderr
    assert "owned by uid 65534, not by you" in done.stderr
    assert done.stdout == ""
    assert not daemons_using(state)


def test_a_state_folder_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    state = tmp_path / "state"
    state.symlink_to(target)
    done = script(state, "start")
    assert done.returncode == 1
    assert "symlink or not a folder" in done.stderr
    assert list(target.iterdir()) == []


def test_status_does_not_create_the_state_folder(tmp_path: Path) -> None:
    done = script(tmp_path / "state", "status")
    assert done.returncode == 1
    assert not (tmp_path / "state").exists()


@pytest.fixture
def decoys(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a pid file might name: one not a slurmd, one a 'slurmd' of another
    configuration. Neither may be signalled."""
    other_conf = tmp_path / "other" / "slurm.conf"
    sleeper = "import time; time.sleep(300)"
    procs = [
        subprocess.Popen([sys.executable, "-c", sleeper]),
        subprocess.Popen(
            ["slurmd", "-c", sleeper, "-f", str(other_conf)], executable=sys.executable
        ),
    ]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_stop_signals_no_pid_that_is_not_its_own_daemon(
    tmp_path: Path, decoys: list[subprocess.Popen[bytes]]
) -> None:
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    (state / "run" / "slurmctld.pid").write_text(f"{decoys[0].pid}\n")
    (state / "run" / "slurmd-node1.pid").write_text(f"{decoys[1].pid}\n")
    (state / "run" / "slurmd-node2.pid").write_text("1\n")  # init
    (state / "run" / "slurmd-node3.pid").write_text("$(touch pwned)\n")
    done = script(state, "stop")
    assert done.returncode == 0, done.stderr
    assert all(p.poll() is None for p in decoys), "a decoy was signalled"
    assert done.stderr.count("not signalling the pid") == 4
    assert not (Path.cwd() / "pwned").exists()


@pytest.mark.slurm
@pytest.mark.skipif(not (IS_ROOT and HAS_SLURM), reason="needs root and Slurm's packages")
def test_start_makes_a_private_folder_and_stop_stops_its_daemons(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        done = script(state, "start")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"SLURM_CONF={state}/slurm.conf"
        assert (state.stat().st_mode & 0o777) == 0o700
        assert state.stat().st_uid == os.geteuid()
        assert len(daemons_using(state)) == 3  # slurmctld and two slurmd
        assert script(state, "status").returncode == 0
    finally:
        stopped = script(state, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not daemons_using(state)
