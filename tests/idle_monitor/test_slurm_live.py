"""The Slurm pool against a real 8-node Slurm on this machine (scripts/slurm/local-cluster.sh):
busy, planned and idle nodes, reservations, a hung controller, the CLI and SSH."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bftrainer.idle_monitor.runner import LocalRunner, RetryPolicy, SshRunner
from bftrainer.idle_monitor.slurm import SlurmScheduler, expand_hostlist
from bftrainer.idle_monitor.source import LivePoolSource, PoolConfig, Reading
from bftrainer.idle_monitor.trace import load_trace
from tests.conftest import SlurmCluster, SshServer, wait_until

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]


def source(
    cluster: SlurmCluster, horizon_s: float = 300.0, use_json: bool = False
) -> LivePoolSource:
    runner = LocalRunner(env=cluster.env, timeout_s=20, retry=RetryPolicy(1))
    scheduler = SlurmScheduler(use_json=use_json)
    return LivePoolSource(scheduler, runner, PoolConfig(horizon_s=horizon_s))


def read(src: LivePoolSource) -> Reading:
    reading = src.read()
    assert reading is not None
    return reading


def planned_start(cluster: SlurmCluster, job_id: str) -> float | None:
    """The job's planned start (epoch s) as squeue shows it, once it has planned nodes."""
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%S|%Y"],
        env={**os.environ, **cluster.env, "SLURM_TIME_FORMAT": "%s"},
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    start, _, nodes = out.partition("|")
    if not start.isdigit() or nodes in ("", "(null)"):
        return None
    return float(start)


def test_idle_cluster_is_all_pool(slurm: SlurmCluster) -> None:
    reading = read(source(slurm))
    assert reading.nodes == set(slurm.nodes)
    assert reading.candidates == set(slurm.nodes)
    assert all(w is None for w in reading.windows_s.values())


def test_hostlist_matches_scontrol(slurm: SlurmCluster) -> None:
    for text in ["node[1-3,5]", "node[01-03]", "a[1-2]b[3-4]", "x1,y[7-8]"]:
        expected = slurm.run(["scontrol", "show", "hostnames", text]).split()
        assert expand_hostlist(text) == expected


def test_busy_planned_and_idle_nodes(slurm: SlurmCluster) -> None:
    """Three nodes run a 2-minute job; a pending 8-node job is planned on all nodes,
    so the five idle nodes are claimed at the running job's end."""
    running = slurm.sbatch("-p", "main", "-N", "3", "-t", "2", "--wrap", "sleep 300")
    wait_until(lambda: list(slurm.states().values()).count("allocated") == 3, 20, "3 busy")
    big = slurm.sbatch("-p", "main", "-N", "8", "-t", "5", "--wrap", "sleep 10")
    wait_until(lambda: "planned" in slurm.states().values(), 30, "planned nodes")
    wait_until(lambda: planned_start(slurm, big) is not None, 30, "a planned start")
    busy = set(expand_hostlist(slurm.run(["squeue", "-h", "-j", running, "-o", "%N"]).strip()))
    states = slurm.states()
    idle_now = {n for n, s in states.items() if s == "planned"}
    assert len(busy) == 3 and idle_now == set(slurm.nodes) - busy

    # within the 300 s horizon the planned nodes are not in the pool
    near = read(source(slurm, horizon_s=300))
    assert near.nodes == set(slurm.nodes) and near.candidates == frozenset()

    # with a 30 s horizon they are, each with the time left until the big job's start
    far = read(source(slurm, horizon_s=30))
    start = planned_start(slurm, big)
    assert start is not None
    assert far.candidates == idle_now
    for node in idle_now:
        window = far.windows_s[node]
        assert window is not None and abs(window - (start - far.time_s)) < 2.0

    # the JSON reading agrees
    js = read(source(slurm, horizon_s=30, use_json=True))
    assert js.candidates == far.candidates


def test_reservation_window_and_active_reservation(slurm: SlurmCluster) -> None:
    slurm.run(
        ["scontrol", "create", "reservation", "ReservationName=later", "StartTime=now+3600",
         "Duration=60", "Nodes=node7,node8", "Users=root"]
    )  # fmt: skip
    slurm.run(
        ["scontrol", "create", "reservation", "ReservationName=nowres", "StartTime=now",
         "Duration=30", "Nodes=node1", "Users=root"]
    )  # fmt: skip
    wait_until(lambda: slurm.states()["node1"] == "reserved", 10, "node1 reserved")
    reading = read(source(slurm))
    assert reading.candidates == set(slurm.nodes) - {"node1"}
    for node in ("node7", "node8"):
        window = reading.windows_s[node]
        assert window is not None and 3590 < window <= 3600
    assert reading.windows_s["node2"] is None


def test_job_without_time_limit_leaves_windows_open(slurm: SlurmCluster) -> None:
    """No limit on the running job: Slurm cannot plan the pending one (start a year
    away, planned nodes '(null)'), so idle nodes stay in the pool, open-ended."""
    slurm.sbatch("-p", "main", "-N", "2", "--wrap", "sleep 300")
    wait_until(lambda: list(slurm.states().values()).count("allocated") == 2, 20, "2 busy")
    big = slurm.sbatch("-p", "main", "-N", "8", "-t", "5", "--wrap", "sleep 10")
    wait_until(
        lambda: slurm.run(["squeue", "-h", "-j", big, "-o", "%S"]).strip() not in ("", "N/A"),
        30,
        "a start estimate for the big job",
    )
    reading = read(source(slurm))
    assert len(reading.candidates) == 6
    assert all(reading.windows_s[n] is None for n in reading.candidates)


