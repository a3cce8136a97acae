"""``bftrainer report``, run as a user runs it: the page, its images, its table, and
one clear line for bad input (bftrainer/report/, bftrainer/cli/report.py)."""

from __future__ import annotations

import base64
import io
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest

from bftrainer.state import Store
from tests.bftrainer.test_frames import T0, build_store, run_replay

MAX_PAGE_BYTES = 5 * 1024 * 1024


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bftrainer", "report", *args], capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def replay_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay") / "out"
    run_replay(out, "--policy", "milp,equal")
    return out


def inlined_images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def check_images(out: Path) -> list[bytes]:
    """Every PNG beside the page decodes, and the page inlines exactly those."""
    pngs = sorted(out.glob("*.png"))
    assert pngs
    for png in pngs:
        pixels = matplotlib.image.imread(png)
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    inlined = inlined_images((out / "report.html").read_text())
    assert sorted(inlined) == sorted(p.read_bytes() for p in pngs)
    for data in inlined:
        assert matplotlib.image.imread(io.BytesIO(data)).size
    return inlined


def test_a_replays_report_is_one_page_with_its_figures(replay_out: Path) -> None:
    r = report(str(replay_out))
    assert r.returncode == 0, r.stderr
    page = replay_out / "report" / "report.html"
    assert r.stdout.strip() == str(page)
    assert page.stat().st_size < MAX_PAGE_BYTES
    check_images(page.parent)
    text = page.read_text()
    assert "<script" not in text and "http" not in text.split("<body>")[1]
    for run in ("milp-tfwdauto", "equal"):
        for figure in ("pool", "trainers", "utilization", "costs", "latency"):
            assert (page.parent / f"{run}-{figure}.png").is_file()
        u = json.loads((replay_out / run / "summary.json").read_text())["utilization_efficiency"]
        assert f"<td>{100 * u:.1f}%</td>" in text


def test_trainers_beyond_the_top_are_grouped_and_the_page_says_so(
    replay_out: Path, tmp_path: Path
) -> None:
    r = report(str(replay_out / "equal"), "--top", "3", "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    drawn = pd.read_csv(replay_out / "equal" / "allocations.csv")["trainer"].nunique()
    text = (tmp_path / "rep" / "report.html").read_text()
    assert (
        f"The 3 trainers with the most node-hours are drawn on their own; the other "
        f"{drawn - 3:,} of the {drawn:,} that held nodes are grouped" in text
    )


def test_a_daemons_report_shows_its_holders(tmp_path: Path) -> None:
    build_store(tmp_path / "state")
    r = report("--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "rep" / "report.html")
    check_images(tmp_path / "rep")
    assert (tmp_path / "rep" / "holders.png").is_file()
    text = (tmp_path / "rep" / "report.html").read_text()
    assert "<tr><th>trainers done</th><td>1 / 2</td></tr>" in text
    assert "<tr><th>preemptions</th><td>1</td></tr>" in text
    assert "<td>not recorded</td>" in text


def test_a_time_range_narrows_a_daemons_report(tmp_path: Path) -> None:
    build_store(tmp_path / "state")
    start, end = "2023-11-14T22:14:00Z", "2023-11-14T22:15:00Z"  # T0 + 40 s .. + 100 s
    r = report(
        *("--state-dir", str(tmp_path / "state"), "--start", start, "--end", end),
        *("--out", str(tmp_path / "rep")),
    )
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "rep" / "report.html").read_text()
    assert "From 2023-11-14 22:14 UTC to 2023-11-14 22:15 UTC" in text
    assert "<tr><th>hours</th><td>0.0</td></tr>" in text


def a_store(tmp_path: Path) -> Path:
    build_store(tmp_path / "state")
    return tmp_path / "state"


def newer_store(tmp_path: Path) -> Path:
    build_store(tmp_path / "state")
    with sqlite3.connect(tmp_path / "state" / "state.db") as conn:
        conn.execute("PRAGMA user_version = 99")
    return tmp_path / "state"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (lambda t: [str(t)], "not a replay output (no summary.json)"),
        (lambda t: [str(t / "missing")], "not a folder"),
        (
            lambda t: ["--state-dir", str(newer_store(t)), "--out", str(t / "r")],
            "has schema version 99, newer than this bftrainer understands",
        ),
        (
            lambda t: [
                *("--state-dir", str(a_store(t)), "--out", str(t / "r")),
                *("--start", "2030-01-01", "--end", "2030-01-02"),
            ],
            "empty time range: nothing between 2030-01-01 00:00:00 UTC and",
        ),
        (lambda t: [], "give a replay's output folder or --state-dir"),
        (lambda t: [str(t), "--start", "2030-01-01"], "--start/--end apply to --state-dir only"),
        (lambda t: ["--state-dir", str(t)], "--state-dir needs --out"),
    ],
)
def test_bad_input_gets_one_clear_line(tmp_path: Path, args: object, message: str) -> None:
    assert callable(args)
    r = report(*args(tmp_path))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_a_long_span_zooms_on_where_the_trainers_held_most(tmp_path: Path) -> None:
    """Over more than 12 h, trainers are drawn one by one in the busiest 6 h."""
    build_store(tmp_path / "state")
    with Store.open(tmp_path / "state") as s:
        s.add_pool_event(left=["n4"], now_s=T0 + 13 * 3600)
    r = report("--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "rep" / "report.html").read_text()
    assert (
        "Trainers are drawn one by one in a zoom: the 6 h in which they held the most "
        "node-hours, from 2023-11-14 22:13 UTC to 2023-11-15 04:13 UTC." in text
    )
    assert {p.name for p in (tmp_path / "rep").glob("pool*.png")} == {"pool.png", "pool-zoom.png"}


def test_a_daemon_that_has_only_seen_its_pool_gets_a_report(tmp_path: Path) -> None:
    """Records of one instant, no trainer yet: a page all the same, without warnings."""
    with Store.open(tmp_path / "state") as s:
        s.add_pool_event(joined=["n1", "n2"], now_s=T0)
        s.add_holder("9", "n1", now_s=T0)
    r = report("--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    check_images(tmp_path / "rep")
    text = (tmp_path / "rep" / "report.html").read_text()
    assert "<tr><th>trainers done</th><td>0 / 0</td></tr>" in text


@pytest.mark.parametrize(
    "span", [["--start", "0"], ["--end", "2100-01-01"], ["--start", "0", "--end", "4102444800"]]
)
def test_a_span_past_the_records_is_clamped_to_them(tmp_path: Path, span: list[str]) -> None:
    """Seconds of records and --start 0: a page of those seconds, not of 56 years."""
    with Store.open(tmp_path / "state") as s:
        s.add_pool_event(joined=["n1", "n2"], now_s=T0)
        s.add_pool_event(left=["n2"], now_s=T0 + 5)
    r = report("--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "rep"), *span)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "rep" / "report.html").read_text()
    assert "1970" not in text and "2100" not in text
    assert "2023-11-14" in text
