"""Every command's ``--json`` output is JSON and nothing else, as a script reads it.

Each command runs as a subprocess and its whole stdout goes through ``json.loads``: one
stray byte (a solver's banner printed from native code) fails it. The list of commands
is checked against the command line itself, so a new ``--json`` gets a case here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from bftrainer.cli import cli
from bftrainer.state import Store, ensure_state_dir

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "idle_monitor" / "fixtures"


def commands_with_json() -> set[str]:
    found = set()

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, [*path, name])
            return
        if any("--json" in p.opts for p in command.params if isinstance(p, click.Option)):
            found.add(" ".join(path))

    walk(cli, [])
    return found


def allocate(solver: str) -> Callable[[Path], list[str]]:
    def args(tmp_path: Path) -> list[str]:
        return ["allocate", str(ROOT / "examples" / "problem.json"), "--solver", solver]

    return args


def status(tmp_path: Path) -> list[str]:
    path = ensure_state_dir(tmp_path / "state")
    Store.open(path).close()
    return ["status", "--state-dir", str(path)]


def status_of_a_trainer_with_infinite_rates(tmp_path: Path) -> list[str]:
    """Non-finite values recorded (a rate over no time): JSON has no Infinity."""
    path = ensure_state_dir(tmp_path / "state")
    with Store.open(path) as store:
        tid = store.submit(ROOT / "examples" / "train_mlp.py", [])
        store.update_progress(tid, throughput_sps=float("inf"), goodput_sps=float("nan"))
    return ["status", "--state-dir", str(path)]


def trace_stats(tmp_path: Path) -> list[str]:
    trace = tmp_path / "t.csv"
    trace.write_text("time,node,idle\n2021-02-10 00:00:00,a,1\n2021-02-10 01:00:00,a,0\n")
    return ["trace", "stats", str(trace)]


def goodput_fit(tmp_path: Path) -> list[str]:
    obs = tmp_path / "obs.csv"
    rows = [(n, b, 0.05 + 0.002 * b / n + 0.01 * n) for n in (1, 2, 4, 8) for b in (16, 64)]
    obs.write_text(
        "nodes,local_bsz,accum_steps,step_time_s\n"
        + "".join(f"{n},{b},0,{t}\n" for n, b, t in rows)
    )
    return ["goodput", "fit", str(obs)]


def pool(tmp_path: Path) -> list[str]:
    """LSF's recorded replies, printed by programs of those names on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program, name in [
        ("bhosts", "lsf-bhosts-wide.txt"),
        ("bslots", "lsf-bslots-long.txt"),
        ("bjobs", "lsf-bjobs-killable.json"),
    ]:
        script = bin_dir / program
        script.write_text(f"#!/bin/sh\nexec cat {FIXTURES / name}\n")
        script.chmod(0o755)
    return ["pool", "--scheduler", "lsf", "--bf-queue", "killable"]


CASES: dict[str, list[Callable[[Path], list[str]]]] = {
    "allocate": [allocate("highs"), allocate("cbc"), allocate("gurobi"), allocate("dp")],
    "status": [status, status_of_a_trainer_with_infinite_rates],
    "trace stats": [trace_stats],
    "goodput fit": [goodput_fit],
    "pool": [pool],
}


def test_every_command_with_json_has_a_case() -> None:
    assert commands_with_json() == set(CASES)


@pytest.mark.parametrize(
    "make_args",
    [pytest.param(f, id=f"{name}-{i}") for name, fs in CASES.items() for i, f in enumerate(fs)],
)
def test_json_stdout_is_json_and_nothing_else(
    tmp_path: Path, make_args: Callable[[Path], list[str]]
) -> None:
    args = make_args(tmp_path)
    if "gurobi" in args and importlib.util.find_spec("gurobipy") is None:
        pytest.skip("gurobipy is not installed")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    env.pop("LSF_ENVDIR", None)
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer", *args, "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    strict_loads(done.stdout.decode())  # no byte before or after the object


def strict_loads(text: str) -> object:
    """``json.loads`` that refuses NaN and Infinity, which are not JSON."""

    def refuse(name: str) -> object:
        raise AssertionError(f"{name} is not JSON: {text[:2000]}")

    return json.loads(text, parse_constant=refuse)


def test_every_json_writer_is_strict() -> None:
    """One way to write JSON: ``bftrainer.common.strict_json.dumps`` (or ``allow_nan=False``)."""
    loose = []
    for path in ROOT.glob("*/**/*.py"):
        if path.parts[len(ROOT.parts)] not in ("bftrainer", "milp", "idle_monitor", "trainers"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "json.dump" in line and "strict_json." not in line and "allow_nan=False" not in line:
                loose.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    # What the store and the launch spec keep for themselves, read back only by Python.
    allowed = {
        "bftrainer/state/schema.py",
        "bftrainer/common/strict_json.py",
        "trainers/launch/base.py",
    }
    assert [entry for entry in loose if entry.split(":")[0] not in allowed] == []


def test_a_replay_prints_no_solver_output(tmp_path: Path) -> None:
    """The daemon and the replay solve in-process like ``allocate``: their stdout is ours."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bftrainer", "replay", "--synthetic-nodes", "16"),
            *("--synthetic-hours", "2", "--jobs-count", "20", "--no-progress"),
            *("--out", str(tmp_path / "o")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "HiGHS" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "make_args",
    [pytest.param(fs[0], id=name) for name, fs in CASES.items()],
)
def test_output_on_a_full_disk_is_one_line(
    tmp_path: Path, make_args: Callable[[Path], list[str]]
) -> None:
    """stdout that cannot be written (> /dev/full) was a traceback."""
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    env.pop("LSF_ENVDIR", None)
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "bftrainer", *make_args(tmp_path)],
            cwd=tmp_path,
            env=env,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    assert "No space left on device" in line
