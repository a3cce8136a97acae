"""The replay says what it replays: --workload (or another option of the built-in
workloads) with --jobs is refused in one line (it was ignored without a word); the
workload is recorded in summary.json; jobs submitted before the trace starts are refused
in one line, as a workload that starts after the trace ends is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bftrainer.test_replay_small_jobs import write_inputs

REPLAY = [sys.executable, "-m", "bftrainer", "replay", "--no-progress"]


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REPLAY, *args], capture_output=True, text=True, timeout=300)


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    return line


@pytest.mark.parametrize(
    ("option", "flag"),
    [
        (("--workload", "diverse"), "--workload"),
        (("--workload", "pollux"), "--workload"),
        (("--workload", "hpo"), "--workload"),
        (("--jobs-count", "5"), "--jobs-count"),
        (("--model", "resnet18"), "--model"),
        (("--interval", "10"), "--interval"),
    ],
)
def test_a_built_in_workload_option_with_jobs_is_refused(
    tmp_path: Path, option: tuple[str, str], flag: str
) -> None:
    trace, jobs = write_inputs(tmp_path, 1000.0)
    out = tmp_path / "out"
    line = error_line(replay(str(trace), "--jobs", str(jobs), *option, "--out", str(out)))
    assert f"{flag} and --jobs conflict" in line, line
    assert not out.exists()


@pytest.mark.parametrize("option", [("--no-batch-adapt",), ("--pollux-data", "/tmp")])
def test_a_pollux_option_without_the_pollux_workload_is_refused(
    tmp_path: Path, option: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    line = error_line(replay("--synthetic-nodes", "8", *option, "--out", str(out)))
    assert "needs --workload pollux" in line and option[0].lstrip("-no") in line, line
    assert not out.exists()


def test_summary_records_the_workload(tmp_path: Path) -> None:
    trace, jobs = write_inputs(tmp_path, 1000.0)
    done = replay(str(trace), "--jobs", str(jobs), "--policy", "equal", "--out", f"{tmp_path}/a")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["workload"] == {"name": "jobs", "file": str(jobs), "jobs": 3}
    done = replay(
        *("--synthetic-nodes", "8", "--synthetic-hours", "1", "--workload", "diverse"),
        *("--jobs-count", "3", "--policy", "equal", "--out", str(tmp_path / "b")),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["workload"] == {"name": "diverse", "file": None, "jobs": 3}


@pytest.mark.parametrize("submit", ["2020-02-10 00:21:15", "2021-02-09 23:59:59"])
def test_jobs_before_the_trace_are_refused_like_jobs_after_it(tmp_path: Path, submit: str) -> None:
    trace, jobs = write_inputs(tmp_path, 1000.0)
    jobs.write_text(jobs.read_text().replace("2021-02-10 00:21:15", submit))
    line = error_line(replay(str(trace), "--jobs", str(jobs), "--out", str(tmp_path / "o")))
    assert "3 job(s) arrive before the trace starts" in line and "J0" in line, line
    jobs.write_text(jobs.read_text().replace(submit, "2021-02-10 03:00:00"))
    line = error_line(replay(str(trace), "--jobs", str(jobs), "--out", str(tmp_path / "o")))
    assert "after the trace ends" in line, line
