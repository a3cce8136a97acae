"""Inputs that are not regular files get one line, at once (issue 19): a FIFO given as a
trace, a job set or a config blocked the command forever; a device never ends.

Every option and argument a command reads a file from is found by walking the command
line, so a new one is covered; paths that are outputs or live on another machine are
listed here by name."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.cli.params import InputFile, InputTextFile

# Not files read here: outputs, and paths on the machine the scheduler's commands run on.
NOT_LOCAL_INPUTS = {
    "trace synth --out",
    "trace from-log --out",
    "daemon --metrics-textfile",
    "daemon --holder-script",
    "pool --lsf-plan-file",
    "daemon --lsf-plan-file",
    "trace record --lsf-plan-file",
}


def file_params() -> list[tuple[list[str], click.Parameter]]:
    found = []

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])
            return
        for p in command.params:
            is_file = isinstance(p.type, click.File) or (
                isinstance(p.type, click.Path) and p.type.file_okay and not p.type.dir_okay
            )
            if is_file:
                found.append((path, p))

    walk(cli, [])
    return found


def label(path: list[str], p: click.Parameter) -> str:
    return " ".join([*path, p.opts[0] if isinstance(p, click.Option) else p.name or ""])


def test_every_file_read_refuses_what_is_not_a_regular_file() -> None:
    loose = [
        label(path, p)
        for path, p in file_params()
        if not isinstance(p.type, InputFile | InputTextFile)
        and label(path, p) not in NOT_LOCAL_INPUTS
    ]
    assert not loose, f"use bftrainer.cli.params.InputFile for these inputs: {loose}"


@pytest.mark.parametrize(
    ("path", "param"),
    [
        pytest.param(path, p, id=label(path, p))
        for path, p in file_params()
        if isinstance(p.type, InputFile | InputTextFile)
    ],
)
@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_fifo_device_or_folder_is_one_line_at_once(
    tmp_path: Path, path: list[str], param: click.Parameter, kind: str
) -> None:
    target = {"fifo": tmp_path / "fifo", "device": Path("/dev/zero"), "folder": tmp_path}[kind]
    arg = [param.opts[0], str(target)] if isinstance(param, click.Option) else [str(target)]
    if kind == "fifo":  # a real process: a blocked open must fail the test, not hang it
        os.mkfifo(target)
        done = subprocess.run(
            [sys.executable, "-m", "bftrainer", *path, *arg],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )
        code, out = done.returncode, done.stderr
    else:
        result = CliRunner().invoke(cli, [*path, *arg])
        code, out = result.exit_code, result.output
    assert code == 2, out
    assert "Traceback" not in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Error")]
    assert str(target) in line


def test_a_corrupt_gzip_trace_is_one_line(tmp_path: Path) -> None:
    rows = b"time,node,idle\n" + b"2021-02-10 00:00:00,a,1\n" * 1000
    data = gzip.compress(rows)
    broken = tmp_path / "t.csv.gz"
    broken.write_bytes(data[:20] + bytes(30) + data[50:])  # header intact, stream not
    for command in (["trace", "stats"], ["replay", "--no-progress", "--out", "o"]):
        result = CliRunner().invoke(cli, [*command, str(broken)])
        assert result.exit_code == 2, result.output
        assert not isinstance(result.exception, Exception) or isinstance(
            result.exception, SystemExit
        ), repr(result.exception)
        (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error")]
        assert "t.csv.gz" in line and "cannot read trace" in line


def test_an_integer_of_5000_digits_is_one_line(tmp_path: Path) -> None:
    """Python refuses int() of more than 4,300 digits with a ValueError of its own."""
    digits = "1" * 5000
    problem = tmp_path / "p.json"
    problem.write_text(f'{{"pool": ["a"], "t_fwd": {digits}, "trainers": []}}')
    config = tmp_path / "c.toml"
    config.write_text(f"[policy]\nmax_trainers = {digits}\n")
    for args in (
        ["allocate", str(problem)],
        ["replay", "--config", str(config), "--out", str(tmp_path / "o")],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert not isinstance(result.exception, Exception) or isinstance(
            result.exception, SystemExit
        ), repr(result.exception)
        (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error")]
        assert "4300 digits" in line
