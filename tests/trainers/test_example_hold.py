"""The example's hold, which every test that watches a trainer relies on: while the hold
file exists, a trainer in the last twentieth of its work waits for the file's deletion,
so it does not finish while the test watches (however slow the machine); deleted, it
finishes with exactly its work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.trainers import channel
from tests.conftest import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"
WORK = 2000


def reported(trainer_dir: Path) -> list[int]:
    records, _ = channel.read_metrics(trainer_dir)
    return [r["samples_done"] for r in records if r.get("kind") == "metrics"]


@pytest.mark.slow
def test_a_held_trainer_waits_near_its_end_until_released(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("localhost\n")
    hold = tmp_path / "hold"
    hold.touch()
    d = tmp_path / "t"
    argv = [sys.executable, "-m", "bftrainer", "run", "--backend", "torchrun"]
    argv += ["--hosts-file", "hosts", "--trainer-dir", str(d), str(EXAMPLE)]
    # Batches of 16: its tail (the last 100 samples) is several steps of one wait each.
    argv += ["--work-samples", str(WORK), "--report-every-s", "0.2"]
    argv += ["--base-batch", "16", "--max-batch", "16"]
    argv += ["--step-delay-s", "0.001", "--hold-file", str(hold)]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        # In its last twentieth it steps once per wait (30 s): it reports from there,
        # and after its next step, still short of its work.
        tail = 0.95 * WORK
        wait_until(lambda: any(s >= tail for s in reported(d)), 120, "the trainer in its tail")
        seen = len(reported(d))
        wait_until(lambda: len(reported(d)) > seen, 90, "a step while held there")
        assert max(reported(d)) < WORK and proc.poll() is None, "finished while held"
        hold.unlink()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert json.loads(out)["samples"] == WORK
