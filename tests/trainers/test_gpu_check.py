"""The GPU check's CPU dry run: ``benchmarks/runtime_speed_gpu.sh --device cpu``.

The script is what a GPU machine runs first, with about 15 minutes to spare: it must
not have rotted since. The same script at tiny sizes on the CPU runs every part (the
speed benchmark at batches 64, 256 and 1024 with several processes and the defaults,
the runtime under torchrun, both examples) and writes the figures and the summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_runs_dry_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", "benchmarks/runtime_speed_gpu.sh", "--device", "cpu", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        # Only stops a hang: the dry run took 41 s idle, 260 s in a suite whose heaviest
        # tests started beside it, and ran past 300 s at load 21.
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    speed = json.loads((tmp_path / "runtime_speed.json").read_text())
    assert [r["batch"] for r in speed["one_process"]] == [64, 256, 1024]
    assert speed["processes"]["procs"] == 2
    assert "overhead_share" in speed["defaults"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    runs = ["torchrun_all", "train_mlp", "train_cnn"]
    if "horovod_all" in summary["runs"]:  # where Horovod is importable (make horovod)
        runs.append("horovod_all")
    for name in runs:
        assert not summary["runs"][name]["failed"], (tmp_path / f"{name}.txt").read_text()[-2000:]
        assert summary["runs"][name]["samples_per_s"] > 0
    assert "== GPU check on cpu x 2, " in done.stdout  # the processes that stood for GPUs
    assert len(done.stdout.splitlines()) <= 25  # one screen
