"""Issue 42, part B: records of another shape, stale pids, the daemon's store at start,
bounded hostlists, folders that are not ours, FIFOs, one-line scheduler errors."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bftrainer.common.names import NotRegularFileError, read_bytes
from bftrainer.daemon.slot_book import SlotBook, SlotError
from bftrainer.holders.slurm import parse_squeue_holders
from bftrainer.idle_monitor.slurm import (
    HostlistError,
    OutputParseError,
    expand_hostlist,
    parse_reservations,
    parse_running,
    parse_squeue_start,
)
from bftrainer.state import DB_NAME, SCHEMA_VERSION, StateBusyError, Store, ensure_state_dir
from bftrainer.trainers.channel import ChannelError, parse_hosts, read_exit, read_hosts
from bftrainer.trainers.launch.base import LaunchSpec
from bftrainer.trainers.launch.own_files import is_trainer_dir, remove_own_files
from tests.conftest import bftrainer, one_error

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


# ---------------------------------------------------------------------- status


FAILING = {"cause": "sbatch: error", "job_id": "17", "nodes": ["n1"], "failures": 1}


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("pool", {"time_s": 1.0, "nodes": {"n1": {"window_s": "soon"}}}, "window_s"),
        ("pool", {"time_s": 1.0, "nodes": {}, "holders_failing": FAILING}, "next_try_s"),
        ("pool", {"time_s": "noon", "nodes": {}}, "time_s"),
        ("pool", [1, 2], "'pool'"),
        ("slots_per_node", "two", "slots_per_node"),
        ("slots_from", 3, "slots_from"),
    ],
)
def test_status_names_a_setting_of_another_shape_in_one_line(
    tmp_path: Path, key: str, value: object, named: str
) -> None:
    state = ensure_state_dir(tmp_path / "state")
    with Store.open(state) as store:
        store.submit(EXAMPLE, ["--work-samples", "10"])
        store.set_setting(key, value)
    for flags in ((), ("--json",)):
        line = one_error(bftrainer("status", "--state-dir", str(state), *flags))
        assert f"setting '{key}'" in line and named in line, line


def test_status_takes_a_recycled_supervisor_pid_for_no_supervisor(tmp_path: Path) -> None:
    state = ensure_state_dir(tmp_path / "state")
    trainer_dir = state / "trainers" / "t0001"
    trainer_dir.mkdir(parents=True)
    # pid 1 is alive, but it is not this trainer's supervisor.
    (trainer_dir / "supervisor.pid").write_text("1\n")
    with Store.open(state) as store:
        tid = store.submit(EXAMPLE, ["--work-samples", "10"])
        store.set_launch(tid, trainer_dir=trainer_dir, supervisor="1")
        store.set_trainer_state(tid, "running")
    done = bftrainer("status", "--json", "--state-dir", str(state))
    assert done.returncode == 0, done.stderr
    (trainer,) = json.loads(done.stdout)["trainers"]
    assert trainer["state"] == "exited", trainer
    assert "supervisor is gone" in trainer["reason"]


def test_status_imports_no_numpy() -> None:
    """status runs often: trainers.channel (read by status) must not pull numpy in."""
    code = "import sys; from bftrainer.cli.status import status_cmd; print('numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


# ---------------------------------------------------------------------- the daemon's store


def daemon(state: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """A daemon that ends at start (its store or a flag refused): nothing to stop."""
    return bftrainer(
        "daemon", "--scheduler", "slurm", "--bf-partition", "bf", "--state-dir", str(state),
        *flags,
    )  # fmt: skip


def not_a_database(db: Path) -> None:
    db.write_bytes(b"hello, this is not SQLite\n" * 10)


def newer_schema(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()


def table_dropped(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE holders")
    conn.close()


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (not_a_database, "not a usable bftrainer state database"),
        (newer_schema, f"schema version {SCHEMA_VERSION + 1}, newer"),
        (table_dropped, "no table 'holders'"),
    ],
    ids=["not-sqlite", "newer", "no-table"],
)
def test_the_daemon_checks_its_store_at_start_in_one_line(
    tmp_path: Path, damage: Callable[[Path], None], named: str
) -> None:
    state = ensure_state_dir(tmp_path / "state")
    with Store.open(state):
        pass
    for suffix in ("-wal", "-shm"):
        (state / (DB_NAME + suffix)).unlink(missing_ok=True)
    damage(state / DB_NAME)
    line = one_error(daemon(state))
    assert named in line and str(state) in line, line


@pytest.mark.parametrize("name", ["", "two\nlines", "a,b"])
def test_a_bad_job_name_is_refused_before_the_store_is_made(tmp_path: Path, name: str) -> None:
    state = tmp_path / "state"
    line = one_error(daemon(state, "--job-name", name))
    assert "--job-name" in line and "holder job name" in line, line
    assert not state.exists()


def test_a_write_lock_held_past_the_busy_timeout_is_waited_for_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = ensure_state_dir(tmp_path / "state")
    with Store.open(state):
        pass
    other = sqlite3.connect(state / DB_NAME, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process's long write
    release = threading.Timer(1.5, other.execute, ("COMMIT",))
    with Store.open(state, busy_timeout_s=0.1) as impatient, pytest.raises(StateBusyError):
        impatient.set_setting("x", 1)
    release.start()
    with Store.open(state, busy_timeout_s=0.1, wait_for_writers=True) as daemons:
        with caplog.at_level(logging.INFO, logger="bftrainer.state.database"):
            daemons.set_setting("x", 2)
        assert daemons.get_setting("x") == 2
    release.join()
    other.close()
    said = [r.getMessage() for r in caplog.records if "write lock" in r.getMessage()]
    assert len(said) == 2, said  # waiting (once), then going on
    assert "waiting" in said[0] and "free again" in said[1]


# ---------------------------------------------------------------------- run --fresh


def run_cmd(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bftrainer", "run", "--backend", "torchrun"]
    argv += ["--hosts-file", "hosts", *args]
    return subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize(
    "spec",
    [
        '{"name": "my experiment", "lr": 0.1}\n',  # a spec.json of another kind
        # A launch spec, but written for another folder (a copy of a trainer directory).
        json.dumps({"trainer_id": "x", "script": "/x.py", "args": [], "backend": "torchrun",
                    "trainer_dir": "/elsewhere"}),
    ],
    ids=["another-kind", "another-folder"],
)  # fmt: skip
def test_fresh_never_removes_a_folder_that_is_not_provably_a_trainer_dir(
    tmp_path: Path, spec: str
) -> None:
    (tmp_path / "hosts").write_text("localhost\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "spec.json").write_text(spec)
    (mine / "results.csv").write_text("a,b\n1,2\n")
    done = run_cmd(tmp_path, "--trainer-dir", "mine", "--fresh", str(EXAMPLE))
    line = one_error(done)
    assert "mine" in line and "nothing was removed" in line, line
    assert sorted(p.name for p in mine.iterdir()) == ["results.csv", "spec.json"]
    assert (mine / "spec.json").read_text() == spec


def test_fresh_removes_only_what_bftrainer_wrote(tmp_path: Path) -> None:
    d = tmp_path / "td"
    d.mkdir()
    spec = LaunchSpec("t1", EXAMPLE, ("--work-samples", "64"), d.resolve(), "torchrun")
    (d / "spec.json").write_text(spec.to_json())
    for name in ("hosts", "metrics.jsonl", "checkpoint.pt", "supervisor.log", "exit.json"):
        (d / name).write_text("x")
    (d / ".checkpoint.pt.abc123.tmp").write_text("x")
    run = d / "torchrun" / "t1-0_k3j9x2ab" / "attempt_0" / "0"  # torchrun's --log-dir
    run.mkdir(parents=True)
    (run / "error.json").write_text("x")
    (d / "notes.txt").write_text("mine")
    (d / "data").mkdir()
    assert is_trainer_dir(d)
    assert remove_own_files(d) == ["data", "notes.txt"]
    assert sorted(p.name for p in d.iterdir()) == ["data", "notes.txt"]  # torchrun/ too


# ---------------------------------------------------------------------- hostlists


HUGE = "n[1-1000000][1-1000000]"


def test_a_hostlist_is_counted_before_it_is_expanded() -> None:
    assert expand_hostlist("n[1-3][1-3]", max_names=9)[-1] == "n33"
    with pytest.raises(HostlistError, match="more than 8 nodes"):
        expand_hostlist("n[1-3][1-3]", max_names=8)
    with pytest.raises(HostlistError, match="more than 1,000,000 nodes"):
        expand_hostlist(HUGE)
    with pytest.raises(HostlistError, match="more than"):
        expand_hostlist("a[1-600000],b[1-600000]")  # counted over the whole list
    with pytest.raises(HostlistError, match="too long"):
        expand_hostlist("n[" + "9" * 5000 + "]")


def test_every_scheduler_reader_refuses_a_huge_hostlist_in_one_error() -> None:
    with pytest.raises(OutputParseError, match="more than"):
        parse_running(f"bf|{HUGE}\n", ["bf"])
    with pytest.raises(OutputParseError, match="more than"):
        parse_squeue_start(f"12|batch|10000000000|1700000000|{HUGE}|Priority\n")
    with pytest.raises(OutputParseError, match="more than"):
        parse_reservations(f"ReservationName=r StartTime=1700000000 Nodes={HUGE}\n")
    line = f"7|RUNNING|{HUGE}|{HUGE}|N/A|None|\n"
    with pytest.raises(ValueError, match="more than"):
        parse_squeue_holders(line)


def test_run_in_a_slurm_allocation_of_a_huge_nodelist_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("n1\n")
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": HUGE}
    done = run_cmd(tmp_path, "--exec-mode", "slurm", str(EXAMPLE), env=env)
    line = one_error(done)
    assert "SLURM_JOB_NODELIST" in line and "more than" in line, line


# ---------------------------------------------------------------------- FIFOs, duplicates


def test_logs_refuses_a_supervisor_log_that_became_a_fifo(tmp_path: Path) -> None:
    state = ensure_state_dir(tmp_path / "state")
    trainer_dir = tmp_path / "t"
    trainer_dir.mkdir()
    os.mkfifo(trainer_dir / "supervisor.log")
    with Store.open(state) as store:
        tid = store.submit(EXAMPLE, ["--work-samples", "10"])
        store.set_launch(tid, trainer_dir=trainer_dir, supervisor="1")
        store.set_trainer_state(tid, "running")
    for follow in ((), ("-f",)):
        done = bftrainer("logs", tid, *follow, "--state-dir", str(state), timeout=30)
        line = one_error(done)
        assert "supervisor.log is a FIFO, not a regular file" in line, line


def test_run_refuses_a_hosts_file_that_is_a_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "hosts")
    line = one_error(run_cmd(tmp_path, str(EXAMPLE)))
    assert "hosts is a FIFO, not a regular file" in line, line


def test_reading_never_blocks_on_a_fifo_swapped_in(tmp_path: Path) -> None:
    fifo = tmp_path / "hosts"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError, match="a FIFO"):
        read_bytes(fifo)  # before: open() blocked for ever (no writer)
    with pytest.raises(NotRegularFileError, match="a folder"):
        read_bytes(tmp_path)
    # What a supervisor reads of its trainer directory: a line, it keeps its hosts.
    with pytest.raises(ChannelError, match="hosts is a FIFO"):
        read_hosts(tmp_path)
    os.mkfifo(tmp_path / "exit.json")
    with pytest.raises(ChannelError, match=r"exit\.json is a FIFO"):
        read_exit(tmp_path)


def test_a_host_listed_twice_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("localhost\n127.0.0.1\nlocalhost\n")
    line = one_error(run_cmd(tmp_path, str(EXAMPLE), "--work-samples", "64"))
    assert "'localhost' is listed twice (first at line 1)" in line, line
    assert not (tmp_path / "bftrainer-run-train_mlp").exists()  # nothing started
    with pytest.raises(ChannelError, match="listed twice"):
        parse_hosts("a:2\nb\na:1\n")


# ---------------------------------------------------------------------- scancel fails


def test_a_failed_scancel_names_the_trainers_processes_still_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from bftrainer.daemon import HeldPool
    from bftrainer.daemon.left_running import say_left_running
    from bftrainer.holders import SlurmHolders
    from bftrainer.idle_monitor.runner import CommandTimeoutError, ReplayRunner
    from bftrainer.trainers.launch.base import Launcher

    with Store.open(ensure_state_dir(tmp_path / "state")) as store:
        tid = store.submit(EXAMPLE, ["--work-samples", "10"])
        for job, node in (("11", "node1"), ("12", "node2")):
            store.add_holder(job, node, now_s=100.0)
            store.set_holder_state(job, "running", now_s=101.0)
        store.record_allocation(tid, ["node1"])
        runner = ReplayRunner({"scancel": [CommandTimeoutError(["scancel"], "replay", 20)]})
        pool = HeldPool(None, SlurmHolders(runner), store, 10.0)  # type: ignore[arg-type]
        with caplog.at_level(logging.INFO, logger="bftrainer"):
            assert not pool.cancel(["11", "12"], "released at exit")
            say_left_running(store, {tid: Launcher(tmp_path / "td", 4242)})
    text = caplog.text
    assert f"still holding: 11 (node1: {tid}'s processes run there), 12 (node2)" in text
    assert "by hand: scancel 11 12" in text
    assert f"left running: trainer {tid}, supervisor pid 4242" in text
    assert "holder job(s): 11 on node1" in text


# ---------------------------------------------------------------------- sbatch's config

CONFIGLESS = """#!/bin/sh
echo "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host" >&2
echo "sbatch: error: fetch_config: DNS SRV lookup failed" >&2
echo "sbatch: error: _establish_config_source: failed to fetch config" >&2
echo "sbatch: fatal: Could not establish a configuration source" >&2
exit 1
"""


def test_sbatch_without_its_configuration_is_one_line_naming_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    slurm_sweep = pytest.importorskip("bftrainer.replay.slurm_sweep")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(CONFIGLESS)
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    options = slurm_sweep.SlurmOptions(tmp_path / "sweep")
    with pytest.raises(slurm_sweep.SlurmSweepError) as caught:
        slurm_sweep.run_array(max, (1,), [2], options)
    message = str(caught.value)
    assert "\n" not in message
    assert "`sbatch " in message and "exited with status 1" in message, message
    assert message.endswith("sbatch: fatal: Could not establish a configuration source")
    assert "DNS SRV" not in message + capfd.readouterr().err  # not printed either


def test_the_slot_book_costs_what_is_asked_not_the_slot_count() -> None:
    """slots_per_node = 1e9 (refused in a config; here the mechanism): a trainer's slots
    are found without a list of every slot, which was a MemoryError."""
    book = SlotBook(10**9)
    assert book.assign("a", ["n1", "n1", "n2"]) == {"n1": (0, 1), "n2": (0,)}
    assert book.assign("b", ["n1"]) == {"n1": (2,)}
    kept, lost = book.restore("c", ["n1", "n1"], {})
    assert kept == {"n1": (3, 4)} and lost == {}
    small = SlotBook(2)
    small.assign("a", ["n1"])
    with pytest.raises(SlotError, match="has 2 slot"):
        small.assign("b", ["n1", "n1"])


def test_an_attached_supervisor_is_alive_and_killed_only_by_identity(tmp_path: Path) -> None:
    """A supervisor.pid naming a pid another process has now: not alive, never signalled."""
    from bftrainer.trainers.launch.base import Launcher

    other = subprocess.Popen(["sleep", "60"])
    try:
        d = tmp_path / "td"
        d.mkdir()
        (d / "supervisor.pid").write_text(f"{other.pid}\n")
        launcher = Launcher.attach(d)
        assert not launcher.alive()
        assert Launcher.running_in(d) is None
        launcher.stop(grace_s=0.1)
        launcher.kill()
        assert other.poll() is None, "another process was signalled"
    finally:
        other.kill()
        other.wait()


def test_logs_follow_goes_on_when_a_daemon_starts_writing_the_store(tmp_path: Path) -> None:
    """The store was read as immutable (no daemon); one starts and writes: the follower
    looks again, and ends when the trainer does, as it would have."""
    state = ensure_state_dir(tmp_path / "state")
    trainer_dir = tmp_path / "t"
    trainer_dir.mkdir()
    (trainer_dir / "supervisor.log").write_text("first line\n")
    with Store.open(state) as store:
        tid = store.submit(EXAMPLE, ["--work-samples", "10"])
        store.set_launch(tid, trainer_dir=trainer_dir, supervisor="1")
        store.set_trainer_state(tid, "running")
    assert not (state / f"{DB_NAME}-wal").exists()  # read as immutable
    follow = subprocess.Popen(
        [sys.executable, "-m", "bftrainer", "logs", "-f", tid, "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A daemon's writes, each checkpointed into state.db at close, for 8 s: the
        # follower's looks (one a second) overlap some of them.
        until = time.monotonic() + 8
        while follow.poll() is None and time.monotonic() < until:
            with Store.open(state) as store:
                store.set_setting("pool", {"time_s": time.time(), "nodes": {}})
        assert follow.poll() is None, follow.communicate()
        with Store.open(state) as store:
            store.set_trainer_state(tid, "done")
        out, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    assert "first line" in out
