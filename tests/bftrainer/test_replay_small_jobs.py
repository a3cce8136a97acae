"""A replay finishes jobs of any size (issue 19): at trace times (~1.6e9 s, 2.4e-7 s
apart) a little work at a high rate used to finish within the clock's resolution, and
the loop raised LoopStalledError instead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NODES = 64
SUBMIT = "2021-02-10 00:21:15"


def write_inputs(folder: Path, work_samples: float) -> tuple[Path, Path]:
    trace = folder / "pool.csv"
    lines = ["time,node,idle"]
    lines += [f"2021-02-10 00:00:00,n{i},1" for i in range(NODES)]
    lines += [f"2021-02-10 02:00:00,n{i},0" for i in range(NODES)]
    trace.write_text("\n".join(lines) + "\n")
    jobs = folder / "J-Jbnd-3J.csv"
    jobs.write_text(
        "job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\n"
        + "".join(f"J{k},18.0,12.0,1,{NODES},{work_samples!r},{SUBMIT}\n" for k in range(3))
    )
    rows = []
    for k in range(3):
        for point, n in enumerate((0, 1, 8, NODES)):
            rate = 2831.0 * n**0.9
            rows.append(f"J{k},{point},{n},{rate!r},{rate!r}")
    (folder / "J-JNPs-3J.csv").write_text(
        "job,point,nodes,throughput_samples_per_s,objective\n" + "\n".join(rows) + "\n"
    )
    return trace, jobs


@pytest.mark.parametrize("work_samples", [1.0, 1000.0, 100_000.0, 1.3e8])
def test_jobs_of_any_size_finish_under_every_policy(tmp_path: Path, work_samples: float) -> None:
    trace, jobs = write_inputs(tmp_path, work_samples)
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bftrainer", "replay", str(trace), "--jobs", str(jobs)),
            *("--policy", "milp,equal", "--no-progress", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert len(runs) == 2
    for run in runs:
        assert run["trainers_completed"] == 3, run["policy"]
        assert run["samples_processed"] == pytest.approx(3 * work_samples, rel=1e-6)
