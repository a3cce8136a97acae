"""`bftrainer status` and `bftrainer --help` stay light: a user on a busy login node (and
every wait of the test suite) runs them often, and neither needs a solver, a data frame
library or torch. Each is run as a user runs it, with Python's import log on stderr."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import click
import pytest

from bftrainer.cli import COMMANDS, SUMMARIES
from bftrainer.state import Store, ensure_state_dir

# Top-level packages that cost a second or more to import on 2 loaded cores; and
# ``email``, which only reading the installed metadata (``__version__``) brings: ~40 ms
# of CPU, a quarter of ``status``'s (benchmarks/cli_startup.py).
HEAVY = ("scipy", "torch", "pandas", "matplotlib", "highspy", "pulp", "pyarrow", "horovod")
METADATA = "email"


def imported_by(*args: str, exit_code: int = 0) -> set[str]:
    """The top-level packages that ``bftrainer ARGS`` imported (it must exit so)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "bftrainer", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == exit_code, done.stderr[-2000:]
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


@pytest.mark.parametrize(
    "args",
    [("--help",), ("status",), ("status", "--json"), ("submit", "--help")],
    ids=["help", "status", "status-json", "submit-help"],
)
def test_status_and_help_import_no_solver_frame_or_torch(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    ensure_state_dir(state)
    with Store.open(state):
        pass
    extra = ("--state-dir", str(state)) if args[0] == "status" else ()
    heavy = imported_by(*args, *extra) & {*HEAVY, METADATA}
    assert not heavy, f"bftrainer {' '.join(args)} imported {sorted(heavy)}"


def test_a_replay_or_report_refused_on_its_input_draws_nothing(tmp_path: Path) -> None:
    """matplotlib is a second of CPU: a command that fails on its input says its one
    line without it (the suite runs hundreds of such commands, a user a few)."""
    log = tmp_path / "jobs.swf"
    log.write_text("garbage\n")
    for args in (
        ("replay", str(log), "--out", str(tmp_path / "out")),
        ("report", str(tmp_path / "no-such-folder")),
    ):
        assert "matplotlib" not in imported_by(*args, exit_code=2), args


def test_the_version_is_read_when_asked() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    from importlib.metadata import version

    assert done.stdout == f"bftrainer, version {version('bftrainer')}\n"


def test_the_help_lists_each_command_with_its_own_first_sentence() -> None:
    assert set(SUMMARIES) == set(COMMANDS)
    for name, target in COMMANDS.items():
        module, attr = target.split(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        assert SUMMARIES[name] == command.get_short_help_str(10_000), name
