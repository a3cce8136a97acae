"""A trainer script that exits 0 without doing its work fails at once, in one line
with its samples done against those asked; it is not restarted as if workers were lost
(it was: three restarts, then "torchrun exited with code 0")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_a_script_that_returns_early_fails_with_its_samples(tmp_path: Path) -> None:
    script = tmp_path / "lazy.py"
    script.write_text("print('nothing to do')\n")  # exits 0, trains nothing
    (tmp_path / "hosts").write_text("localhost\n")
    argv = [sys.executable, "-m", "bftrainer", "run", "--backend", "torchrun"]
    argv += ["--hosts-file", "hosts", str(script), "--work-samples", "640"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if "trainer failed" in ln]
    assert "exited 0 short of its work: 0 samples done, 640 samples asked" in line, line
    log = (tmp_path / "bftrainer-run-lazy" / "supervisor.log").read_text()
    assert "restarting" not in log, log
