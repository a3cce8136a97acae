"""submit, status, cancel and logs: what a user sees, with a daemon lock held or not.

The daemon itself runs in the end-to-end tests (test_daemon_e2e.py); here a test holds
the state directory's lock as a running daemon does, so the commands' own behaviour is
checked: ids, the JSON shape, errors in one line with a non-zero exit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.state import DEFAULT_RESCALE_S, DaemonLock, Store, ensure_state_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state directory with a live daemon lock (as ``bftrainer daemon`` holds it)."""
    path = ensure_state_dir(tmp_path / "state")
    Store.open(path).close()
    with DaemonLock(path):
        yield path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def submit(state_dir: Path, *args: str) -> tuple[int, str]:
    return run("submit", str(EXAMPLE), *args, "--state-dir", str(state_dir))


def test_submit_prints_the_id_last_and_queues_the_trainer(state_dir: Path) -> None:
    code, out = submit(
        state_dir,
        "--lr",
        "0.1",
        "--max-nodes",
        "4",
        "--work-samples",
        "1000",
        "--backend",
        "torchrun",
    )
    assert code == 0, out
    first = out.strip().splitlines()[-1]
    code, out = submit(
        state_dir, "--rescale-up", "3", "--rescale-down", "1", "--backend", "torchrun"
    )
    second = out.strip().splitlines()[-1]
    assert first != second and first < second  # sortable by submission
    with Store.open(state_dir) as store:
        a, b = store.trainer(first), store.trainer(second)
    # Unknown options go to the script; the submit options are taken wherever they stand.
    assert a.args == ("--lr", "0.1")
    assert (a.n_max, a.work_samples, a.state, a.backend) == (4, 1000, "queued", "torchrun")
    assert (a.rescale_up_s, a.rescale_down_s) == DEFAULT_RESCALE_S["torchrun"]
    assert (b.rescale_up_s, b.rescale_down_s) == (3.0, 1.0)
    assert os.path.isabs(a.script)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-nodes", "3", "--max-nodes", "2"], "--max-nodes 2 is below --min-nodes 3"),
        (["--max-nodes", "0"], "--max-nodes"),
        (["--work-samples", "nan"], "--work-samples"),
        (["--rescale-up", "-1"], "--rescale-up"),
    ],
)
def test_bad_limits_get_one_line(state_dir: Path, args: list[str], message: str) -> None:
    code, out = submit(state_dir, "--backend", "torchrun", *args)
    assert code == 2
    (error,) = [line for line in out.splitlines() if line.startswith("Error:")]
    assert message in error
    with Store.open(state_dir) as store:
        assert store.trainers() == []


def test_a_missing_script_is_refused(state_dir: Path, tmp_path: Path) -> None:
    code, out = run("submit", str(tmp_path / "nope.py"), "--state-dir", str(state_dir))
    assert code == 2
    assert out.strip().splitlines()[-1].endswith("nope.py: no such file")


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_script_that_is_no_regular_file_is_named_so(
    state_dir: Path, tmp_path: Path, kind: str
) -> None:
    """It was refused as "no such file", which it is not."""
    script = tmp_path / "train.py"
    os.mkfifo(script) if kind == "fifo" else script.mkdir()
    code, out = run("submit", str(script), "--state-dir", str(state_dir))
    what = "a FIFO" if kind == "fifo" else "a folder"
    assert code == 2
    assert out.strip().splitlines()[-1].endswith(f"train.py is {what}, not a regular file")


def test_no_daemon_running_is_an_error(tmp_path: Path) -> None:
    path = ensure_state_dir(tmp_path / "state")
    Store.open(path).close()
    # torchrun: needs no build, so the daemon check is what this reaches on any machine
    code, out = run("submit", str(EXAMPLE), "--backend", "torchrun", "--state-dir", str(path))
    assert code == 1
    assert "no bftrainer daemon is running" in out
    code, out = run("cancel", "t0001", "--state-dir", str(path))
    assert code == 1 and "no bftrainer daemon is running" in out
    # status works without a daemon, and says so.
    code, out = run("status", "--state-dir", str(path))
    assert code == 0 and "not running" in out


def test_a_state_directory_open_to_others_is_refused(tmp_path: Path) -> None:
    path = ensure_state_dir(tmp_path / "state")
    Store.open(path).close()
    path.chmod(0o777)
    try:
        code, out = run("status", "--state-dir", str(path))
    finally:
        path.chmod(0o700)
    assert code == 1
    assert "writable by group or others" in out


def test_status_json_lists_the_pool_and_every_trainer(state_dir: Path) -> None:
    _, out = submit(state_dir, "--backend", "torchrun", "--max-nodes", "2")
    tid = out.strip().splitlines()[-1]
    with Store.open(state_dir) as store:
        store.set_trainer_state(tid, "running")
        store.record_allocation(tid, ["node2", "node1"])
        store.update_progress(tid, samples_done=640, throughput_sps=12.5, batch_size=64)
        store.set_setting(
            "pool",
            {
                "time_s": 1.0,
                "stale": False,
                "nodes": {
                    "node1": {
                        "window_s": None,
                        "holder": "7",
                        "holder_state": "running",
                        "trainer": tid,
                    },
                    "node3": {
                        "window_s": 600.0,
                        "holder": None,
                        "holder_state": None,
                        "trainer": None,
                    },
                },
            },
        )
    code, out = run("status", "--json", "--state-dir", str(state_dir))
    assert code == 0, out
    data = json.loads(out)
    assert data["daemon"]["pid"] == os.getpid()
    assert [p["node"] for p in data["pool"]] == ["node1", "node3"]
    (t,) = data["trainers"]
    assert t["id"] == tid and t["state"] == "running"
    assert t["nodes"] == ["node1", "node2"]
    assert (t["samples_done"], t["throughput_sps"], t["batch_size"]) == (640, 12.5, 64)
    code, out = run("status", "--state-dir", str(state_dir))
    assert code == 0 and tid in out and "640" in out


