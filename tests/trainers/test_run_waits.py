"""Every wait of `bftrainer run` has an end or says what it waits for: --exec-mode slurm
outside an allocation is refused in one line (it waited for ever, silent, on hosts
without a holder job), a host outside the allocation likewise, and a hosts file that
lists no host says that the trainer waits for one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"
RUN = [sys.executable, "-m", "bftrainer", "run", "--backend", "torchrun", "--hosts-file", "hosts"]


def env(**slurm: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**base, **slurm}


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    return line


def test_exec_mode_slurm_outside_an_allocation_is_refused(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("node1\n")
    done = subprocess.run(
        [*RUN, "--exec-mode", "slurm", str(EXAMPLE)],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "not inside a Slurm allocation" in error_line(done)
    assert list(tmp_path.iterdir()) == [tmp_path / "hosts"]  # nothing started


def test_a_host_outside_the_allocation_is_refused(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("node1\nnode3:2\n")
    done = subprocess.run(
        [*RUN, "--exec-mode", "slurm", str(EXAMPLE)],
        cwd=tmp_path,
        env=env(SLURM_JOB_ID="1234", SLURM_JOB_NODELIST="node[1-2]"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = error_line(done)
    assert "node3 not in this allocation (job 1234: node1, node2)" in line, line


def test_a_hosts_file_with_no_host_says_the_trainer_waits(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("# none yet\n")
    err = tmp_path / "stderr"
    with err.open("w") as f:
        proc = subprocess.Popen(
            [*RUN, str(EXAMPLE), "--work-samples", "640"], cwd=tmp_path, stderr=f, text=True
        )
    try:
        wait_until(lambda: "lists no host" in err.read_text(), 60, "the waiting line")
        assert proc.poll() is None
        assert "the trainer waits" in err.read_text()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
