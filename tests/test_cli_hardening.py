"""Hostile input through the real command line: one clear line and exit 2, never a
traceback or a hang (issue 10)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.cli.params import Number

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


def numeric_options() -> list[tuple[list[str], click.Option]]:
    """Every option of every command (and subcommand) that takes a number."""
    found = []

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            # list/get, not .commands: the top group imports its commands lazily.
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, [*path, name])
            return
        for p in command.params:
            numeric = isinstance(p.type, Number | click.types._NumberParamTypeBase)
            if isinstance(p, click.Option) and not p.is_flag and numeric:
                found.append((path, p))

    walk(cli, [])
    return found


def test_every_numeric_option_uses_the_one_checked_type() -> None:
    raw = [f"{' '.join(path)} {p.opts[0]}" for path, p in numeric_options()]
    raw = [
        r
        for r, (_, p) in zip(raw, numeric_options(), strict=True)
        if not isinstance(p.type, Number)
    ]
    assert not raw, f"use bftrainer.cli.params.Number, not click's own numeric types: {raw}"
    assert len(numeric_options()) >= 20  # the walk found the commands


@pytest.mark.parametrize(
    ("path", "option"),
    [pytest.param(path, p, id=f"{' '.join(path)} {p.opts[0]}") for path, p in numeric_options()],
)
def test_numeric_options_refuse_nan_infinities_and_out_of_range(
    path: list[str], option: click.Option
) -> None:
    assert isinstance(option.type, Number)
    bad = ["nan", "NaN", "inf", "-inf", "1e999", "abc"]
    if option.type.min is not None and option.type.min >= 0:
        bad.append("-1")
    if option.type.max is not None:
        bad.append(repr(option.type.max * 10 + 1))
    if option.type.integer:
        bad.append("1.5")
    for value in bad:
        code, out = run(*path, option.opts[0], value)
        assert code == 2, (value, out)
        assert f"Invalid value for '{option.opts[0]}'" in out, (value, out)
        assert "is not" in one_error_line(out), out


def test_sweep_values_are_checked_like_options(tmp_path: Path) -> None:
    for sweep in ("tfwd=10,nan", "tfwd=inf", "tfwd=-5", "tfwd=1e99"):
        code, out = run("replay", "--sweep", sweep, "--no-progress", "--out", str(tmp_path))
        assert code == 2, out
        assert "--sweep" in one_error_line(out)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (bytes(range(256)) * 4, "not UTF-8 text"),
        (b'{"pool": ["\xff\xfe"], "trainers": []}', "not UTF-8 text"),
        (b"\x89PNG\r\n\x1a\n" + bytes(100), "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"\x00\x00", "not valid JSON"),
    ],
)
def test_allocate_on_binary_or_foreign_files_gives_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(content)
    code, out = run("allocate", str(path))
    assert code == 2
    assert message in one_error_line(out)
    result = CliRunner().invoke(cli, ["allocate", "-"], input=content)
    assert result.exit_code == 2 and message in result.output


PROFILES = "job,nodes,throughput_samples_per_s\n" + "".join(
    f"{j},{n},{100 * n}\n" for j in ("1-a", "2-b") for n in (1, 2, 4, 8)
)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["1-a,10,5,1,8,1e6,0", "2-b,10,5,6,2,1e6,0"], "job 2 ('2-b'): n_min 6 > n_max 2"),
        (["1-a,10,5,1,8,1e6,0", "1-a,10,5,1,4,1e6,0"], "id '1-a' also names job 1"),
        (["1-a,10,5,1,16,1e6,0"], "curve ends at 8"),
        (["1-a,1e9,5,1,8,1e6,0"], "rescale_up is 1000000000.0, expected <= 1e+06"),
        (["1-a,10,5,1,8,0,0"], "work is 0.0 samples"),
    ],
)
def test_a_bad_workload_is_refused_before_the_replay_starts(
    tmp_path: Path, rows: list[str], message: str
) -> None:
    bounds = tmp_path / "x-Jbnd-1.csv"
    bounds.write_text("job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\n" + "\n".join(rows) + "\n")
    (tmp_path / "x-JNPs-1.csv").write_text(PROFILES)
    trace = tmp_path / "t.csv"
    trace.write_text("time,node,idle\n0,a,1\n0,b,1\n36000,a,0\n")
    out = tmp_path / "out"
    code, text = run(
        "replay", str(trace), "--jobs", str(bounds), "--no-progress", "--out", str(out)
    )
    assert code == 2, text
    assert message in one_error_line(text)
    assert not out.exists()  # refused before anything ran or was written
