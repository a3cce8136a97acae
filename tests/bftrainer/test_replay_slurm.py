"""`bftrainer replay --sweep ... --executor slurm` on the real local Slurm cluster: the
runs of a sweep as one job array (submitit), gathered into the table the local sweep
prints; a task that fails is named with its log, and the others' results are kept."""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SlurmCluster, wait_until

pytest.importorskip("submitit")
pytestmark = pytest.mark.slurm  # its tests take the local cluster (the slurm fixture)

# A small synthetic day with churn, so that the twelve T_fwd give twelve different rows.
INPUTS = [
    "--synthetic-nodes", "64", "--synthetic-hours", "6", "--workload", "diverse",
    "--jobs-count", "40", "--interval", "300", "--solver", "dp", "--no-progress",
]  # fmt: skip
TFWD = ["5", "10", "20", "30", "45", "60", "90", "120", "180", "300", "600", "auto"]
SWEEP = ["--sweep", "tfwd=" + ",".join(TFWD)]
# What differs between two runs of the same replay: how long it took.
WALL_CLOCK = {"wall_s", "events_per_s", "mean_solve_s"}


def replay(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bftrainer", "replay", *INPUTS, *SWEEP, *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 300) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def table(stdout: str) -> list[str]:
    """The printed table, without its one wall-clock row."""
    return [line for line in stdout.splitlines() if line and not line.startswith("events/s")]


def runs(out: Path) -> dict[str, dict[str, object]]:
    """Each run's summary.json by folder, without the wall-clock fields."""
    listed = json.loads((out / "summary.json").read_text())["runs"]
    by_folder = {}
    for run in listed:
        t = run["t_fwd"]
        by_folder[f"milp-tfwd{t if isinstance(t, str) else format(t, 'g')}"] = {
            k: v for k, v in run.items() if k not in WALL_CLOCK
        }
    return by_folder


def test_a_slurm_sweep_gives_the_local_sweeps_table(slurm: SlurmCluster, tmp_path: Path) -> None:
    local = finish(replay("--out", str(tmp_path / "local")))
    assert local[0] == 0, local[2]
    remote = finish(replay("--executor", "slurm", "--out", str(tmp_path / "slurm"), env=slurm.env))
    assert remote[0] == 0, remote[2]
    assert table(remote[1])[:-1] == table(local[1])[:-1]  # the last line names --out
    assert runs(tmp_path / "slurm") == runs(tmp_path / "local")
    assert len(runs(tmp_path / "slurm")) == len(TFWD)
    # Each replay ran as a task of one array, its log in the folder beside --out.
    logs = sorted((tmp_path / "slurm.slurm").glob("*_*/*_log.err"))
    assert len(logs) == len(TFWD)
    assert len({p.parent.name.split("_")[0] for p in logs}) == 1


def test_a_failed_task_is_named_with_its_log_and_the_others_are_kept(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = replay("--executor", "slurm", "--out", str(out), env=slurm.env)
    try:
        # Twelve tasks on eight nodes: the last one waits. Cancel it, as a centre's
        # operator (or a node failure) would.
        def array_id() -> str:
            return slurm.run(["squeue", "-h", "-n", "bftrainer-replay", "-o", "%F"]).strip()

        wait_until(lambda: bool(array_id()) or proc.poll() is not None, 60, "the array")
        last = f"{array_id().splitlines()[0]}_{len(TFWD) - 1}"
        slurm.run(["scancel", last])
        code, stdout, stderr = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 1, stderr
    log = tmp_path / "out.slurm" / last / f"{last}_0_log.err"
    assert f"replay milp-tfwd{TFWD[-1]} failed: " in stderr
    assert f"its log: {log}" in stderr
    assert "1 of 12 replays failed" in stderr
    kept = runs(out)
    assert sorted(kept) == sorted(f"milp-tfwd{v}" for v in TFWD[:-1])
    assert all((out / name / "trainers.csv").exists() for name in kept)
    assert "milp T_fwd=600" in stdout


def test_slurm_options_without_the_slurm_executor_are_refused(tmp_path: Path) -> None:
    code, _, err = finish(replay("--slurm-time", "5", "--out", str(tmp_path / "out")))
    assert code == 2
    assert err.strip().splitlines()[-1] == "Error: --slurm-time needs --executor slurm"


def test_the_slurm_executor_without_sbatch_says_so(tmp_path: Path) -> None:
    no_slurm = {"PATH": str(Path(sys.executable).parent)}
    code, _, err = finish(replay("--executor", "slurm", "--out", str(tmp_path / "o"), env=no_slurm))
    assert code == 2
    assert "sbatch is not on PATH" in err.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()


def test_tasks_wait_for_their_folders_however_slow_the_submitter(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submitit makes each task's folder (its log's) only once sbatch has answered; a
    task Slurm starts before then cannot open its log and dies. A submitter slowed at
    exactly that point (a loaded login node): every task still runs and answers."""
    import submitit.core.utils as submitit_utils

    from bftrainer.replay import slurm_sweep

    for name, value in slurm.env.items():
        monkeypatch.setenv(name, value)
    move = submitit_utils.JobPaths.move_temporary_file

    def slowly(self: object, *args: object, **kwargs: object) -> None:
        time.sleep(0.5)  # twelve tasks: 6 s, several of Slurm's scheduling passes
        move(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(submitit_utils.JobPaths, "move_temporary_file", slowly)
    options = slurm_sweep.SlurmOptions(tmp_path / "sweep", time_min=5)
    got = slurm_sweep.run_array(operator.add, 100, list(range(12)), options)
    assert got == [100 + i for i in range(12)], [
        (g.reason, g.log) for g in got if isinstance(g, slurm_sweep.TaskFailure)
    ]
