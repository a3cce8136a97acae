"""`bftrainer run` in a trainer directory left by an earlier run never reports that run's
result as its own (issue 19): the same work resumes (or its result is shown, said so),
other work is refused in one line naming the folder and --fresh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bftrainer", "run", "--backend", "torchrun"]
    argv += ["--hosts-file", "hosts", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def work(samples: int) -> list[str]:
    return [str(EXAMPLE), "--work-samples", str(samples)]


def errors(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("Error")]


@pytest.mark.slow
def test_an_earlier_run_is_resumed_or_refused_never_passed_off(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("localhost\n")
    first = run(tmp_path, *work(640))
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["samples"] == 640
    d = tmp_path / "bftrainer-run-train_mlp"  # the default, as a user gets it

    other = run(tmp_path, *work(1280))
    assert other.returncode == 2 and other.stdout == ""
    (line,) = errors(other.stderr)
    assert str(d.name) in line and "--fresh" in line
    assert (d / "result.json").is_file()  # nothing recorded is lost

    same = run(tmp_path, *work(640))
    assert same.returncode == 0, same.stderr
    assert "finished by an earlier run" in same.stderr
    assert json.loads(same.stdout)["samples"] == 640

    fresh = run(tmp_path, "--fresh", *work(1280))
    assert fresh.returncode == 0, fresh.stderr
    assert "starting afresh" in fresh.stderr
    assert json.loads(fresh.stdout)["samples"] == 1280


def test_a_folder_that_is_not_a_trainer_directory_is_refused_even_with_fresh(
    tmp_path: Path,
) -> None:
    (tmp_path / "hosts").write_text("localhost\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for extra in ([], ["--fresh"]):
        done = run(tmp_path, "--trainer-dir", "mine", *extra, *work(640))
        assert done.returncode == 2
        (line,) = errors(done.stderr)
        assert "mine" in line and "not a trainer directory" in line
    assert (mine / "notes.txt").read_text() == "keep me"


def test_a_trainer_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    """Its parent a file (a read-only parent fails the same way, but not for root)."""
    (tmp_path / "hosts").write_text("localhost\n")
    (tmp_path / "afile").write_text("")
    done = run(tmp_path, "--trainer-dir", "afile/run", *work(640))
    assert done.returncode == 2
    (line,) = errors(done.stderr)
    assert "afile/run" in line


@pytest.mark.slow
def test_a_finished_run_whose_script_changed_is_new_work_refused_without_fresh(
    tmp_path: Path,
) -> None:
    (tmp_path / "hosts").write_text("localhost\n")
    script = tmp_path / "train_mlp.py"
    script.write_bytes(EXAMPLE.read_bytes())
    first = run(tmp_path, str(script), "--work-samples", "640")
    assert first.returncode == 0, first.stderr
    script.write_bytes(EXAMPLE.read_bytes() + b"\n# edited: another model, say\n")
    again = run(tmp_path, str(script), "--work-samples", "640")
    assert again.returncode == 2 and again.stdout == ""  # never the old result as the answer
    (line,) = errors(again.stderr)
    assert "content has changed" in line and "--fresh" in line, line
    assert (tmp_path / "bftrainer-run-train_mlp" / "result.json").is_file()
