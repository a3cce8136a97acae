"""torchrun backend, real processes: grow and shrink, worker loss, zero hosts, stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bftrainer.trainers import channel
from bftrainer.trainers.launch import remote
from tests.trainers.elastic_harness import (
    EXAMPLE,
    HELD_STEP_S,
    LOCAL_HOSTS,
    RESCALE_TIMEOUT_S,
    Trainer,
    launched,
    scenario_rescale,
    scenario_two_slots_per_host,
    scenario_worker_killed,
    scenario_zero_hosts_and_restart,
    start_trainer,
)

__all__ = ["launched"]


@pytest.mark.slow
def test_rescale_1_3_2_1(launched: list[Trainer], tmp_path: Path) -> None:
    """... and each host's resident agent is started once, not at every generation (an
    import of torch per host: the rescale took 43 s here with an agent per generation,
    28 s with residents)."""
    t = scenario_rescale(launched, tmp_path, "torchrun")
    log = (t.dir / channel.SUPERVISOR_LOG).read_text().splitlines()
    residents = [x for x in log if "starting: " in x and x.endswith("torchrun_agent --resident")]
    marker = "torchrun generation "
    generations = {x.split(marker)[1].split()[0] for x in log if marker in x}
    assert len(residents) == len(LOCAL_HOSTS), residents
    assert len(generations) >= 4, generations  # 1, 3, 2, 1 hosts (and any restart)


@pytest.mark.slow
def test_a_generation_replaced_before_its_first_reset_ends_at_once(
    launched: list[Trainer], tmp_path: Path
) -> None:
    """A trainer's nodes come up one after another at its start: a generation replaced
    while its workers still start has nothing to commit and ends at once, not after the
    stop grace (600 s here, far past this test's wait)."""
    a, b, _ = LOCAL_HOSTS
    starting = tmp_path / "starting"  # the workers wait while it exists: a slow start
    starting.touch()
    t = start_trainer(
        tmp_path,
        "torchrun",
        [a],
        work=4_000,
        args=("--start-hold-file", str(starting)),
        env={"BFTRAINER_STOP_GRACE_S": "600"},
        held=False,
    )
    launched.append(t)
    t.wait_for(lambda: bool(t.worker_pids()), "the first generation's worker", RESCALE_TIMEOUT_S)
    first = t.worker_pids()
    assert not t.resets()
    t.launcher.set_hosts([a, b])
    t.wait_for(
        lambda: not any(remote.alive(pid) for pid in first), "the first generation's end", 60
    )
    starting.unlink()
    t.wait_reset(2, 0)
    result = t.finish()
    assert result["samples"] == t.work
    assert [r["nodes"] for r in t.resets()] == [2]


@pytest.mark.slow
def test_two_slots_per_host(launched: list[Trainer], tmp_path: Path) -> None:
    scenario_two_slots_per_host(launched, tmp_path, "torchrun")


@pytest.mark.slow
def test_worker_killed_costs_at_most_the_steps_since_the_last_commit(
    launched: list[Trainer], tmp_path: Path
) -> None:
    scenario_worker_killed(launched, tmp_path, "torchrun")


@pytest.mark.slow
def test_zero_hosts_and_stop_resume_from_the_checkpoint(
    launched: list[Trainer], tmp_path: Path
) -> None:
    scenario_zero_hosts_and_restart(launched, tmp_path, "torchrun")


@pytest.mark.slow
def test_bftrainer_run_ctrl_c_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    """Ctrl-C: the workers checkpoint, exit.json says stopped, the command exits 130; the
    same command resumes from that step."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    d = tmp_path / "run"
    hold = tmp_path / "hold"  # held until ^C; the resumed run goes at full speed
    hold.touch()
    argv = [
        sys.executable, "-m", "bftrainer", "run", "--backend", "torchrun", "--hosts-file",
        str(hosts), "--trainer-dir", str(d), str(EXAMPLE), "--work-samples", "6000",
        "--step-delay-s", str(HELD_STEP_S), "--hold-file", str(hold), "--commit-every-s", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + RESCALE_TIMEOUT_S
        while not (d / channel.CHECKPOINT).exists():
            assert time.monotonic() < deadline and proc.poll() is None, "no first commit"
            time.sleep(0.25)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            remote.kill_tree(proc.pid)
        if (d / channel.SUPERVISOR_PID).exists():
            remote.kill_tree(int((d / channel.SUPERVISOR_PID).read_text()))
    assert proc.returncode == 130, err
    assert (channel.read_exit(d) or {}).get("state") == "stopped"
    assert channel.read_result(d) is None
    stopped_at = torch.load(d / channel.CHECKPOINT, weights_only=False)["progress"]["step"]
    assert stopped_at > 0

    hold.unlink()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["samples"] == 6000
    resets, _ = channel.read_metrics(d, 0)
    steps = [r["step"] for r in resets if r["kind"] == "reset"]
    assert stopped_at in steps[1:], (stopped_at, steps)


SLOW_TO_STOP = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(signum, frame):
    (out / "stopping").write_text("")
    time.sleep(1.0)  # a commit that takes a while
    (out / "committed").write_text("")
    os._exit(143)
signal.signal(signal.SIGTERM, stop)
(out / "ready.tmp").write_text(str(os.getpid()))
os.replace(out / "ready.tmp", out / "ready")  # whole: the test reads it once it exists
while True:
    time.sleep(0.05)
"""


def test_a_second_sigterm_does_not_cut_the_agents_stop_short(tmp_path: Path) -> None:
    """Slurm signals every process of a step and the resident passes its own on: the
    agent gets SIGTERM twice. It still waits for its workers to commit and leave (torch's
    agent shuts them down again when a signal interrupts the first shutdown)."""
    from bftrainer.trainers.launch.backends import WORKER_FILE

    script = tmp_path / "slow_to_stop.py"
    script.write_text(SLOW_TO_STOP)
    argv = [
        sys.executable, "-m", "bftrainer.trainers.launch.torchrun_agent", "--standalone",
        "--nnodes=1", "--nproc-per-node=1", "--run-path", "--start-method=fork",
        WORKER_FILE, str(script), str(tmp_path),
    ]  # fmt: skip
    agent = subprocess.Popen(argv, start_new_session=True)
    try:
        deadline = time.monotonic() + RESCALE_TIMEOUT_S
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and agent.poll() is None, "no worker"
            time.sleep(0.05)
        worker = int((tmp_path / "ready").read_text())
        agent.send_signal(signal.SIGTERM)
        while not (tmp_path / "stopping").exists():  # the agent is stopping its worker
            assert time.monotonic() < deadline and agent.poll() is None, "worker not stopped"
            time.sleep(0.02)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 143
        assert (tmp_path / "committed").exists(), "the agent left before its worker"
        assert not remote.alive(worker)
    finally:
        remote.kill_tree(agent.pid)
        agent.wait(timeout=10)
