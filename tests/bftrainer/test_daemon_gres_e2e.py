"""``--slots-per-node gres`` on the real local Slurm: the daemon reads S from the bf
partition's ``Gres=gpu:N`` and runs a trainer on a node's S slots; on a cluster that
declares no GPU it stops at start with one line saying so.

Which test runs depends on the cluster: the default one declares no GPU; start it with
``GRES_GPUS=2`` (docs/slurm-local.md, "GPU counts") for the other.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bftrainer.gpu_slots import slots_from_gpus
from bftrainer.idle_monitor.slurm import parse_sinfo_gpus
from bftrainer.state import Store
from tests.bftrainer.daemon_service import BFTRAINER, Service, daemon_log, wait_done
from tests.conftest import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm]


def gpus(cluster: SlurmCluster) -> dict[str, int]:
    return parse_sinfo_gpus(cluster.run(["sinfo", "-N", "-h", "-p", "bf", "-o", "%N|%G"]))[0]


@pytest.fixture
def service(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    logs = tmp_path / "logs"
    logs.mkdir()
    s = Service(slurm, tmp_path / "state", logs)
    try:
        yield s
    finally:
        s.cleanup()
        for log in sorted(logs.glob("daemon-*.log")):
            print(f"==== {log.name}\n{log.read_text()[-6000:]}")


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
    if slots is None:
        pytest.skip("this cluster declares no GPU: start it with GRES_GPUS=2")
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
