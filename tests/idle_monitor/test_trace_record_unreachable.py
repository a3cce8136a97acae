"""`trace record` whose every poll fails records nothing, and says so with exit 1 (issue
19: it exited 0 with a header-only file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "idle_monitor" / "fixtures"


def test_an_unreachable_slurm_is_an_error_not_an_empty_recording(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program, reply in [("sinfo", "sinfo"), ("squeue", "squeue"), ("scontrol", "res")]:
        script = bin_dir / program
        # What each prints (exit 1) when slurmctld is down, as recorded on real Slurm.
        script.write_text(f"#!/bin/sh\ncat {FIXTURES / f'slurm-down-{reply}.stderr'} >&2\nexit 1\n")
        script.chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": str(conf)}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bftrainer", "trace", "record", "--scheduler", "slurm"),
            *("--polls", "1", "--out", str(tmp_path / "logs")),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    assert "nothing was recorded" in line
    # and no header-only trace file is left to be taken for an empty pool
    assert not list((tmp_path / "logs").glob("*.csv"))
