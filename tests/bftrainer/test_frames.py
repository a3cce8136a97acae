"""A replay's outputs and a daemon's store as DataFrames (bftrainer/report/frames.py)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bftrainer.report.frames import FramesError, load_replay, replay_runs
from bftrainer.report.store_frames import load_store
from bftrainer.state import Store

T0 = 1_700_000_000.0


def run_replay(out: Path, *args: str) -> None:
    """``bftrainer replay`` as a user runs it: a small synthetic day, the dp solver."""
    small = ["--synthetic-nodes", "64", "--synthetic-hours", "6", "--jobs-count", "30"]
    options = [*small, "--solver", "dp", "--no-progress", "--out", str(out)]
    subprocess.run(
        [sys.executable, "-m", "bftrainer", "replay", *options, *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def replay_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay") / "out"
    run_replay(out, "--policy", "milp,equal")
    return out


def build_store(state_dir: Path) -> None:
    """Two trainers and two holders, through the daemon's state API: t0001 starts on 2
    nodes, shrinks to 1, completes; t0002 starts on 2, loses n3 to the main scheduler
    (a preemption), is cancelled. Times are seconds after T0."""
    with Store.open(state_dir) as s:
        s.add_pool_event(joined=["n1", "n2", "n3", "n4"], now_s=T0)
        h1 = s.add_holder("101", "n1", now_s=T0)
        h2 = s.add_holder("102", "n2", now_s=T0)
        s.set_holder_state(h1.job_id, "running", now_s=T0 + 2)
        s.set_holder_state(h2.job_id, "running", now_s=T0 + 2)
        a = s.submit("a.py", n_max=4, now_s=T0)
        b = s.submit("b.py", n_max=4, now_s=T0 + 10)
        s.record_allocation(a, ["n1", "n2"], now_s=T0 + 5)
        s.set_trainer_state(a, "running", now_s=T0 + 5)
        s.record_allocation(a, ["n1"], now_s=T0 + 20)
        s.record_allocation(b, ["n2", "n3"], now_s=T0 + 20)
        s.set_trainer_state(b, "running", now_s=T0 + 20)
        s.add_pool_event(left=["n3"], now_s=T0 + 100)
        s.record_allocation(b, ["n2"], now_s=T0 + 100.5)
        s.set_holder_state(h1.job_id, "ended", reason="preempted", now_s=T0 + 150)
        s.record_allocation(a, [], now_s=T0 + 200)
        s.set_trainer_state(a, "done", now_s=T0 + 200)
        s.request_cancel(b)
        s.record_allocation(b, [], now_s=T0 + 300)
        s.set_trainer_state(b, "cancelled", reason="cancelled by the user", now_s=T0 + 300)
        s.set_holder_state(h2.job_id, "ended", reason="released", now_s=T0 + 310)


def at(seconds: float) -> pd.Timestamp:
    return pd.Timestamp(T0 + seconds, unit="s", tz="UTC")


# ---------------------------------------------------------------------- replays


def test_a_replays_frames_are_typed_and_agree_with_its_summary(replay_out: Path) -> None:
    assert set(replay_runs(replay_out)) == {"milp-tfwdauto", "equal"}
    f = load_replay(replay_out / "milp-tfwdauto")
    summary = json.loads((replay_out / "milp-tfwdauto" / "summary.json").read_text())
    for frame, col in [(f.events, "time"), (f.allocations, "time"), (f.trainers, "finished")]:
        assert isinstance(frame[col].dtype, pd.DatetimeTZDtype), col
    assert f.allocations["nodes"].dtype == "int64"
    assert set(f.allocations["change"].cat.categories) >= {"start", "rescale", "preempt"}
    assert (f.trainers["state"] == "done").sum() == summary["trainers_completed"]
    assert len(f.events) == summary["events"]
    assert f.start == pd.Timestamp(summary["start"])
    # the allocation changes, replayed in order, give each event's allocated nodes
    held = f.allocations.drop_duplicates(["time", "trainer"], keep="last")
    wide = held.pivot(index="time", columns="trainer", values="nodes").ffill().fillna(0)
    total = wide.sum(axis=1).reindex(f.events["time"], method="ffill").fillna(0)
    assert (total.to_numpy() == f.events["allocated_nodes"].to_numpy()).all()


def test_a_folder_of_several_runs_names_them(replay_out: Path) -> None:
    with pytest.raises(FramesError, match=r"several runs \(equal, milp-tfwdauto\)"):
        load_replay(replay_out)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "not a replay output \\(no summary.json\\)"),
        (lambda d: (d / "summary.json").write_text("{"), "summary.json: not JSON"),
        (lambda d: (d / "summary.json").write_text("{}"), "not a complete replay output"),
    ],
)
def test_a_folder_that_is_not_a_replay_output_is_named(
    tmp_path: Path, setup: object, message: str
) -> None:
    assert callable(setup)
    setup(tmp_path)
    with pytest.raises(FramesError, match=message):
        load_replay(tmp_path)


# ---------------------------------------------------------------------- a daemon's store


def test_a_stores_frames_tell_each_change_and_its_kind(tmp_path: Path) -> None:
    build_store(tmp_path / "state")
    f = load_store(tmp_path / "state")
    rows = [(r.time, r.trainer, r.nodes, r.change) for r in f.allocations.itertuples()]
    assert rows == [
        (at(5), "t0001", 2, "start"),
        (at(20), "t0001", 1, "rescale"),
        (at(20), "t0002", 2, "start"),
        (at(100.5), "t0002", 1, "preempt"),
        (at(200), "t0001", 0, "complete"),
        (at(300), "t0002", 0, "cancel"),
    ]
    assert list(f.pool["nodes"]) == [4, 3]
    assert dict(zip(f.trainers["id"], f.trainers["state"], strict=True)) == {
        "t0001": "done",
        "t0002": "cancelled",
    }
    assert list(f.holders["reason"]) == ["preempted", "released"]
    assert f.holders["ended"].tolist() == [at(150), at(310)]


def test_a_trainer_that_waits_at_zero_nodes_then_fails_is_told_apart(tmp_path: Path) -> None:
    """Going to no node while it waits is a rescale; its end comes at its finish."""
    with Store.open(tmp_path / "state") as s:
        s.add_pool_event(joined=["n1"], now_s=T0)
        t = s.submit("a.py", now_s=T0)
        s.record_allocation(t, ["n1"], now_s=T0 + 5)
        s.set_trainer_state(t, "running", now_s=T0 + 5)
        s.record_allocation(t, [], now_s=T0 + 50)
        s.set_trainer_state(t, "waiting", now_s=T0 + 50)
        s.set_trainer_state(t, "failed", reason="exit 1", now_s=T0 + 90)
    f = load_store(tmp_path / "state")
    assert [(r.time, r.nodes, r.change) for r in f.allocations.itertuples()] == [
        (at(5), 1, "start"),
        (at(50), 0, "rescale"),
        (at(90), 0, "fail"),
    ]


def test_a_time_range_keeps_what_held_at_its_start(tmp_path: Path) -> None:
    build_store(tmp_path / "state")
    f = load_store(tmp_path / "state", start=at(50), end=at(250))
    assert [(r.time, r.trainer, r.nodes) for r in f.allocations.itertuples()] == [
        (at(50), "t0001", 1),
        (at(50), "t0002", 2),
        (at(100.5), "t0002", 1),
        (at(200), "t0001", 0),
    ]
    assert list(f.pool["nodes"]) == [4, 3]
    assert f.pool["time"].iloc[0] == at(50)


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (1000, 2000, "empty time range: nothing between .* \\(the store has records from"),
        (100, 50, "empty time range: .* is not before"),
    ],
)
def test_an_empty_time_range_is_named(
    tmp_path: Path, start: float, end: float, message: str
) -> None:
    build_store(tmp_path / "state")
    with pytest.raises(FramesError, match=message):
        load_store(tmp_path / "state", start=at(start), end=at(end))


def test_a_store_from_a_newer_version_is_named(tmp_path: Path) -> None:
    build_store(tmp_path / "state")
    with sqlite3.connect(tmp_path / "state" / "state.db") as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(FramesError, match="schema version 99, newer than this bftrainer"):
        load_store(tmp_path / "state")


def test_the_pandas_example_of_the_docs_runs(replay_out: Path, tmp_path: Path) -> None:
    """docs/replay.md's example, as written, on a replay's output at out/demo."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "replay.md").read_text()
    example = docs.split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in example.splitlines() if line.strip()]) == 5
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "demo").symlink_to(replay_out)
    r = subprocess.run(
        [sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["id", "state", "wait_h", "peak_nodes"]
    assert len(rows) == 5