def test_pool_events_follow_jobs(slurm: SlurmCluster) -> None:
    src = source(slurm)
    first = src.poll()
    assert first is not None and first.joined == set(slurm.nodes)
    job = slurm.sbatch("-p", "main", "-N", "2", "-t", "2", "--wrap", "sleep 300")
    wait_until(lambda: list(slurm.states().values()).count("allocated") == 2, 20, "2 busy")
    left = src.poll()
    assert left is not None and len(left.left) == 2 and not left.joined
    slurm.run(["scancel", job])
    wait_until(lambda: set(slurm.states().values()) == {"idle"}, 30, "all idle")
    assert src.poll() is None  # idle in one record only: not yet a join
    joined = src.poll()
    assert joined is not None and joined.joined == left.left


def test_hung_controller_keeps_pool_then_recovers(slurm: SlurmCluster) -> None:
    """slurmctld stopped with SIGSTOP: sinfo hangs, the runner times out (real timeout)."""
    pid = int((slurm.conf.parent / "run" / "slurmctld.pid").read_text())
    runner = LocalRunner(env=slurm.env, timeout_s=1.0, retry=RetryPolicy(1))
    src = LivePoolSource(SlurmScheduler(), runner)
    assert src.poll() is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        assert src.poll() is None
        view = src.view()
        assert view.stale and view.pool == set(slurm.nodes)
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(0.5)
    runner.timeout_s = 20
    assert src.read() is not None and not src.view().stale


def test_pool_command_json(slurm: SlurmCluster) -> None:
    slurm.sbatch("-p", "main", "-N", "1", "-t", "2", "--wrap", "sleep 300")
    wait_until(lambda: "allocated" in slurm.states().values(), 20, "1 busy")
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer", "pool", "--scheduler", "slurm", "--json",
         "--env", f"SLURM_CONF={slurm.conf}"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["time"].endswith("Z")
    assert len(data["nodes"]) == 7
    assert all(v == {"window_s": None} for v in data["nodes"].values())


def test_record_command_live(slurm: SlurmCluster, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer", "trace", "record",
         "--scheduler", "slurm", "--interval", "0.3", "--polls", "3", "--out", str(tmp_path),
         "--env", f"SLURM_CONF={slurm.conf}"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (path,) = tmp_path.glob("pool-*.csv")
    trace = load_trace(path, strict=True)
    assert set(trace.nodes) == set(slurm.nodes) and trace.initial_idle == set(slurm.nodes)


def test_nodes_held_in_bf_stay_in_pool_and_yield_to_main(slurm: SlurmCluster) -> None:
    """scripts/slurm/hold-nodes.sbatch holds two nodes in `bf`; with --bf-partition bf
    they stay in the pool; a main job preempts the holder and starts within seconds."""
    template = REPO / "scripts" / "slurm" / "hold-nodes.sbatch"
    hold = slurm.sbatch("--nodelist=node3,node4", "--nodes=2", str(template))
    wait_until(lambda: slurm.states()["node3"] == "allocated", 20, "held nodes")
    runner = LocalRunner(env=slurm.env, timeout_s=20, retry=RetryPolicy(1))
    held = LivePoolSource(SlurmScheduler(bf_partitions=["bf"]), runner).read()
    plain = read(source(slurm))
    assert held is not None and held.candidates == set(slurm.nodes)
    assert plain.candidates == set(slurm.nodes) - {"node3", "node4"}
    main = slurm.sbatch("-p", "main", "-N", "8", "-t", "1", "--wrap", "sleep 5")
    wait_until(
        lambda: slurm.run(["squeue", "-h", "-j", main, "-o", "%T"]).strip() == "RUNNING",
        30,
        "the main job to preempt the holder and start",
    )
    info = slurm.run(["scontrol", "show", "job", hold])
    # GraceTime=0 (scripts/slurm): killed, PREEMPTED; with a grace time the holder exits
    # by itself, COMPLETED, and only PreemptTime tells the preemption apart.
    assert "JobState=PREEMPTED" in info or (
        "JobState=COMPLETED" in info and "PreemptTime=None" not in info
    ), info


@pytest.mark.sshd
def test_slurm_over_ssh_matches_local(slurm: SlurmCluster, sshd: SshServer) -> None:
    slurm.sbatch("-p", "main", "-N", "2", "-t", "2", "--wrap", "sleep 300")
    wait_until(lambda: list(slurm.states().values()).count("allocated") == 2, 20, "2 busy")
    ssh = SshRunner(sshd.target, key_path=sshd.key, known_hosts=sshd.known_hosts, env=slurm.env)
    with ssh:
        remote = LivePoolSource(SlurmScheduler(), ssh).read()
    local = read(source(slurm))
    assert remote is not None
    assert remote.nodes == local.nodes and remote.candidates == local.candidates
    assert len(remote.candidates) == 6
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer", "pool", "--scheduler", "slurm", "--json",
         "--ssh", sshd.target, "--ssh-key", str(sshd.key), "--known-hosts",
         str(sshd.known_hosts), "--env", f"SLURM_CONF={slurm.conf}"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)["nodes"]) == local.candidates
