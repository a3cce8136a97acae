"""A scripted Slurm (fake_slurm.sh) put first on PATH, and a ``bftrainer daemon`` run
against it as a subprocess: for the scheduler failures a real Slurm cannot produce on
demand (an error exit, an empty reply, garbage, a hang), one command at a time."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_until

SCRIPT = Path(__file__).with_name("fake_slurm.sh")
COMMANDS = ("sinfo", "squeue", "scontrol", "sbatch", "scancel")
FAILURES = ("error", "empty", "garbage", "hang")
BFTRAINER = [sys.executable, "-m", "bftrainer"]
TIMEOUT_S = 1.0  # the daemon's --timeout: a hang lasts longer
POLL_S = 0.3


class FakeSlurm:
    """The fake's state folder: nodes, jobs, failure modes, and the calls it answered."""

    def __init__(self, root: Path, nodes: Sequence[str]) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        for name in COMMANDS:
            (self.bin / name).symlink_to(SCRIPT)
        (root / "mode").mkdir()
        (root / "jobs").mkdir()
        (root / "calls").touch()
        (root / "nodes").write_text("".join(f"{n}|idle\n" for n in nodes))

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "FAKE_SLURM": str(self.root),
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(REPO),
        }

    def fail(self, command: str, how: str | None) -> None:
        """Make ``command`` fail ``how`` (one of FAILURES) from its next call; None: heal."""
        mode = self.root / "mode" / command
        if how is None:
            mode.unlink(missing_ok=True)
        else:
            mode.write_text(how)

    def jobs(self) -> dict[str, list[str]]:
        """Job id -> [state, node, ...] as the fake holds them (one cancelled while they
        are read is gone; one being written is not there yet)."""
        out = {}
        for path in (self.root / "jobs").iterdir():
            if not path.name.startswith("."):
                with contextlib.suppress(FileNotFoundError):
                    out[path.name] = path.read_text().split()
        return out

    def set_job(self, job_id: str, *fields: str) -> None:
        # Whole or not at all (a squeue running meanwhile read an empty file otherwise),
        # as the script's sbatch writes it.
        tmp = self.root / "jobs" / f".{job_id}"
        tmp.write_text(" ".join(fields) + "\n")
        tmp.replace(self.root / "jobs" / job_id)

    def calls(self, command: str) -> list[tuple[float, list[str]]]:
        """Each call of ``command``: (epoch s, its arguments)."""
        out = []
        for line in (self.root / "calls").read_text().splitlines():
            name, when, *args = line.split(" ")
            if name == command:
                out.append((float(when), args))
        return out

    def fail_jobs(self, exit_code: int, reason: str, stderr: str) -> None:
        """Every holder submitted from now fails so (None: they wait, pending)."""
        (self.root / "job_fails").write_text(f"{exit_code} {reason} {stderr}\n")


class FakeDaemon:
    """``bftrainer daemon`` on the fake Slurm; its log read as a user reads it."""

    def __init__(self, slurm: FakeSlurm, state_dir: Path, log_path: Path) -> None:
        self.slurm = slurm
        self.state_dir = state_dir
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str, poll_s: float = POLL_S, wait: bool = True) -> None:
        """Start the daemon; ``wait``: until it has published its first pool."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *BFTRAINER,
                    "daemon",
                    "--scheduler",
                    "slurm",
                    "--bf-partition",
                    "bf",
                    "--state-dir",
                    str(self.state_dir),
                    "--poll-interval",
                    str(poll_s),
                    "--timeout",
                    str(TIMEOUT_S),
                    "--retries",
                    "0",
                    "--horizon",
                    "0",
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.slurm.env,
                start_new_session=True,
            )
        wait_until(lambda: self._up() and (self.state_dir / "daemon.lock").exists(), 60, "lock")
        if wait:
            self.wait_pool()

    def wait_pool(self) -> None:
        wait_until(lambda: self._up() and self.status()["pool_time_s"] is not None, 60, "pool")

    def _up(self) -> bool:
        assert self.alive(), f"the daemon exited:\n{self.log()[-3000:]}"
        return True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def lines_since(self, offset: int) -> list[str]:
        return self.log()[offset:].splitlines()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*BFTRAINER, *args, "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            env=self.slurm.env,
            timeout=120,
            check=False,
        )

    def status(self) -> dict:
        import json

        done = self.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def submit(self, script: Path, max_nodes: int = 1) -> str:
        done = self.cli(
            "submit", str(script), "--backend", "torchrun", "--max-nodes", str(max_nodes)
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[-1]

    def wait_line(self, offset: int, pattern: str, what: str, timeout_s: float = 60) -> str:
        """The first log line after ``offset`` matching ``pattern`` (fails if the daemon
        exits meanwhile)."""
        found: list[str] = []

        def seen() -> bool:
            assert self.alive(), f"the daemon exited waiting for {what}:\n{self.log()[-3000:]}"
            found[:] = [ln for ln in self.lines_since(offset) if re.search(pattern, ln)]
            return bool(found)

        wait_until(seen, timeout_s, what)
        return found[0]

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    """A daemon (not started) on a fake Slurm of six idle nodes; killed after the test."""
    slurm = FakeSlurm(tmp_path / "slurm", [f"n{i}" for i in range(1, 7)])
    daemon = FakeDaemon(slurm, tmp_path / "state", tmp_path / "daemon.log")
    try:
        yield daemon
    finally:
        daemon.kill()
