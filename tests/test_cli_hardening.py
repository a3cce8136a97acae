"""Hostile input through the real command line: one clear line and exit 2, never a
traceback or a hang (issue 10)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli

GOOD_TRACE = "time,node,idle\n2021-02-10 00:00:00,a,1\n2021-02-10 01:00:00,a,0\n"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), f"traceback: {result.exception!r}\n{result.output}"
    return result.exit_code, result.output


def one_error_line(out: str) -> str:
    errors = [line for line in out.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, out
    return errors[0]


@pytest.mark.parametrize("time_text", ["1612915732000", "1e17", "1e30", "9e99"])
@pytest.mark.parametrize("command", [["trace", "stats"], ["replay", "--no-progress", "--out"]])
def test_implausible_trace_times_give_one_line(
    tmp_path: Path, time_text: str, command: list[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(f"time,node,idle\n{time_text},a,1\n{time_text}1,a,0\n")
    args = [*command, str(tmp_path / "out"), str(trace)] if "--out" in command else [*command]
    if "--out" not in command:
        args.append(str(trace))
    code, out = run(*args)
    assert code == 2
    line = one_error_line(out)
    assert "t.csv:2" in line and "plausible range" in line
    assert ("milliseconds" in line) == (time_text == "1612915732000")


@pytest.mark.parametrize("option", ["--start", "--end"])
@pytest.mark.parametrize("value", ["1e30", "1612915732000", "-1e30", "inf"])
def test_implausible_time_options_give_one_line(tmp_path: Path, option: str, value: str) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(GOOD_TRACE)
    for args in (
        ["trace", "stats", str(trace)],
        ["replay", str(trace), "--no-progress", "--out", str(tmp_path / "o")],
        ["replay", "--no-progress", "--synthetic-nodes", "4", "--out", str(tmp_path / "o")],
    ):
        code, out = run(*args, option, value)
        assert code == 2, out
        assert one_error_line(out).startswith(f"Error: {option}: time")