# Each trainer's keys in `status --json`, as the first release wrote them (a contract:
# docs/deployment.md; the record inside says n_min, n_max, submit_s).
STATUS_TRAINER_KEYS = {
    "id", "state", "nodes", "slots", "samples_done", "work_samples", "throughput_sps",
    "goodput_sps", "batch_size", "backend", "min_nodes", "max_nodes", "script", "args",
    "submitted_s", "started_s", "finished_s", "reason", "restarts", "curve",
}  # fmt: skip


def test_status_json_keeps_its_names_over_the_trainer_record(state_dir: Path) -> None:
    before_s = time.time()
    _, out = submit(state_dir, "--min-nodes", "2", "--max-nodes", "3", "--backend", "torchrun")
    own_stop = out.strip().splitlines()[-1]
    _, out = submit(state_dir, "--work-samples", "500", "--backend", "torchrun")
    fixed = out.strip().splitlines()[-1]
    code, out = run("status", "--json", "--state-dir", str(state_dir))
    assert code == 0, out
    trainers = {t["id"]: t for t in json.loads(out)["trainers"]}
    assert all(set(t) == STATUS_TRAINER_KEYS for t in trainers.values())
    a, b = trainers[own_stop], trainers[fixed]
    assert (a["min_nodes"], a["max_nodes"], a["work_samples"]) == (2, 3, None)
    assert (b["min_nodes"], b["max_nodes"], b["work_samples"]) == (1, 1, 500)
    assert before_s <= a["submitted_s"] <= b["submitted_s"] <= time.time()


def test_cancel_flags_the_trainer_and_reports_finished_ones(state_dir: Path) -> None:
    _, out = submit(state_dir, "--backend", "torchrun")
    tid = out.strip().splitlines()[-1]
    code, out = run("cancel", tid, "--state-dir", str(state_dir))
    assert code == 0 and "cancel requested" in out
    with Store.open(state_dir) as store:
        assert store.trainer(tid).cancel_requested
        store.set_trainer_state(tid, "cancelled")
    code, out = run("cancel", tid, "--state-dir", str(state_dir))
    assert code == 0 and "already ended: cancelled" in out
    code, out = run("cancel", "t9999", "--state-dir", str(state_dir))
    assert code == 1 and "t9999" in out


def test_logs_prints_the_trainer_log(state_dir: Path, tmp_path: Path) -> None:
    _, out = submit(state_dir, "--backend", "torchrun")
    tid = out.strip().splitlines()[-1]
    code, out = run("logs", tid, "--state-dir", str(state_dir))
    assert code == 1 and "has not started yet" in out
    trainer_dir = tmp_path / "t"
    trainer_dir.mkdir()
    (trainer_dir / "supervisor.log").write_text("Traceback (most recent call last):\nboom\n")
    with Store.open(state_dir) as store:
        store.set_launch(tid, trainer_dir=trainer_dir, supervisor="1")
        store.set_trainer_state(tid, "failed", reason="boom")
    code, out = run("logs", tid, "-f", "--state-dir", str(state_dir))
    assert code == 0
    assert "boom" in out


def test_status_shows_each_trainers_slots_of_a_shared_node(state_dir: Path) -> None:
    ids = []
    for _ in range(2):
        _, out = submit(state_dir, "--backend", "torchrun", "--max-nodes", "2")
        ids.append(out.strip().splitlines()[-1])
    a, b = ids
    with Store.open(state_dir) as store:
        store.set_setting("slots_per_node", 2)
        for tid in ids:
            store.set_trainer_state(tid, "running")
        store.record_allocation(a, ["node1", "node2"], slots={"node1": [1], "node2": [0]})
        store.record_allocation(b, ["node1"], slots={"node1": [0]})
        store.set_setting(
            "pool",
            {
                "time_s": 1.0,
                "stale": False,
                "nodes": {
                    "node1": {
                        "window_s": None,
                        "holder": "7",
                        "holder_state": "running",
                        "trainer": f"{a},{b}",
                        "slots": {a: [1], b: [0]},
                    },
                },
            },
        )
    code, out = run("status", "--json", "--state-dir", str(state_dir))
    assert code == 0, out
    data = json.loads(out)
    assert data["slots_per_node"] == 2
    slots = {t["id"]: t["slots"] for t in data["trainers"]}
    assert slots == {a: {"node1": [1], "node2": [0]}, b: {"node1": [0]}}
    assert data["pool"][0]["slots"] == {a: [1], b: [0]}
    code, out = run("status", "--state-dir", str(state_dir))
    assert code == 0
    assert "slots per node: 2" in out
    assert f"node1\twindow open\trunning\t{a}[1] {b}[0]" in out
    row_a = next(line for line in out.splitlines() if line.startswith(f"{a}\t"))
    assert row_a.split("\t")[2:4] == ["2", "node1:1 node2:0"]
