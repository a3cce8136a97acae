"""A bftrainer daemon run by a test or a benchmark, as a centre runs it: the CLI as
subprocesses, its state read through ``bftrainer status --json``; cleaned up by PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from bftrainer.cli.status import status_json
from bftrainer.cli.store_access import read_store
from bftrainer.common import strict_json
from bftrainer.state import Store
from bftrainer.trainers import channel
from bftrainer.trainers.launch.base import Launcher, LaunchError
from tests.conftest import REPO, SlurmCluster, wait_until

EXAMPLE = REPO / "examples" / "train_mlp.py"
BFTRAINER = [sys.executable, "-m", "bftrainer"]
POLL_S = 1.0
# The production delays that tests shorten (one test keeps them: start(production=True)):
# a dead supervisor's restart backoff (10 s). The supervisor's settle time after losing
# workers (3 s, BFTRAINER_RESTART_SETTLE_S) is kept: it is what gives the daemon time to
# drop a lost host before the workers start again.
TEST_RESTART_BACKOFF_S = 1.0
TEST_DELAYS_ENV: dict[str, str] = {}
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
        # Trainers given paced() sleep per step while this file exists: they are still
        # running while the test watches, and finish at full speed once it is released.
        self.hold = log_dir / "hold"
        self.hold.touch()
        self.production = False  # start(production=True): the daemon's own delays

    def paced(self, step_delay_s: float) -> tuple[str, ...]:
        """The example trainer's flags: ``step_delay_s`` per step until :meth:`release`.
        Trainers re-tune their batch as they go (up to --max-batch), so the delay is
        sized for the largest batch: the work must outlast what the test watches."""
        return ("--step-delay-s", str(step_delay_s), "--hold-file", str(self.hold))

    def release(self) -> None:
        """Let every paced trainer finish its work at full speed."""
        self.hold.unlink(missing_ok=True)

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
            # Gloo's rendezvous waits 30 s by default: at a load average of 12 on these
            # 2 cores a re-forming Horovod job hit it and restarted whole.
            "HOROVOD_GLOO_TIMEOUT_SECONDS": "120",
            **({} if self.production else TEST_DELAYS_ENV),
        }

    def start(
        self,
        policy: str = "milp",
        poll_s: float = POLL_S,
        lease_s: float = 300.0,
        extra: Sequence[str] = (),
        production: bool = False,
    ) -> None:
        """Start the daemon at its default log level; ``policy`` milp decides from the
        trainers' reported curves (speedup), equal gives each trainer an equal share
        whatever they report. ``lease_s``: how long holders outlive the daemon;
        ``extra``: more flags of ``bftrainer daemon``; ``production``: the restart
        backoff and settle times a centre runs with, not the tests' short ones."""
        self.starts += 1
        self.production = production
        backoff_s = "" if production else f"restart_backoff_s = {TEST_RESTART_BACKOFF_S}\n"
        config = self.log_dir / "daemon.toml"
        config.write_text(
            f'[policy]\npolicy = "{policy}"\nobjective = "speedup"\nredecide_every_s = 10.0\n'
            f"[daemon]\nholder_lease_s = {lease_s}\n{backoff_s}"
        )
        log = (self.log_dir / f"daemon-{self.starts}.log").open("ab")
        self.proc = subprocess.Popen(
            [
                *BFTRAINER,
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
                str(poll_s),
                "--horizon",
                "0",
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        wait_until(lambda: (self.state_dir / "daemon.lock").exists(), 30, "the daemon's lock")
        wait_until(self._up, 30, "daemon up")

    def _up(self) -> bool:
        """Whether the running daemon is the one started last (its store made)."""
        assert self.proc is not None
        try:
            return bool(self.status()["daemon"]["pid"] == self.proc.pid)
        except click.ClickException:
            return False  # its store is still being created: no state.db yet, or empty

    def logs(self) -> list[str]:
        """The daemon's log of each start, in order."""
        return [p.read_text() for p in sorted(self.log_dir.glob("daemon-*.log"))]

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
        """What ``bftrainer status --json`` prints, read in this process through the
        command's own code (waits poll it: a subprocess each time cost 1 s of CPU on 2
        cores, taken from the trainers waited on). Read as the command reads: afresh when
        the daemon opened or closed the store right then."""

        def read(store: Store) -> dict[str, Any]:
            return dict(json.loads(strict_json.dumps(status_json(store, self.state_dir))))

        return read_store(self.state_dir, read)

    def status_cli(self) -> dict[str, Any]:
        """``bftrainer status --json`` as a user runs it: a subprocess, its stdout parsed."""
        return dict(json.loads(self.cli("status", "--json")))

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
            str(seconds // 60 + 2),  # minutes: never cut short by its own limit
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

    def end_main_job(self, job: str) -> None:
        """End a main job now (its nodes go back to idle), as a job that finishes does."""
        self.cluster.run(["scancel", job])

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


@contextlib.contextmanager
def service_in(cluster: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    """A :class:`Service` on ``tmp_path/state``, logging to ``tmp_path/logs``; cleaned up
    after, and the end of each daemon log printed (pytest shows it when a test fails)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    s = Service(cluster, tmp_path / "state", logs)
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
    # Read once as a user reads it: the command, its JSON parsed.
    t = next(t for t in service.status_cli()["trainers"] if t["id"] == trainer_id)
    log = service.state_dir / "trainers" / trainer_id / channel.SUPERVISOR_LOG
    assert t["state"] == "done", f"{trainer_id}: {t}\n{log.read_text()[-4000:]}"
    return t


def supervisor_pid(service: Service, trainer_id: str) -> int:
    path = service.state_dir / "trainers" / trainer_id / channel.SUPERVISOR_PID
    return int(path.read_text())


def first_reset_at(service: Service, trainer_id: str, nodes: int, after_s: float) -> float | None:
    """When the trainer first took a step on ``nodes`` nodes after ``after_s``."""
    for r in resets(service.state_dir, trainer_id):
        if r["time_s"] > after_s and r["nodes"] == nodes:
            return float(r["time_s"])
    return None


def daemon_log(service: Service) -> str:
    return "".join(p.read_text() for p in sorted(service.log_dir.glob("daemon-*.log")))


class StartWatch:
    """When each tracked Slurm job started, from an ``squeue`` every 0.1 s in a thread of
    its own: whatever the caller blocks on (a daemon restart, a status call), a main
    job's start is seen within a poll (the soak's own loop once saw one 45 s late)."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster
        self.submitted: dict[str, float] = {}  # job id -> time.time() when tracked
        self.started: dict[str, float] = {}  # job id -> start delay (s)
        self.running: dict[str, int] = {}  # job id -> nodes, as last seen
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def track(self, job: str) -> None:
        """Watch ``job``, submitted just now."""
        with self._lock:
            self.submitted[job] = time.time()

    def delays(self, limit_s: float) -> tuple[list[float], list[str]]:
        """Each started job's start delay, and one line for each job that never started
        or started more than ``limit_s`` after its submission."""
        delays: list[float] = []
        late: list[str] = []
        with self._lock:
            for job in self.submitted:
                delay = self.started.get(job)
                if delay is None:
                    late.append(f"main job {job} never started")
                    continue
                delays.append(delay)
                if delay > limit_s:
                    late.append(f"main job {job} started {delay:.1f} s after its submission")
        return delays, late

    def _watch(self) -> None:
        while not self._done.is_set():
            with self._lock:
                ids = ",".join(self.submitted)
            argv = ["squeue", "-h", "-t", "all", "-j", ids, "-o", "%i|%T|%D"]
            out = self.cluster.run(argv, False) if ids else ""
            seen = time.time()
            running: dict[str, int] = {}
            for line in out.splitlines():
                job, state, nodes = line.split("|")
                if state in ("RUNNING", "COMPLETING", "COMPLETED") and job not in self.started:
                    self.started[job] = seen - self.submitted[job]
                if state == "RUNNING":
                    running[job] = int(nodes)
            self.running = running
            self._done.wait(0.1)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
