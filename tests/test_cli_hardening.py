"""Hostile input through the real command line: one clear line and exit 2, never a
traceback or a hang (issue 10)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
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


def replay_args(out: Path, *extra: str) -> list[str]:
    return [
        "replay",
        "--synthetic-nodes",
        "16",
        "--synthetic-hours",
        "2",
        "--jobs-count",
        "5",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def test_a_rerun_replaces_an_earlier_output_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, text = run(*replay_args(out, "--policy", "milp,equal"))
    assert code == 0, text
    assert (out / "milp-tfwdauto").is_dir() and (out / "equal").is_dir()
    code, text = run(*replay_args(out, "--policy", "equal"))
    assert code == 0, text
    assert not (out / "milp-tfwdauto").exists() and not (out / "equal").exists()
    assert (out / "summary.json").is_file() and (out / "events.csv").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left


def test_an_interrupted_rerun_leaves_the_earlier_output_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bftrainer.replay.runs_output as replay_cli

    out = tmp_path / "out"
    assert run(*replay_args(out))[0] == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(replay_cli, "plot_costs", interrupted)
    result = CliRunner().invoke(cli, replay_args(out, "--seed", "7"))
    assert result.exit_code != 0
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("kind", ["foreign-folder", "file"])
def test_replay_refuses_an_out_it_did_not_write_before_running(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / "thesis.tex").write_text("mine")
    code, text = run(*replay_args(out))
    assert code == 2
    assert "--out" in one_error_line(text)
    assert (out.read_text() if kind == "file" else (out / "thesis.tex").read_text()) == "mine"


def children(pid: int) -> list[int]:
    """The processes ``pid``'s main thread started (where multiprocessing starts them):
    read from /proc, cheap enough to poll every few milliseconds; from ``ps`` where the
    kernel has no such file."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        ps = ["ps", "--ppid", str(pid), "-o", "pid="]
        out = subprocess.run(ps, capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]
    except OSError:
        return []


def children_where(
    proc: subprocess.Popen[str], condition: Callable[[int], bool], count: int
) -> list[int]:
    """Wait (up to 120 s) until ``count`` children of ``proc`` meet ``condition``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        found = [p for p in children(proc.pid) if condition(p)]
        if len(found) >= count:
            return found
        time.sleep(0.005)
    raise AssertionError(f"never {count} children of {proc.pid} meeting the condition")


def maps(library: str) -> Callable[[int], bool]:
    """Whether a process has ``library`` loaded: a replay worker loads the solver when it
    takes its first decision."""

    def loaded(pid: int) -> bool:
        try:
            return library in Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return False

    return loaded


@pytest.mark.parametrize("when", ["pool-starting", "workers-starting", "workers-replaying"])
def test_ctrl_c_during_a_multi_policy_replay_prints_no_worker_traceback(
    tmp_path: Path, when: str
) -> None:
    # A trace long enough that two replays of it take minutes.
    rows = ["time,node,idle", *(f"1612915200,n{n},1" for n in range(64))]
    state = dict.fromkeys(range(64), 1)
    for k in range(1, 4000):
        node = (k * 37) % 64
        state[node] ^= 1
        rows.append(f"{1612915200 + 600 * k},n{node},{state[node]}")
    trace = tmp_path / "long.csv"
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    args = ["replay", str(trace), "--jobs-count", "3000", "--policy", "milp,equal"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bftrainer", *args, "--no-progress", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: Ctrl-C is SIGINT to the whole group
    )
    try:
        # Events, not a clock: the pool's first process exists (multiprocessing's
        # resource tracker, whose launch once dropped a Ctrl-C: the replay ran on for
        # minutes), the workers exist (some may still be starting, while the replay
        # ignores Ctrl-C), or one of them is deciding (it loaded the solver).
        started = children_where(proc, lambda p: True, 1 if when == "pool-starting" else 2)
        if when == "workers-replaying":
            children_where(proc, maps("highspy"), 1)
        assert started and proc.poll() is None
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err, err
    assert "KeyboardInterrupt" not in err, err
    assert proc.returncode != 0
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.csv"]


def fake_programs(tmp_path: Path, *names: str) -> Path:
    """Programs that leave a mark when run: a check must come before any of them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran-{name}\nsleep 30\n")
        script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("command", [["pool"], ["trace", "record", "--polls", "1"]])
@pytest.mark.parametrize("how", ["--env", "environment"])
def test_a_missing_slurm_conf_is_named_before_any_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str], how: str
) -> None:
    bin_dir = fake_programs(tmp_path, "sinfo", "squeue", "scontrol")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    conf = tmp_path / "nowhere" / "slurm.conf"
    args = [*command, "--scheduler", "slurm"]
    if command[0] == "trace":
        args += ["--out", str(tmp_path / "logs")]
    if how == "--env":
        args += ["--env", f"SLURM_CONF={conf}"]
    else:
        monkeypatch.setenv("SLURM_CONF", str(conf))
    started = time.monotonic()
    code, out = run(*args)
    assert code == 1, out
    assert f"{conf} does not exist" in one_error_line(out)
    assert time.monotonic() - started < 10
    assert not list(tmp_path.glob("ran-*"))  # refused before running anything
    assert not list(tmp_path.glob("logs/*.csv"))  # and no header-only trace left behind


@pytest.mark.parametrize(
    ("scheduler", "programs"),
    [("slurm", ["sinfo", "squeue", "scontrol"]), ("lsf", ["bhosts", "bslots"])],
)
def test_scheduler_commands_not_on_path_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheduler: str, programs: list[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    code, out = run("pool", "--scheduler", scheduler)
    assert code == 1
    line = one_error_line(out)
    for program in programs:
        assert f"{program} is not on PATH" in line


@pytest.mark.parametrize("command", [["pool"], ["daemon"], ["trace", "record", "--polls", "1"]])
def test_a_command_timeout_past_what_a_wait_can_hold_is_refused(command: list[str]) -> None:
    """--timeout 1e12 passed the flag and died in subprocess's wait with an
    OverflowError traceback at the first scheduler command."""
    code, out = run(*command, "--scheduler", "slurm", "--timeout", "1e12")
    assert code == 2, out
    assert "Invalid value for '--timeout'" in one_error_line(out), out
    if command[0] == "trace":  # and its poll interval, waited the same way
        code, out = run(*command, "--scheduler", "slurm", "--interval", "1e12", "--out", "x")
        assert code == 2, out
        assert "Invalid value for '--interval'" in one_error_line(out), out


@pytest.mark.parametrize("which", ["bounds", "profiles"])
@pytest.mark.parametrize("content", [bytes(range(128, 256)) * 8, b"job,Tcup\x00,x\n1,2\x00\n"])
def test_a_binary_job_file_gives_one_line(tmp_path: Path, which: str, content: bytes) -> None:
    bounds = tmp_path / "x-Jbnd-1.csv"
    profiles = tmp_path / "x-JNPs-1.csv"
    bounds.write_text("job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\n1-a,10,5,1,8,1e6,0\n")
    profiles.write_text(PROFILES)
    (bounds if which == "bounds" else profiles).write_bytes(content)
    trace = tmp_path / "t.csv"
    trace.write_text(GOOD_TRACE)
    code, text = run(
        "replay", str(trace), "--jobs", str(bounds), "--no-progress", "--out", str(tmp_path / "o")
    )
    assert code == 2, text
    assert "x-J" in one_error_line(text)
