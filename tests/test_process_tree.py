"""One process tree (issue 31): every child of a command ends when the command ends,
by SIGTERM (which means what Ctrl-C means: a clean stop, one line, no traceback) or by
SIGKILL. Each test waits for an event (the workers running) before it signals, and
cleans up, by PID, only what it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.trainers.elastic_harness import started_rank

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_mlp.py"
GONE_WITHIN_S = 5.0


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    out = subprocess.run(
        ["ps", "-e", "-ww", "-o", "pid=,ppid=,args="], capture_output=True, text=True, check=True
    )
    table = {}
    for line in out.stdout.splitlines():
        pid, ppid, *args = line.split(None, 2)
        table[int(pid)] = (int(ppid), args[0] if args else "")
    return table


def descendants(root: int) -> dict[int, str]:
    table = process_table()
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, args) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = args
                frontier.append(pid)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_for(what: str, condition: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {process_table()}")


def seconds_until_gone(pids: list[int], limit_s: float) -> float:
    """How long until every one of ``pids`` has ended (inf if not within ``limit_s``)."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        if not any(alive(p) for p in pids):
            return time.monotonic() - began
        time.sleep(0.05)
    return float("inf")


@contextmanager
def started(argv: list[str], cwd: Path) -> Iterator[tuple[subprocess.Popen[str], set[int]]]:
    """The command, and a set the test fills with the PIDs it saw under it: all killed
    by PID at the end if still there, whatever happened."""
    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen: set[int] = set()
    try:
        yield proc, seen
    finally:
        for pid in [proc.pid, *seen]:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=30)


def long_replay(tmp_path: Path) -> list[str]:
    """Two policies over a trace long enough that the replays take minutes."""
    rows = ["time,node,idle", *(f"1612915200,n{n},1" for n in range(64))]
    state = dict.fromkeys(range(64), 1)
    for k in range(1, 4000):
        node = (k * 37) % 64
        state[node] ^= 1
        rows.append(f"{1612915200 + 600 * k},n{node},{state[node]}")
    (tmp_path / "long.csv").write_text("\n".join(rows) + "\n")
    return [
        *(sys.executable, "-m", "bftrainer", "replay", "long.csv", "--jobs-count", "3000"),
        *("--policy", "milp,equal", "--no-progress", "--out", "out"),
    ]


def replay_workers(root: int) -> dict[int, str]:
    return {p: a for p, a in descendants(root).items() if "multiprocessing" in a}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_replay_with_two_policies_takes_its_workers_with_it(
    tmp_path: Path, sig: signal.Signals
) -> None:
    with started(long_replay(tmp_path), tmp_path) as (proc, seen):
        wait_for("the two replay workers", lambda: len(replay_workers(proc.pid)) >= 2, 120)
        children = descendants(proc.pid)
        seen.update(children)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
        gone_s = seconds_until_gone(list(children), GONE_WITHIN_S)
        print(f"{sig.name}: {len(children)} children gone {gone_s:.2f} s after the replay")
        assert gone_s <= GONE_WITHIN_S, {p: a for p, a in children.items() if alive(p)}
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert err.strip().splitlines()[-1:] == ["Aborted!"], err
    assert not (tmp_path / "out").exists()  # nothing half written in its place


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_run_takes_its_supervisor_and_torchrun_with_it(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "hosts").write_text("localhost\n")
    argv = [sys.executable, "-m", "bftrainer", "run", "--backend", "torchrun"]
    argv += ["--hosts-file", "hosts", "--stop-grace-s", "1", str(EXAMPLE)]
    argv += ["--work-samples", "1000000000"]

    def training() -> bool:
        """A worker of the trainer runs (not only the torchrun agent that forks it)."""
        return any(started_rank(pid) is not None for pid in descendants(proc.pid))

    with started(argv, tmp_path) as (proc, seen):
        wait_for("a worker of the trainer", training, 300)
        children = descendants(proc.pid)
        seen.update(children)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
        gone_s = seconds_until_gone(list(children), GONE_WITHIN_S)
        print(f"{sig.name}: {len(children)} processes gone {gone_s:.2f} s after run ended")
        assert gone_s <= GONE_WITHIN_S, {p: a for p, a in children.items() if alive(p)}
    assert "Traceback" not in err, err
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "SIGTERM: stopping (workers checkpoint)" in err, err


def test_the_temporary_folder_of_a_killed_run_is_removed_by_the_next(tmp_path: Path) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                           capture_output=True, check=True)  # fmt: skip
    dead = int(ended.stdout)
    assert not alive(dead)
    orphan = tmp_path / f".out.{dead}.k3x9.partial"
    running = tmp_path / f".out.{os.getpid()}.a1b2.partial"  # a run still going: kept
    foreign = tmp_path / ".out.notes.partial"  # not named by a run: kept
    for folder in (orphan, running, foreign):
        folder.mkdir()
        (folder / "summary.json").write_text("{}")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bftrainer", "replay", "--synthetic-nodes", "8"),
            *("--synthetic-hours", "1", "--jobs-count", "2", "--no-progress", "--out", "out"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not orphan.exists()
    assert running.is_dir() and foreign.is_dir()
