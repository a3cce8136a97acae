"""Files read back are checked: ``report`` on a replay output whose files are empty,
truncated or garbage, and ``trace stats`` on a damaged Parquet trace, answer with one
line naming the file, never a traceback (issue 31). Run as a user runs them."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import bftrainer

pytest.importorskip("pyarrow")


def one_line_naming(done: subprocess.CompletedProcess[str], name: str) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:
        return  # read as it is (an empty windows.csv is a replay without windows)
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and name in errors[0], done.stderr
    after = done.stderr.split(errors[0], 1)[1].strip()
    assert not after, f"the error runs on past its line: {done.stderr}"


@pytest.fixture(scope="module")
def replay_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("replay")
    done = bftrainer(
        *("replay", "--synthetic-nodes", "8", "--synthetic-hours", "2", "--jobs-count", "4"),
        *("--no-progress", "--out", "out"),
        cwd=where,
    )
    assert done.returncode == 0, done.stderr
    return where / "out"


def empty(data: bytes) -> bytes:
    return b""


def garbage(data: bytes) -> bytes:
    return bytes(range(256)) * 4


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def first_line(data: bytes) -> bytes:
    return data.split(b"\n", 1)[0] + b"\n"


def wrong_values(data: bytes) -> bytes:
    """Every field after the header replaced by text."""
    lines = data.decode().splitlines()
    if not lines or lines[0].startswith("{"):
        return b'{"start": "not a time", "end": [1], "runs": 3}'
    width = len(lines[0].split(","))
    return ("\n".join([lines[0], *[",".join(["x"] * width)] * 3]) + "\n").encode()


def no_such_day(data: bytes) -> bytes:
    """The first row's first time made 30 February (pandas' message ran to four lines)."""
    text = data.decode()
    if text.startswith("{"):
        return data.replace(b'"start": "2', b'"start": "2021-02-30T00:00:00Z", "x": "2', 1)
    return re.sub(r"\d{4}-\d\d-\d\dT", "2021-02-30T", text, count=1).encode()


FILES = ["summary.json", "events.csv", "trainers.csv", "allocations.csv", "windows.csv"]
DAMAGE: list[Callable[[bytes], bytes]] = [
    empty,
    garbage,
    truncated,
    first_line,
    wrong_values,
    no_such_day,
]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", FILES)
def test_report_on_a_damaged_replay_file_names_it(
    replay_out: Path, tmp_path: Path, name: str, damage: Callable[[bytes], bytes]
) -> None:
    run = tmp_path / "out"
    shutil.copytree(replay_out, run)
    path = run / name
    path.write_bytes(damage(path.read_bytes()))
    done = bftrainer("report", str(run), "--out", str(tmp_path / "rep"), cwd=tmp_path)
    one_line_naming(done, name)


@pytest.mark.parametrize("damage", [empty, garbage, truncated], ids=lambda f: f.__name__)
@pytest.mark.parametrize("command", [["trace", "stats"], ["replay", "--out", "o"]])
def test_a_damaged_parquet_trace_is_named_in_one_line(
    tmp_path: Path, command: list[str], damage: Callable[[bytes], bytes]
) -> None:
    import pandas as pd

    frame = pd.DataFrame({"time": [1612915200, 1612918800], "node": ["a", "a"], "idle": [1, 0]})
    frame.to_parquet(tmp_path / "t.parquet")
    data = (tmp_path / "t.parquet").read_bytes()
    (tmp_path / "t.parquet").write_bytes(b"PAR1" + damage(data[4:]))
    done = bftrainer(*command[:2], "t.parquet", *command[2:], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    one_line_naming(done, "t.parquet")
