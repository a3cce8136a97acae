"""`replay --out` replaces only what bftrainer wrote there (issue 19): an earlier output
is recognised by the marker only bftrainer writes, and a file it did not write stops it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.cli.outdir import MARKER

SMALL = ["--synthetic-nodes", "8", "--synthetic-hours", "1", "--jobs-count", "4"]


def replay(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bftrainer", "replay", *SMALL, "--no-progress", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    return line


def test_an_earlier_output_is_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert replay(out).returncode == 0
    listed = set(json.loads((out / MARKER).read_text())["files"])
    assert "summary.json" in listed
    (out / "summary.json").write_text("{}")  # a file we wrote, changed: still ours
    again = replay(out)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "summary.json").read_text())  # the new run's


def test_a_replay_holding_its_report_is_replaced_as_make_demo_does_twice(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    assert replay(out).returncode == 0
    report = subprocess.run(
        [sys.executable, "-m", "bftrainer", "report", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.returncode == 0, report.stderr
    assert (out / "report" / MARKER).exists()
    again = replay(out)
    assert again.returncode == 0, again.stderr
    assert not (out / "report").exists()  # the old run's report is not passed off as new
    (out / "report").mkdir()
    (out / "report" / "mine.txt").write_text("mine")  # but a user's file is still refused
    line = one_error(replay(out))
    assert "report/mine.txt" in line and "did not write" in line


def test_a_file_bftrainer_did_not_write_is_never_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert replay(out).returncode == 0
    (out / "notes.txt").write_text("mine")
    line = one_error(replay(out))
    assert "notes.txt" in line and "did not write" in line
    assert (out / "notes.txt").read_text() == "mine"


def test_a_folder_with_a_summary_json_of_its_own_is_not_an_earlier_output(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / "thesis.tex").write_text("mine")
    line = one_error(replay(out))
    assert str(out) in line and MARKER in line
    assert (out / "thesis.tex").read_text() == "mine"


def test_an_out_that_cannot_be_created_is_refused_before_the_replay(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    line = one_error(replay(tmp_path / "afile" / "out"))
    assert "afile" in line and "not a writable folder" in line


def test_a_plot_that_fails_loses_no_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's plot failed after every run had finished, and nothing was written."""
    import bftrainer.replay.runs_output as replay_cli

    def broken(*_args: object) -> None:
        raise ValueError("cannot draw this")

    monkeypatch.setattr(replay_cli, "plot_sweep", broken)
    out = tmp_path / "out"
    args = ["replay", *SMALL, "--sweep", "tfwd=auto,60", "--no-progress", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert len(runs) == 2
    assert (out / "costs.png").is_file() and not (out / "utilization_vs_tfwd.png").exists()
