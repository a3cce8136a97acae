"""``--slots-per-node gres`` on the real local Slurm: the daemon reads S from the bf
partition's ``Gres=gpu:N`` and runs a trainer on a node's S slots; a node whose GPU
count changes under the trainer leaves the pool and comes back, and the trainer finishes
with exactly its work; on a cluster that declares no GPU the daemon stops at start with
one line saying so.

The default cluster declares no GPU (the refusal is tested there); the GPU tests run on
a second local cluster of 8 nodes with ``GRES_GPUS=2`` (docs/slurm-local.md, "GPU
counts") that this module starts on free ports and stops, unless the default one declares
GPUs already.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bftrainer.daemon.gpu_slots import slots_from_gpus
from bftrainer.idle_monitor.slurm import parse_sinfo_gpus
from bftrainer.state import Store
from bftrainer.trainers import channel
from tests.bftrainer.daemon_service import BFTRAINER, Service, daemon_log, service_in, wait_done
from tests.conftest import CLUSTER_SCRIPT, SlurmCluster, wait_until, worker_cluster_env

pytestmark = [pytest.mark.slurm]


GPUS_PER_NODE = 2


def gpus(cluster: SlurmCluster) -> dict[str, int]:
    return parse_sinfo_gpus(cluster.run(["sinfo", "-N", "-h", "-p", "bf", "-o", "%N|%G"]))[0]


def free_port_run(count: int) -> int:
    """A port p with p .. p + count - 1 free (the script's node i listens on base + i)."""
    for base in range(29000, 32000, 50):
        try:
            socks = []
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise AssertionError("no run of free ports in 29000-32000")


@pytest.fixture(scope="module")
def gpu_env(slurm_cluster: SlurmCluster) -> Iterator[dict[str, str]]:
    """The environment of ``local-cluster.sh`` for a cluster whose nodes have GPUs: the
    default one if it declares them, else a second one started here (and stopped)."""
    worker = worker_cluster_env()  # this worker's cluster under pytest-xdist, else {}
    if slots_from_gpus(gpus(slurm_cluster)) is not None:
        yield worker
        return
    base = free_port_run(len(slurm_cluster.nodes) + 3)
    env = {
        # Short: slurmd's sockets live under it (a Unix socket path has 108 bytes).
        "SLURM_LOCAL_DIR": f"/var/tmp/bftrainer-slurm-gpu-{os.getpid()}",
        "SLURM_LOCAL_CTLD_PORT": str(base),
        "SLURM_LOCAL_SLURMD_PORT": str(base + 1),
        "SLURM_LOCAL_NODE_PORT": str(base + 2),
        "NNODES": str(len(slurm_cluster.nodes)),
        "GRES_GPUS": str(GPUS_PER_NODE),
        **{k: v for k, v in worker.items() if k.endswith(("_BF_INTERVAL", "_KILL_WAIT"))},
    }
    try:
        done = script(env, "start", timeout_s=600)
        assert done.returncode == 0, f"the GPU cluster did not start: {done.stderr[-2000:]}"
        yield env
    finally:
        script(env, "stop", timeout_s=120)
        shutil.rmtree(env["SLURM_LOCAL_DIR"], ignore_errors=True)


def script(env: dict[str, str], *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture
def gpu_slurm(gpu_env: dict[str, str], slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with GPUs, clean before and after the test (as ``slurm`` is)."""
    if not gpu_env:
        cluster = slurm_cluster
    else:
        conf = Path(gpu_env["SLURM_LOCAL_DIR"]) / "slurm.conf"
        cluster = SlurmCluster(conf, slurm_cluster.nodes, started_here=True)
    cluster.reset()
    yield cluster
    cluster.reset()


@pytest.fixture
def service(gpu_slurm: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    with service_in(gpu_slurm, tmp_path) as s:
        yield s


def test_without_gpus_the_daemon_stops_at_start_in_one_line(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    if any(gpus(slurm).values()):
        pytest.skip("this cluster declares GPUs (GRES_GPUS)")
    done = subprocess.run(
        [
            *BFTRAINER,
            "daemon",
            "--scheduler",
            "slurm",
            "--bf-partition",
            "bf",
            "--env",
            f"SLURM_CONF={slurm.conf}",
            "--state-dir",
            str(tmp_path / "state"),
            "--slots-per-node",
            "gres",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**Service(slurm, tmp_path, tmp_path).env},
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"Error: --slots-per-node gres: none of the {len(slurm.nodes)} node(s) read has a "
        "GPU count (Gres=gpu:N): give --slots-per-node a number"
    ), done.stderr
    assert "Traceback" not in done.stderr


def test_the_daemon_takes_s_from_gres_and_a_trainer_fills_a_nodes_slots(
    service: Service,
) -> None:
    counts = gpus(service.cluster)
    slots = slots_from_gpus(counts)
    assert slots is not None, "the gpu_env fixture gives a cluster with GPUs"
    service.start("equal", extra=["--slots-per-node", "gres"])
    wait_until(lambda: service.status()["slots_per_node"] == slots, 60, f"S = {slots}")
    assert service.status()["slots_from"] == "gres"
    status = service.cli("status")
    assert f"slots per node: {slots} (the nodes' GPU count: gres)" in status, status
    work = 20_000
    t = service.submit("torchrun", work, slots)
    done = wait_done(service, t, 600)
    assert done["samples_done"] == work
    # It ran on every slot of one node, packed (as recorded when it started).
    with Store.open(service.state_dir) as store:
        first = store.allocation_history(t)[0]
    (node,) = first.slots
    assert first.slots == {node: tuple(range(slots))}, first
    assert service.stop() == 0
    log = daemon_log(service)
    fits = sum(c == slots for c in counts.values())
    read = f"slots per node: {slots}, the GPU count of {fits} of the {len(counts)} node(s) read"
    assert read in log
    assert "internal error" not in log and "Traceback" not in log, log[-4000:]


def set_gpus(env: dict[str, str], node: str, count: int) -> None:
    """What an administrator does when a node's GPUs change (local-cluster.sh gpus)."""
    done = script(env, "gpus", node, str(count), timeout_s=120)
    assert done.returncode == 0, done.stderr


def test_a_node_whose_gpus_change_under_a_trainer_leaves_and_returns_nothing_lost(
    service: Service, gpu_env: dict[str, str]
) -> None:
    cluster = service.cluster
    slots = slots_from_gpus(gpus(cluster))
    assert slots is not None, "the gpu_env fixture gives a cluster with GPUs"
    node, others = cluster.nodes[2], [n for n in cluster.nodes if n != cluster.nodes[2]]
    busy = cluster.sbatch(
        "-p", "main", "-N", str(len(others)), "-w", ",".join(others), "-t", "30",
        "--wrap", "sleep 1800",
    )  # fmt: skip
    service.main_jobs.append(busy)
    wait_until(
        lambda: cluster.run(["squeue", "-h", "-j", busy, "-o", "%T"]).strip() == "RUNNING",
        60,
        "the main job on the other nodes",
    )
    service.start("equal", extra=["--slots-per-node", "gres"])
    work = 60_000
    t = service.submit("torchrun", work, slots, *service.paced(0.4), "--max-batch", "128")
    wait_until(lambda: service.trainer(t)["samples_done"] > 0, 300, f"{t} training")
    assert service.trainer(t)["slots"] == {node: list(range(slots))}
    changed = False
    try:
        set_gpus(gpu_env, node, slots - 1 if slots > 1 else slots + 1)
        changed = True
        # Slurm itself ends the holder ("gres/gpu count mismatch"): the node leaves, the
        # trainer waits at zero with what it has done.
        wait_until(lambda: service.trainer(t)["nodes"] == [], 60, f"{t} off {node}")
        wait_until(lambda: "left out: it has" in service.cli("status"), 30, f"{node} left out")
        before = service.trainer(t)["samples_done"]
        assert 0 < before < work
        set_gpus(gpu_env, node, slots)
        changed = False
    finally:
        if changed:
            set_gpus(gpu_env, node, slots)  # leave the cluster as it was found
    wait_until(lambda: service.trainer(t)["nodes"] != [], 180, f"{t} back on {node}")
    service.release()
    done = wait_done(service, t, 600)
    assert done["samples_done"] == work and done["restarts"] == 0
    result = channel.read_result(service.state_dir / "trainers" / t)
    assert result is not None and result["samples"] == work
    assert service.stop() == 0
    log = daemon_log(service)
    assert f"{node} is left out of the pool (--slots-per-node gres, {slots} slots)" in log
    assert f"{node} has {slots} GPU(s) again: back in the pool" in log
    assert "internal error" not in log and "Traceback" not in log, log[-4000:]
