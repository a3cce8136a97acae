"""Two trainers share one node of the real local Slurm (``--slots-per-node 2``).

What a centre relies on, asserted here: each worker runs on its own slot of the node
(its own CPU here, as the kernel reports it, with OMP_NUM_THREADS to match); a trainer's
rescale never moves the other's worker; a main job that takes the node shrinks both
trainers to nothing and starts within seconds; when the node comes back both resume, and
each finishes with exactly its work.

The other seven nodes are kept busy by a long main job, so that the pool is that one
node: the trainers must wait for it rather than move elsewhere.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bftrainer.state import Store
from bftrainer.trainers import channel
from bftrainer.trainers.launch import remote
from bftrainer.trainers.launch.slot_pin import share
from tests.bftrainer.daemon_service import (
    MAIN_START_LIMIT_S,
    Service,
    daemon_log,
    service_in,
    wait_done,
)
from tests.conftest import SlurmCluster, wait_until
from tests.trainers.elastic_harness import horovod_missing, started_rank

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLOTS = 2


@pytest.fixture
def service(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    if (why := horovod_missing()) is not None:
        pytest.skip(why)
    with service_in(slurm, tmp_path) as s:
        yield s


def cpu_list(text: str) -> list[int]:
    """The kernel's ``0-2,5`` as [0, 1, 2, 5]."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def worker_cpus(service: Service, trainer_id: str) -> list[list[int]]:
    """The CPUs each worker process of the trainer may run on (all nodes of the local
    cluster are this machine), from /proc: what the kernel enforces, not what was asked."""
    found = []
    for pid in remote.processes_of(service.state_dir / "trainers" / trainer_id):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if started_rank(pid) is None:
            continue  # horovodrun, torchrun's agent, srun, a shell: not a worker
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        found.append(cpu_list(line.split(":", 1)[1].strip()))
    return found


def slot_history(state_dir: Path) -> list[tuple[float, str, dict[str, tuple[int, ...]]]]:
    with Store.open(state_dir) as store:
        return sorted(
            (a.time_s, t.id, dict(a.slots))
            for t in store.trainers()
            for a in store.allocation_history(t.id)
        )


def check_slots(state_dir: Path, limits: dict[str, tuple[int, int]]) -> None:
    """Every allocation is 0 or within [n_min, n_max] slots, each slot of a node serves
    one trainer at a time, and a trainer keeps the slots it had while it stays."""
    current: dict[str, dict[str, tuple[int, ...]]] = {}
    for _, tid, slots in slot_history(state_dir):
        count = sum(len(s) for s in slots.values())
        n_min, n_max = limits[tid]
        assert count == 0 or n_min <= count <= n_max, (tid, slots)
        for node, held in current.get(tid, {}).items():
            now = slots.get(node, ())
            m = min(len(now), len(held))  # a shrink drops the last ones, a grow appends
            assert now[:m] == held[:m], f"{tid}'s slots on {node} moved: {held} -> {now}"
        current[tid] = slots
        used = Counter((n, i) for s in current.values() for n, ix in s.items() for i in ix)
        assert all(c == 1 for c in used.values()), f"a slot serves two trainers: {current}"
        assert all(i < SLOTS for _, i in used), current


def test_two_trainers_share_a_node_each_on_its_slot_through_its_departure_and_return(
    service: Service,
) -> None:
    cluster = service.cluster
    node, others = cluster.nodes[0], cluster.nodes[1:]
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
    service.start("equal", extra=["--slots-per-node", str(SLOTS)])
    slow = (*service.paced(0.4), "--max-batch", "128")
    work = {"horovod": 90_000, "torchrun": 60_000}
    # Horovod alone first: both slots of the node (host:2, two workers).
    a = service.submit("horovod", work["horovod"], SLOTS, *slow)
    wait_until(lambda: service.trainer(a)["samples_done"] > 0, 300, f"{a} training")
    wait_until(lambda: service.trainer(a)["slots"] == {node: [0, 1]}, 60, f"{a} on 2 slots")
    # A second trainer: an equal share is one slot each. The first keeps its slot 0
    # (its local rank 0 never moves); the second gets the slot it gave up.
    b = service.submit("torchrun", work["torchrun"], SLOTS, *slow)
    wait_until(lambda: service.trainer(b)["samples_done"] > 0, 240, f"{b} training")
    assert service.trainer(a)["slots"] == {node: [0]}
    assert service.trainer(b)["slots"] == {node: [1]}
    cpus = sorted(os.sched_getaffinity(0))
    mine = {a: share(cpus, 0, SLOTS), b: share(cpus, 1, SLOTS)}
    wait_until(
        lambda: all(worker_cpus(service, t) == [mine[t]] for t in (a, b)),
        120,
        f"one worker each, on its own CPUs {mine}",
    )
    for t, slot in ((a, 0), (b, 1)):
        log = (service.state_dir / "trainers" / t / channel.SUPERVISOR_LOG).read_text()
        cpu_text = ",".join(map(str, mine[t]))
        assert (
            f"bftrainer: slot {slot} of {SLOTS} on {node}: CPUs {cpu_text} "
            f"(OMP_NUM_THREADS={len(mine[t])})" in log
        ), log[-3000:]
    status = service.cli("status")
    assert f"slots per node: {SLOTS}" in status and f"{a}[0] {b}[1]" in status, status

    # A main job takes the node: both trainers lose their slot at once and wait.
    t_submit = time.time()
    job, start_s = service.main_job([node], 25)
    assert start_s < MAIN_START_LIMIT_S, f"main job {job} took {start_s:.1f} s to start"
    wait_until(
        lambda: all(service.trainer(t)["nodes"] == [] for t in (a, b)),
        60,
        "both trainers off the node",
    )
    before = {t: service.trainer(t)["samples_done"] for t in (a, b)}
    assert all(s < work[service.trainer(t)["backend"]] for t, s in before.items()), before
    # The main job ends; the node comes back, and both train on it again.
    wait_until(
        lambda: all(len(service.trainer(t)["nodes"]) == 1 for t in (a, b)),
        180,
        "both trainers back on the node",
    )
    print(f"main job start {start_s:.1f} s; back on the node {time.time() - t_submit:.0f} s after")
    service.release()
    for t in (a, b):
        done = wait_done(service, t, 600)
        want = work[done["backend"]]
        assert done["samples_done"] == want
        result = channel.read_result(service.state_dir / "trainers" / t)
        assert result is not None and result["samples"] == want
        assert done["restarts"] == 0
    check_slots(service.state_dir, {a: (1, SLOTS), b: (1, SLOTS)})
    assert service.stop() == 0
    log = daemon_log(service)
    assert "internal error" not in log and "Traceback" not in log, log[-4000:]
