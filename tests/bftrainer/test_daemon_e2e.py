"""The daemon end to end on the real 8-node Slurm: holders, real elastic trainers, main
jobs that take nodes and give them back, and a daemon killed -9 mid-run.

What a centre relies on, asserted here: every main job starts within seconds of its
submission; trainers shrink when nodes leave and grow when they return; each allocation
satisfies the allocator's constraints; each trainer finishes with exactly the work asked;
a daemon killed -9 and restarted re-attaches without restarting the trainers and loses
no committed step.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bftrainer.state import Store
from bftrainer.trainers import channel
from bftrainer.trainers.launch.base import Launcher, LaunchError
from tests.conftest import REPO, SlurmCluster, wait_until
from tests.trainers.elastic_harness import horovod_missing

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "train_mlp.py"
BFTRAINER = [sys.executable, "-m", "bftrainer"]
POLL_S = 1.0
# A main job must start this soon after submission (measured: 1-4 s; the holder's
# workers exit on SIGTERM at once).
MAIN_START_LIMIT_S = 15.0


class Service:
    """A daemon started by a test, and what it can be asked; cleans up by PID."""

    def __init__(self, cluster: SlurmCluster, state_dir: Path, log_dir: Path) -> None:
        self.cluster = cluster
        self.state_dir = state_dir
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.main_jobs: list[str] = []

    @property
    def env(self) -> dict[str, str]:
        # Every "node" of the local cluster is this machine on 127.0.0.1: name the NIC,
        # as a site names its interconnect, so that horovodrun does not probe each host's
        # interfaces at every start (that probe timed out at a load average of 16).
        return {
            **os.environ,
            **self.cluster.env,
            "PYTHONPATH": str(REPO),
            "BFTRAINER_HOROVOD_NIC": "lo",
            "HOROVOD_START_TIMEOUT": "120",
        }

    def start(self, policy: str = "milp") -> None:
        """Start the daemon; ``policy`` milp decides from the trainers' reported curves
        (speedup), equal gives each trainer an equal share whatever they report."""
        self.starts += 1
        config = self.log_dir / "daemon.toml"
        config.write_text(
            f'[policy]\npolicy = "{policy}"\nobjective = "speedup"\nredecide_every_s = 10.0\n'
        )
        log = (self.log_dir / f"daemon-{self.starts}.log").open("ab")
        self.proc = subprocess.Popen(
            [
                *BFTRAINER,
                "-v",
                "daemon",
                "--scheduler",
                "slurm",
                "--bf-partition",
                "bf",
                "--env",
                f"SLURM_CONF={self.cluster.conf}",
                "--state-dir",
                str(self.state_dir),
                "--config",
                str(config),
                "--poll-interval",
                str(POLL_S),
                "--horizon",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        wait_until(lambda: (self.state_dir / "daemon.lock").exists(), 30, "the daemon's lock")
        wait_until(lambda: self.status()["daemon"]["pid"] == self.proc.pid, 30, "daemon up")

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [*BFTRAINER, *args, "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"bftrainer {' '.join(args)}: {done.stderr}"
        return done.stdout

    def status(self) -> dict[str, Any]:
        return json.loads(self.cli("status", "--json"))

    def trainer(self, trainer_id: str) -> dict[str, Any]:
        return next(t for t in self.status()["trainers"] if t["id"] == trainer_id)

    def submit(self, backend: str, work: int, max_nodes: int, *extra: str) -> str:
        out = self.cli(
            "submit",
            str(EXAMPLE),
            "--backend",
            backend,
            "--min-nodes",
            "1",
            "--max-nodes",
            str(max_nodes),
            "--work-samples",
            str(work),
            *extra,
        )
        return out.strip().splitlines()[-1]

    def main_job(self, nodes: list[str], seconds: int) -> tuple[str, float]:
        """Submit a main-partition job on ``nodes``; its id and seconds to RUNNING."""
        t0 = time.monotonic()
        job = self.cluster.sbatch(
            "-p",
            "main",
            "-N",
            str(len(nodes)),
            "-w",
            ",".join(nodes),
            "-t",
            "2",
            "--wrap",
            f"sleep {seconds}",
        )
        self.main_jobs.append(job)
        wait_until(
            lambda: self.cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).strip() == "RUNNING",
            60,
            f"main job {job} running",
        )
        return job, time.monotonic() - t0

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for pid_file in (self.state_dir / "trainers").glob("*/supervisor.pid"):
            with contextlib.suppress(LaunchError):
                Launcher.attach(pid_file.parent).kill()
        if self.main_jobs:
            self.cluster.run(["scancel", *self.main_jobs], check=False)
        if (self.state_dir / "state.db").exists():
            with Store.open(self.state_dir) as store:
                jobs = [h.job_id for h in store.holders(live_only=False)]
            if jobs:
                self.cluster.run(["scancel", *jobs], check=False)


@pytest.fixture
def service(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    if (why := horovod_missing()) is not None:
        pytest.skip(why)
    state = tmp_path / "state"
    logs = tmp_path / "logs"
    logs.mkdir()
    s = Service(slurm, state, logs)
    try:
        yield s
    finally:
        s.cleanup()
        for log in sorted(logs.glob("daemon-*.log")):
            print(f"==== {log.name}\n{log.read_text()[-6000:]}")


def allocations(state_dir: Path) -> dict[str, list[tuple[float, tuple[str, ...]]]]:
    with Store.open(state_dir) as store:
        return {
            t.id: [(a.time_s, a.nodes) for a in store.allocation_history(t.id)]
            for t in store.trainers()
        }


def check_allocations(state_dir: Path, limits: dict[str, tuple[int, int]]) -> None:
    """Every allocation is 0 or within [n_min, n_max], and no node serves two trainers."""
    history = allocations(state_dir)
    events = sorted((t, tid, nodes) for tid, h in history.items() for t, nodes in h)
    current: dict[str, tuple[str, ...]] = {}
    for _, tid, nodes in events:
        n_min, n_max = limits[tid]
        assert not nodes or n_min <= len(nodes) <= n_max, (tid, nodes)
        current[tid] = nodes
        used = [n for ns in current.values() for n in ns]
        assert len(used) == len(set(used)), f"a node serves two trainers: {current}"


def resets(state_dir: Path, trainer_id: str) -> list[dict[str, Any]]:
    records, _ = channel.read_metrics(state_dir / "trainers" / trainer_id, 0)
    return [r for r in records if r.get("kind") == "reset"]


def wait_done(service: Service, trainer_id: str, timeout_s: float) -> dict[str, Any]:
    wait_until(
        lambda: service.trainer(trainer_id)["state"] in ("done", "failed", "cancelled"),
        timeout_s,
        f"trainer {trainer_id} to finish",
    )
    t = service.trainer(trainer_id)
    log = service.state_dir / "trainers" / trainer_id / channel.SUPERVISOR_LOG
    assert t["state"] == "done", f"{trainer_id}: {t}\n{log.read_text()[-4000:]}"
    return t


@pytest.mark.parametrize("kill_daemon", [False, True], ids=["steady", "daemon-killed"])
def test_two_trainers_shrink_and_grow_around_a_main_job(
    service: Service, kill_daemon: bool
) -> None:
    # Equal share, so that the trainers grow back when the nodes return: with the milp
    # policy they may not, and rightly, when their own curves say that more workers on
    # this 2-core machine slow them down (measured: 8 workers, each fit turned flat).
    service.start("equal")
    work = 60_000
    slow = ("--step-delay-s", "0.1", "--max-batch", "128")
    a = service.submit("horovod", work, 4, *slow)
    b = service.submit("torchrun", work, 4, *slow)
    trainers = (a, b)
    wait_until(
        lambda: all(service.trainer(t)["samples_done"] > 0 for t in trainers),
        240,
        "both trainers training",
    )
    wait_until(
        lambda: sum(len(service.trainer(t)["nodes"]) for t in trainers) == 8,
        120,
        "all 8 nodes held and given to the trainers",
    )
    supervisors = {t: supervisor_pid(service, t) for t in trainers}
    # A main job takes one node of each trainer: holders are preempted, both shrink.
    taken = [service.trainer(t)["nodes"][-1] for t in trainers]
    t_submit = time.time()
    job, start_s = service.main_job(taken, 25)
    assert start_s < MAIN_START_LIMIT_S, f"main job {job} took {start_s:.1f} s to start"
    wait_until(
        lambda: not set(taken) & {n for t in trainers for n in service.trainer(t)["nodes"]},
        60,
        "the daemon to take the main job's nodes from the trainers",
    )
    if kill_daemon:
        service.kill9()
        time.sleep(2)
        service.start("equal")
    shrink_s = {}
    for t in trainers:
        wait_until(
            lambda t=t: first_reset_at(service, t, 3, t_submit) is not None,
            120,
            f"trainer {t} training on 3 nodes",
        )
        shrink_s[t] = first_reset_at(service, t, 3, t_submit) - t_submit
    print(f"main job start {start_s:.1f} s; main job submitted -> first step at 3 nodes {shrink_s}")
    # The main job ends; its nodes come back and the trainers grow again.
    wait_until(
        lambda: any(first_reset_at(service, t, 4, t_submit) for t in trainers),
        180,
        "a trainer to grow back to 4 nodes",
    )
    for t in trainers:
        done = wait_done(service, t, 600)
        assert done["samples_done"] == work
        result = channel.read_result(service.state_dir / "trainers" / t)
        assert result is not None and result["samples"] == work
        # Never restarted by the daemon (its restart re-attached): the same supervisor.
        assert supervisor_pid(service, t) == supervisors[t]
    check_allocations(service.state_dir, {a: (1, 4), b: (1, 4)})
    with Store.open(service.state_dir) as store:
        live_nodes = [h.node for h in store.holders(live_only=True)]
    assert len(live_nodes) == len(set(live_nodes)), "a node held twice"
    # With no trainer left, the daemon holds nothing.
    wait_until(
        lambda: not [p for p in service.status()["pool"] if p["holder_state"]],
        30,
        "holders released",
    )
    assert service.stop() == 0


def supervisor_pid(service: Service, trainer_id: str) -> int:
    path = service.state_dir / "trainers" / trainer_id / channel.SUPERVISOR_PID
    return int(path.read_text())


def first_reset_at(service: Service, trainer_id: str, nodes: int, after_s: float) -> float | None:
    """When the trainer first took a step on ``nodes`` nodes after ``after_s``."""
    for r in resets(service.state_dir, trainer_id):
        if r["time_s"] > after_s and r["nodes"] == nodes:
            return float(r["time_s"])
    return None


def test_a_crashing_trainer_is_failed_with_its_log_and_frees_its_nodes(service: Service) -> None:
    service.start()
    bad = service.submit("torchrun", 10_000, 2, "--fail-at-step", "3")
    good = service.submit("torchrun", 3_000, 2)
    wait_until(lambda: service.trainer(bad)["state"] in ("failed", "done"), 300, "the bad trainer")
    t = service.trainer(bad)
    assert t["state"] == "failed"
    assert "failing on purpose" in t["reason"]
    assert t["nodes"] == []
    log = service.cli("logs", bad)
    assert "Traceback" in log and "failing on purpose at step 3" in log
    # The other trainer is not disturbed, and the freed nodes are released or reused.
    assert wait_done(service, good, 300)["samples_done"] == 3_000
    wait_until(
        lambda: not [p for p in service.status()["pool"] if p["holder_state"]],
        30,
        "holders released",
    )
    assert service.stop() == 0
