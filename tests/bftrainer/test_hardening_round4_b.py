"""Issue 42, part B: records of another shape, stale pids, the daemon's store at start,
bounded hostlists, folders that are not ours, FIFOs, one-line scheduler errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.state import Store, ensure_state_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def bftrainer(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bftrainer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    return line


# ---------------------------------------------------------------------- status


FAILING = {"cause": "sbatch: error", "job_id": "17", "nodes": ["n1"], "failures": 1}


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("pool", {"time_s": 1.0, "nodes": {"n1": {"window_s": "soon"}}}, "window_s"),
        ("pool", {"time_s": 1.0, "nodes": {}, "holders_failing": FAILING}, "next_try_s"),
        ("pool", {"time_s": "noon", "nodes": {}}, "time_s"),
        ("pool", [1, 2], "'pool'"),
        ("slots_per_node", "two", "slots_per_node"),
        ("slots_from", 3, "slots_from"),
    ],
)
def test_status_names_a_setting_of_another_shape_in_one_line(
    tmp_path: Path, key: str, value: object, named: str
) -> None:
    state = ensure_state_dir(tmp_path / "state")
    with Store.open(state) as store:
        store.submit(EXAMPLE, ["--work-samples", "10"])
        store.set_setting(key, value)
    for flags in ((), ("--json",)):
        line = one_error(bftrainer("status", "--state-dir", str(state), *flags))
        assert f"setting '{key}'" in line and named in line, line


def test_status_takes_a_recycled_supervisor_pid_for_no_supervisor(tmp_path: Path) -> None:
    state = ensure_state_dir(tmp_path / "state")
    trainer_dir = state / "trainers" / "t0001"
    trainer_dir.mkdir(parents=True)
    # pid 1 is alive, but it is not this trainer's supervisor.
    (trainer_dir / "supervisor.pid").write_text("1\n")
    with Store.open(state) as store:
        tid = store.submit(EXAMPLE, ["--work-samples", "10"])
        store.set_launch(tid, trainer_dir=trainer_dir, supervisor="1")
        store.set_trainer_state(tid, "running")
    done = bftrainer("status", "--json", "--state-dir", str(state))
    assert done.returncode == 0, done.stderr
    (trainer,) = json.loads(done.stdout)["trainers"]
    assert trainer["state"] == "exited", trainer
    assert "supervisor is gone" in trainer["reason"]


def test_status_imports_no_numpy() -> None:
    """status runs often: trainers.channel (read by status) must not pull numpy in."""
    code = "import sys; from bftrainer.cli.service import status_cmd; print('numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
