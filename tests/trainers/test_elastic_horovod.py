"""Elastic Horovod backend, real processes: grow and shrink, worker loss, zero hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bftrainer.trainers.launch import remote
from tests.conftest import SshServer, wait_until
from tests.trainers.elastic_harness import (
    DATASET,
    FAST_COMMITS,
    Trainer,
    assert_exact_epochs,
    horovod_missing,
    launched,
    scenario_rescale,
    scenario_two_slots_per_host,
    scenario_worker_killed,
    scenario_worker_leaves,
    scenario_zero_hosts_and_restart,
    start_trainer,
)

__all__ = ["launched"]

pytestmark = pytest.mark.skipif(horovod_missing() is not None, reason=str(horovod_missing()))


@pytest.mark.slow
def test_rescale_1_3_2_1(launched: list[Trainer], tmp_path: Path) -> None:
    scenario_rescale(launched, tmp_path, "horovod")


@pytest.mark.slow
def test_two_slots_per_host(launched: list[Trainer], tmp_path: Path) -> None:
    scenario_two_slots_per_host(launched, tmp_path, "horovod")


@pytest.mark.slow
def test_worker_killed_costs_at_most_the_steps_since_the_last_commit(
    launched: list[Trainer], tmp_path: Path
) -> None:
    scenario_worker_killed(launched, tmp_path, "horovod")


@pytest.mark.slow
def test_zero_hosts_and_stop_resume_from_the_checkpoint(
    launched: list[Trainer], tmp_path: Path
) -> None:
    scenario_zero_hosts_and_restart(launched, tmp_path, "horovod")


def ssh_args(sshd: SshServer) -> list[str]:
    """ssh's arguments that reach the test's sshd for any host name."""
    return [
        "-p", str(sshd.port), "-i", str(sshd.key), "-l", sshd.user,
        "-o", f"HostName={sshd.host}", "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={sshd.known_hosts}",
        "-o", f"HostKeyAlias=[{sshd.host}]:{sshd.port}",
    ]  # fmt: skip


def start_with_ssh(launched: list[Trainer], tmp_path: Path, sshd: SshServer, work: int) -> Trainer:
    """A trainer on localhost, stepping, whose other hosts are reached over ssh."""
    t = start_trainer(
        tmp_path,
        "horovod",
        ["localhost"],
        work=work,
        args=FAST_COMMITS,
        env={"BFTRAINER_HOROVOD_NIC": "lo"},  # 127.0.0.2 is this machine after all
    )
    launched.append(t)
    t.launcher.set_exec("ssh", {}, ssh_args(sshd))
    t.wait_reset(1, 0)
    return t


@pytest.mark.slow
@pytest.mark.sshd
def test_a_host_reached_over_ssh(launched: list[Trainer], tmp_path: Path, sshd: SshServer) -> None:
    """127.0.0.2 is not this machine's name: Horovod reaches it through the ssh shim,
    which runs the real ssh with exec.json's arguments (to the test's sshd)."""
    remote_host = "127.0.0.2"
    t = start_with_ssh(launched, tmp_path, sshd, work=12_000)
    t.launcher.set_hosts(["localhost", remote_host])
    t.wait_reset(2, 1)
    t.launcher.set_hosts(["localhost"])
    result = t.finish()
    assert result["samples"] == t.work
    assert_exact_epochs(t, DATASET)
    assert f"bftrainer ssh shim: {remote_host} via ssh" in (t.dir / "supervisor.log").read_text()


@pytest.mark.slow
@pytest.mark.sshd
def test_kill_reaches_a_worker_started_over_ssh(
    launched: list[Trainer], tmp_path: Path, sshd: SshServer
) -> None:
    """Launcher.kill ends the workers Horovod started over ssh too (sshd's children,
    not the supervisor's): a killed trainer leaves nothing running on any host."""
    t = start_with_ssh(launched, tmp_path, sshd, work=200_000)
    t.launcher.set_hosts(["localhost", "127.0.0.2"])
    t.wait_reset(2, 1)
    outside = [p for p in t.processes_anywhere() if p not in remote.descendants(t.launcher.pid)]
    assert outside, "no process of the trainer outside the supervisor's tree (none over ssh?)"
    t.launcher.kill()
    wait_until(lambda: not t.processes_anywhere(), 30, "every process of the trainer gone")


@pytest.mark.slow
def test_a_worker_given_sigterm_leaves_and_the_others_go_on_at_once(
    launched: list[Trainer], tmp_path: Path
) -> None:
    reset_s = scenario_worker_leaves(launched, tmp_path, "horovod")
    print(f"SIGTERM -> survivors' reset on 2 hosts: {reset_s:.1f} s")
