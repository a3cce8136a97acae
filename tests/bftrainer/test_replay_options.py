"""Replay options that used to run the wrong thing silently or fail after the work
(issue 19): each is one line naming the option, before any replay starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli

SMALL = ["replay", "--synthetic-nodes", "8", "--synthetic-hours", "1", "--no-progress"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", ","], "--policy ','"),
        (["--policy", " , "], "--policy"),
        (["--policy", "milp,milp"], "named twice"),
        (["--policy", "equal", "--sweep", "tfwd=10"], "--sweep runs the milp policy only"),
        (["--policy", "milp,equal", "--sweep", "tfwd=10"], "--sweep runs the milp policy only"),
        (["--sweep", "tfwd=auto,auto"], "given twice"),
        (["--sweep", "tfwd=10,30,10"], "given twice"),
        (["--sweep", "tfwd=0,10"], "each T_fwd must be"),
        (["--tfwd", "0"], "'0' is not auto or a finite number > 0"),
        (["--window-hours", "1e-6"], "--window-hours 1e-06"),
    ],
)
def test_bad_replay_options_are_one_line_before_the_run(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [*SMALL, *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), repr(result.exception)
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error")]
    assert message in line
    assert not out.exists()


def test_a_config_file_with_t_fwd_zero_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[policy]\nt_fwd_s = 0\n")
    result = CliRunner().invoke(cli, [*SMALL, "--config", str(config), "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "t_fwd_s = 0" in result.output


def test_an_allocation_problem_with_t_fwd_zero_is_refused(tmp_path: Path) -> None:
    problem = tmp_path / "p.json"
    problem.write_text('{"pool": ["a"], "t_fwd": 0, "trainers": []}')
    result = CliRunner().invoke(cli, ["allocate", str(problem)])
    assert result.exit_code == 2, result.output
    assert "t_fwd is 0, expected > 0" in result.output
