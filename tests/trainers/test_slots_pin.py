"""A worker on a shared node runs on its slot's share only: CPUs, OMP_NUM_THREADS and
GPUs, as the real worker wrapper sets them before the user's script starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.trainers import channel
from bftrainer.trainers.launch.slot_pin import node_gpus, share

REPO = Path(__file__).resolve().parents[2]
# What the user's script sees: its CPUs (from the kernel) and its environment.
PROBE = """
import json, os
print("PROBE " + json.dumps({
    "cpus": sorted(os.sched_getaffinity(0)),
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "status": [l for l in open("/proc/self/status") if l.startswith("Cpus_allowed_list")][0],
}))
"""


def test_share_cuts_a_node_into_contiguous_parts() -> None:
    cpus = list(range(8))
    assert [share(cpus, k, 4) for k in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [share(cpus, k, 3) for k in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert [share(["0", "1"], k, 4) for k in range(4)] == [["0"], ["1"], ["0"], ["1"]]
    assert share([], 1, 2) == []


def test_gpus_are_the_visible_ones_or_the_nodes_devices(tmp_path: Path) -> None:
    assert node_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, tmp_path) == ["2", "3"]
    assert node_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, tmp_path) == []
    assert node_gpus({}, tmp_path) == []
    for name in ("nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert node_gpus({}, tmp_path) == ["0", "1"]


def run_worker(trainer_dir: Path, env: dict[str, str]) -> tuple[dict[str, object], str]:
    script = trainer_dir / "probe.py"
    script.write_text(PROBE)
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer.trainers.launch.worker", str(script)],
        env={
            **{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
            "PYTHONPATH": str(REPO),
            "BFTRAINER_TRAINER_DIR": str(trainer_dir),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE ")), done.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to split")
def test_each_local_rank_runs_on_its_own_slot(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    # This trainer holds slot 1 of n1 (its local rank 0) and then slot 0 (rank 1).
    channel.write_exec(tmp_path, "local", slots={"n1": [1, 0]}, slots_per_node=2)
    seen = {}
    for rank in (0, 1):
        env = {"HOROVOD_HOSTNAME": "n1", "HOROVOD_LOCAL_RANK": str(rank)}
        probe, err = run_worker(tmp_path, {**env, "CUDA_VISIBLE_DEVICES": "4,5"})
        seen[rank] = probe
        slot = 1 - rank
        want = share(cpus, slot, 2)
        assert probe["cpus"] == want
        assert probe["omp"] == str(len(want))
        assert probe["cuda"] == ["4", "5"][slot]
        assert f"bftrainer: slot {slot} of 2 on n1: CPUs {','.join(map(str, want))}" in err
    assert not set(seen[0]["cpus"]) & set(seen[1]["cpus"]), seen  # type: ignore[call-overload]


def test_torchruns_workers_find_their_host_by_bftrainer_host(tmp_path: Path) -> None:
    channel.write_exec(tmp_path, "local", slots={"n1": [0], "n2": [1]}, slots_per_node=2)
    probe, _ = run_worker(tmp_path, {"BFTRAINER_HOST": "n2", "LOCAL_RANK": "0"})
    assert probe["cpus"] == share(sorted(os.sched_getaffinity(0)), 1, 2)


FORKED_PROBE = """
import json, os, signal, sys
print("PROBE " + json.dumps({
    "rank": os.environ["LOCAL_RANK"],
    "cpus": sorted(os.sched_getaffinity(0)),
    "threads": sys.modules["torch"].get_num_threads(),  # loaded by the agent, before the fork
    "sigterm": str(signal.getsignal(signal.SIGTERM)),  # not the agent's handler
    "name": open("/proc/self/comm").read().strip(),
}), flush=True)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to split")
def test_workers_forked_by_torchruns_agent_run_their_slots_threads(tmp_path: Path) -> None:
    """torch is loaded before the worker pins itself: OMP_NUM_THREADS comes too late,
    so the pin sets torch's thread count (the agent's is the node's)."""
    from bftrainer.trainers.launch.backends import WORKER_FILE

    cpus = sorted(os.sched_getaffinity(0))
    channel.write_exec(tmp_path, "local", slots={"n1": [1, 0]}, slots_per_node=2)
    script = tmp_path / "probe.py"
    script.write_text(FORKED_PROBE)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bftrainer.trainers.launch.torchrun_agent",
            "--standalone",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--run-path",
            "--start-method=fork",
            WORKER_FILE,
            str(script),
        ],
        env={
            **{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
            "PYTHONPATH": str(REPO),
            "BFTRAINER_TRAINER_DIR": str(tmp_path),
            "BFTRAINER_HOST": "n1",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    probes = [
        json.loads(x.split("PROBE ", 1)[1]) for x in done.stdout.splitlines() if "PROBE " in x
    ]
    by_rank = {p["rank"]: p for p in probes}
    assert sorted(by_rank) == ["0", "1"], done.stdout
    for rank, slot in (("0", 1), ("1", 0)):
        want = share(cpus, slot, 2)
        assert by_rank[rank]["cpus"] == want
        assert by_rank[rank]["threads"] == len(want), by_rank
        assert by_rank[rank]["sigterm"] == str(signal.SIG_DFL), by_rank
        assert by_rank[rank]["name"] == f"bftrainer-w{rank}", by_rank


def test_whole_nodes_change_nothing(tmp_path: Path) -> None:
    channel.write_exec(tmp_path, "local")
    probe, err = run_worker(tmp_path, {"HOROVOD_HOSTNAME": "n1", "HOROVOD_LOCAL_RANK": "0"})
    assert probe["cpus"] == sorted(os.sched_getaffinity(0))
    assert probe["omp"] == os.environ.get("OMP_NUM_THREADS")
    assert "slot" not in err


def test_a_worker_without_its_slot_says_so_in_one_line_and_runs(tmp_path: Path) -> None:
    channel.write_exec(tmp_path, "local", slots={"n1": [1]}, slots_per_node=2)
    probe, err = run_worker(tmp_path, {"HOROVOD_HOSTNAME": "n1", "HOROVOD_LOCAL_RANK": "1"})
    assert probe["cpus"] == sorted(os.sched_getaffinity(0))
    assert (
        "bftrainer: running on the whole node, its slot unknown: exec.json gives n1 slots [1]: "
        "none for local rank 1" in err
    )


def test_exec_json_carries_slots_only_when_nodes_are_shared(tmp_path: Path) -> None:
    channel.write_exec(tmp_path, "slurm", {"n1": "7"}, slots={"n1": [1]}, slots_per_node=2)
    data = channel.read_exec(tmp_path)
    assert data is not None and (data["slots"], data["slots_per_node"]) == ({"n1": [1]}, 2)
    channel.write_exec(tmp_path, "slurm", {"n1": "7"}, slots={"n1": [0]}, slots_per_node=1)
    assert "slots" not in (channel.read_exec(tmp_path) or {})
    (tmp_path / "exec.json").write_text(
        json.dumps({"mode": "slurm", "slots": {"n1": [2]}, "slots_per_node": 2})
    )
    with pytest.raises(channel.ChannelError, match="slots must map each host to slot numbers"):
        channel.read_exec(tmp_path)


FAILING = "raise ValueError('Horovod initialization failed. Please check log messages above')\n"


@pytest.mark.parametrize("slots_left", [1, 2])
def test_a_horovod_worker_whose_slot_was_removed_leaves_without_a_failure(
    tmp_path: Path, slots_left: int
) -> None:
    # Horovod's reset fails a worker whose local rank its host no longer has: a shrink,
    # not the script's error. With its slot still there, the same error is the script's.
    script = tmp_path / "fails.py"
    script.write_text(FAILING)
    (tmp_path / channel.DISCOVERY_HOSTS).write_text(f"n1:{slots_left}\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "BFTRAINER_TRAINER_DIR": str(tmp_path),
        "HOROVOD_HOSTNAME": "n1",
        "HOROVOD_LOCAL_RANK": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer.trainers.launch.worker", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    removed = slots_left == 1
    assert ("this worker's slot left the job" in done.stderr) == removed
    assert (tmp_path / "failure.json").exists() != removed
