"""The durable store: crash safety, the daemon lock, permissions, schema checks,
transitions, and several processes writing at once (bftrainer/state/)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bftrainer import state
from bftrainer.state import (
    DaemonLock,
    DaemonRunningError,
    HolderConflictError,
    InvalidTrainerError,
    SchemaError,
    StateDirError,
    Store,
    TransitionError,
    UnknownTrainerError,
    daemon_running,
    resolve_state_dir,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def store(state_dir: Path) -> Iterator[Store]:
    s = Store.open(state_dir)
    yield s
    s.close()


def run_python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---------------------------------------------------------------------- the directory


def test_state_dir_resolution_order(tmp_path: Path) -> None:
    env = {"BFTRAINER_STATE_DIR": str(tmp_path / "env"), "XDG_STATE_HOME": str(tmp_path / "x")}
    assert resolve_state_dir(tmp_path / "opt", env) == tmp_path / "opt"
    assert resolve_state_dir(None, env) == tmp_path / "env"
    assert resolve_state_dir(None, {"XDG_STATE_HOME": str(tmp_path / "x")}) == (
        tmp_path / "x" / "bftrainer"
    )
    home = Path.home() / ".local" / "state" / "bftrainer"
    assert resolve_state_dir(None, {}) == home
    assert resolve_state_dir(None, {"XDG_STATE_HOME": "relative/x"}) == home


def test_state_dir_is_created_owner_only_with_an_owner_only_database(state_dir: Path) -> None:
    old = os.umask(0o022)
    try:
        Store.open(state_dir / "deep").close()
    finally:
        os.umask(old)
    d = state_dir / "deep"
    assert (d.stat().st_mode & 0o777) == 0o700
    assert ((d / "state.db").stat().st_mode & 0o777) == 0o600


def test_group_or_world_writable_state_dir_is_refused(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o700)
    state_dir.chmod(0o770)
    with pytest.raises(StateDirError, match=r"writable by group or others \(mode 770\)"):
        Store.open(state_dir)
    state_dir.chmod(0o757)
    with pytest.raises(StateDirError, match="chmod 700"):
        Store.open(state_dir)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
def test_state_dir_of_another_user_is_refused(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o700)
    os.chown(state_dir, 65534, 65534)
    with pytest.raises(StateDirError, match="belongs to uid 65534, not to you"):
        Store.open(state_dir)


def test_a_file_as_state_dir_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(StateDirError, match="not a directory"):
        state.check_state_dir(f)


# ---------------------------------------------------------------------- schema
@contextlib.contextmanager
def old_store(state_dir: Path, version: int) -> Iterator[sqlite3.Connection]:
    """A state directory as schema ``version`` left it: what is written in the block is
    committed, under that version, when it ends."""
    state_dir.mkdir(mode=0o700)
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        for script in state.MIGRATIONS[:version]:
            conn.executescript(script)
        yield conn
        conn.execute(f"PRAGMA user_version = {version}")
        conn.commit()
    finally:
        conn.close()


def test_wal_mode_and_schema_version(store: Store) -> None:
    assert store.schema_version == state.SCHEMA_VERSION
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_newer_schema_is_refused_and_left_untouched(state_dir: Path) -> None:
    Store.open(state_dir).close()
    conn = sqlite3.connect(state_dir / "state.db")
    conn.execute(f"PRAGMA user_version = {state.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaError, match="newer than this bftrainer understands"):
        Store.open(state_dir)
    conn = sqlite3.connect(state_dir / "state.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == state.SCHEMA_VERSION + 1
    conn.close()


def test_a_version_1_database_is_migrated_keeping_its_rows(state_dir: Path) -> None:
    """A state directory of the first release opens: holders gain a time limit
    (unknown for those recorded before), and nothing recorded is lost."""
    with old_store(state_dir, 1) as conn:
        conn.execute(
            "INSERT INTO holders (job_id, node, state, submitted_s, started_s)"
            " VALUES ('7', 'node1', 'running', 1.0, 2.0)"
        )
    with Store.open(state_dir) as store:
        assert store.schema_version == state.SCHEMA_VERSION
        old = store.holder("7")
        assert (old.node, old.state, old.started_s, old.limit_s) == ("node1", "running", 2.0, None)
        assert old.ends_by_s() is None
        new = store.add_holder("8", "node2", limit_s=180.0, now_s=3.0)
        store.set_holder_state("8", "running", now_s=5.0)
        assert store.holder("8").limit_s == 180.0 and new.limit_s == 180.0
        # Seen running at 5 s, polled every 2 s: it started at 3 s at the earliest.
        assert store.holder("8").ends_by_s(poll_interval_s=2.0) == 183.0


def test_a_version_3_database_keeps_its_allocations_and_records_slots(state_dir: Path) -> None:
    with old_store(state_dir, 3) as conn:
        conn.execute(
            "INSERT INTO trainers (id, script, args, backend, min_nodes, max_nodes, rescale_up_s,"
            " rescale_down_s, state, submitted_s) VALUES"
            " ('t1', 'x.py', '[]', 'torchrun', 1, 2, 1.0, 1.0, 'running', 0.0)"
        )
        conn.execute(
            "INSERT INTO allocations (trainer_id, time_s, nodes) VALUES ('t1', 1.0, '[\"n1\"]')"
        )
    with Store.open(state_dir) as store:
        assert store.current_allocations()["t1"].nodes == ("n1",)
        assert store.current_allocations()["t1"].slots == {}
        store.record_allocation("t1", ["n1", "n2", "n1"], slots={"n1": [1, 0], "n2": [1]})
        now = store.current_allocations()["t1"]
        assert now.nodes == ("n1", "n1", "n2")
        assert now.slots == {"n1": (1, 0), "n2": (1,)}
        assert [a.slots for a in store.allocation_history("t1")] == [{}, now.slots]


def test_a_version_4_database_keeps_its_trainers_unmarked(state_dir: Path) -> None:
    """Version 5 adds a search trial's promise (the rungs passed): trainers recorded
    before are read back with none, and can be marked."""
    with old_store(state_dir, 4) as conn:
        conn.execute(
            "INSERT INTO trainers (id, script, args, backend, min_nodes, max_nodes, rescale_up_s,"
            " rescale_down_s, state, submitted_s, restarts) VALUES"
            " ('t1', 'x.py', '[\"--trial\", \"s#0\"]', 'torchrun', 1, 2, 1.0, 1.0, 'running',"
            " 0.0, 1)"
        )
    with Store.open(state_dir) as store:
        old = store.trainer("t1")
        assert (old.args, old.state, old.restarts, old.rungs) == (
            ("--trial", "s#0"),
            "running",
            1,
            0,
        )
        assert store.set_rungs("t1", 1).rungs == 1


def test_a_version_4_database_reads_every_trainer_back_under_the_records_names(
    state_dir: Path,
) -> None:
    """A state written before issue 43 (columns min_nodes, max_nodes, submitted_s) opens:
    every trainer and holder reads back whole under the names the record has now, and
    the renamed columns still refuse what they refused."""
    with old_store(state_dir, 4) as conn:
        conn.executemany(
            "INSERT INTO trainers (id, script, args, backend, min_nodes, max_nodes, work_samples,"
            " rescale_up_s, rescale_down_s, state, submitted_s, started_s, samples_done, reason,"
            " restarts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                ("t0001", "a.py", '["--lr","0.1"]', "horovod", 2, 4, 500, 15.0, 5.0, "running",
                 100.0, 101.0, 40, "", 1),
                ("t0002", "b.py", "[]", "torchrun", 1, 1, None, 20.0, 20.0, "done",
                 200.0, 201.0, 9, "its own stop", 0),
            ],
        )  # fmt: skip
        conn.execute(
            "INSERT INTO holders (job_id, node, state, submitted_s, started_s, trainer_id, limit_s)"
            " VALUES ('7', 'node1', 'running', 99.0, 100.0, 't0001', 600.0)"
        )
    with Store.open(state_dir) as store:
        assert store.schema_version == state.SCHEMA_VERSION
        got = {
            t.id: (t.script, t.args, t.backend, t.n_min, t.n_max, t.work_samples, t.submit_s)
            for t in store.trainers()
        }
        assert got == {
            "t0001": ("a.py", ("--lr", "0.1"), "horovod", 2, 4, 500, 100.0),
            "t0002": ("b.py", (), "torchrun", 1, 1, math.inf, 200.0),
        }
        old = store.trainer("t0001")
        assert (old.state, old.started_s, old.samples_done, old.restarts) == (
            "running", 101.0, 40, 1
        )  # fmt: skip
        assert (store.trainer("t0002").state, store.trainer("t0002").reason) == (
            "done", "its own stop"
        )  # fmt: skip
        holder = store.holder("7")
        assert (holder.submit_s, holder.trainer_id, holder.limit_s) == (99.0, "t0001", 600.0)
        assert store.submit("c.py", n_min=3, n_max=5, now_s=300.0) == "t0003"
        assert (store.trainer("t0003").n_min, store.trainer("t0003").submit_s) == (3, 300.0)
    conn = sqlite3.connect(state_dir / "state.db")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        conn.execute(
            "INSERT INTO trainers (id, script, args, backend, n_min, n_max, rescale_up_s,"
            " rescale_down_s, state, submit_s) VALUES ('x', 'x.py', '[]', 'horovod', 3, 2,"
            " 0, 0, 'queued', 0)"
        )
    conn.close()


def test_not_a_database_is_refused(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o700)
    (state_dir / "state.db").write_bytes(b"this is not sqlite at all, just text\n" * 100)
    with pytest.raises(SchemaError, match="not a usable bftrainer state database"):
        Store.open(state_dir)


def test_foreign_database_is_refused(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o700)
    conn = sqlite3.connect(state_dir / "state.db")
    conn.execute("CREATE TABLE other (x)")
    conn.close()
    with pytest.raises(SchemaError, match="not a bftrainer state database"):
        Store.open(state_dir)


def test_reopening_keeps_data(state_dir: Path) -> None:
    with Store.open(state_dir) as s:
        tid = s.submit("train.py", ["--lr", "0.1"], n_min=2, n_max=4, work_samples=100)
        s.set_setting("policy", {"name": "milp"})
    with Store.open(state_dir) as s:
        row = s.trainer(tid)
        assert (row.args, row.n_min, row.n_max, row.work_samples) == (
            ("--lr", "0.1"),
            2,
            4,
            100,
        )
        assert s.get_setting("policy") == {"name": "milp"}


# ---------------------------------------------------------------------- trainers


def test_ids_are_short_unique_and_in_submission_order(store: Store) -> None:
    ids = [store.submit(f"t{i}.py") for i in range(12)]
    assert ids[0] == "t0001"
    assert ids == sorted(ids) and len(set(ids)) == 12
    assert [t.id for t in store.trainers()] == ids
    assert all(t.state == "queued" for t in store.trainers())


def test_submit_rejects_bad_fields(store: Store) -> None:
    with pytest.raises(InvalidTrainerError, match="n_max 1 is below n_min 2"):
        store.submit("a.py", n_min=2, n_max=1)
    with pytest.raises(InvalidTrainerError, match="n_min 0"):
        store.submit("a.py", n_min=0)
    with pytest.raises(InvalidTrainerError, match="backend 'mpi'"):
        store.submit("a.py", backend="mpi")
    with pytest.raises(InvalidTrainerError, match="work_samples -5"):
        store.submit("a.py", work_samples=-5)
    # Work until the trainer's own stop is math.inf in the record, as in every record.
    with pytest.raises(
        InvalidTrainerError, match=r"work_samples None: expected a number \(math.inf"
    ):
        store.submit("a.py", work_samples=None)  # type: ignore[arg-type]
    assert store.trainers() == []


def test_transitions_are_checked(store: Store) -> None:
    tid = store.submit("a.py", now_s=100.0)
    row = store.set_trainer_state(tid, "running", now_s=110.0)
    assert (row.state, row.started_s, row.finished_s) == ("running", 110.0, None)
    row = store.set_trainer_state(tid, "waiting", reason="no nodes", now_s=120.0)
    assert (row.state, row.started_s, row.reason) == ("waiting", 110.0, "no nodes")
    store.set_trainer_state(tid, "running", now_s=130.0)
    row = store.set_trainer_state(tid, "done", now_s=140.0)
    assert (row.finished_s, row.finished) == (140.0, True)
    with pytest.raises(TransitionError, match=f"trainer {tid} cannot go from done to running"):
        store.set_trainer_state(tid, "running")
    with pytest.raises(TransitionError):
        store.set_trainer_state(tid, "failed")
    assert store.trainer(tid).state == "done"
    with pytest.raises(ValueError, match="unknown trainer state 'finished'"):
        store.set_trainer_state(tid, "finished")
    with pytest.raises(UnknownTrainerError, match="no trainer 't9999'"):
        store.set_trainer_state("t9999", "running")


def test_cancel_flags_and_leaves_finished_trainers_alone(store: Store) -> None:
    a, b = store.submit("a.py"), store.submit("b.py")
    store.set_trainer_state(b, "failed", reason="crashed")
    assert store.request_cancel(a).cancel_requested
    assert store.trainer(a).state == "queued"  # the daemon acts on the flag
    assert not store.request_cancel(b).cancel_requested
    assert [t.id for t in store.trainers(["queued"])] == [a]


def test_progress_allocations_metrics_pool_events(store: Store) -> None:
    tid = store.submit("a.py", n_max=4)
    store.set_launch(tid, trainer_dir="/s/trainers/t0001", supervisor="4242")
    store.update_progress(tid, samples_done=500, throughput_sps=80.0, batch_size=64)
    row = store.update_progress(tid, samples_done=300, goodput_sps=70.0)  # older report
    assert (row.samples_done, row.throughput_sps, row.goodput_sps, row.batch_size) == (
        500,
        80.0,
        70.0,
        64,
    )
    assert (row.trainer_dir, row.supervisor) == ("/s/trainers/t0001", "4242")
    assert store.current_allocation(tid) == ()
    store.record_allocation(tid, ["node3", "node1"], now_s=1.0)
    store.record_allocation(tid, ["node2"], now_s=2.0)
    assert store.current_allocation(tid) == ("node2",)
    assert store.current_allocations()[tid].time_s == 2.0
    assert [a.nodes for a in store.allocation_history(tid)] == [("node1", "node3"), ("node2",)]
    m = store.add_metric(tid, {"throughput": 80.0}, now_s=5.0)
    assert store.metrics(tid) == [m]
    assert store.metrics(tid, after_id=m.id) == []
    e1 = store.add_pool_event(joined=["n2", "n1"], windows_s={"n1": 60.0, "n2": None})
    e2 = store.add_pool_event(left=["n1"], stale=True)
    assert store.pool_events() == [e1, e2]
    assert store.last_pool_event() == e2
    assert e1.joined == ("n1", "n2") and e1.windows_s == {"n1": 60.0, "n2": None}


def test_holders_one_live_per_node(store: Store) -> None:
    tid = store.submit("a.py")
    h = store.add_holder("101", "node1", now_s=1.0)
    assert (h.state, h.trainer_id, h.live) == ("pending", None, True)
    with pytest.raises(HolderConflictError, match="node1 already has live holder job 101"):
        store.add_holder("102", "node1")
    store.set_holder_state("101", "running", now_s=2.0)
    assert store.assign_holder("101", tid).trainer_id == tid
    ended = store.set_holder_state("101", "ended", reason="preempted", now_s=3.0)
    assert (ended.started_s, ended.ended_s, ended.reason) == (2.0, 3.0, "preempted")
    with pytest.raises(TransitionError, match="holder job 101 cannot go from ended to running"):
        store.set_holder_state("101", "running")
    for bad in (0.0, -60.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="time limit"):
            store.add_holder("103", "node2", limit_s=bad)
    store.add_holder("102", "node1")  # the node is free again
    assert [x.job_id for x in store.holders()] == ["102"]
    assert [x.job_id for x in store.holders(live_only=False)] == ["101", "102"]


def test_a_job_id_the_scheduler_gives_again_is_a_new_holder(store: Store) -> None:
    """Schedulers' job ids wrap (LSF's MAX_JOBID) or restart (a rebuilt Slurm): a new
    holder with an ended one's id is recorded beside it, the old one kept as it ended,
    and the id then names the new one. A live holder's id is still refused again."""
    tid = store.submit("a.py")
    store.add_holder("101", "node1", now_s=1.0)
    with pytest.raises(HolderConflictError, match="holder job 101 for node2"):
        store.add_holder("101", "node2", now_s=1.5)
    store.set_holder_state("101", "running", now_s=2.0)
    store.assign_holder("101", tid)
    store.set_holder_state("101", "ended", reason="preempted", now_s=3.0)
    again = store.add_holder("101", "node2", limit_s=60.0, now_s=4.0)
    assert (again.node, again.state, again.trainer_id) == ("node2", "pending", None)
    store.set_holder_state("101", "running", now_s=5.0)
    assert store.assign_holder("101", tid).node == "node2"
    every = store.holders(live_only=False)
    assert [(h.job_id, h.node, h.state, h.reason) for h in every] == [
        ("101", "node1", "ended", "preempted"),
        ("101", "node2", "running", ""),
    ]
    assert (every[0].started_s, every[0].ended_s, every[1].started_s) == (2.0, 3.0, 5.0)


def test_a_version_6_database_keeps_its_holders_in_order(state_dir: Path) -> None:
    with old_store(state_dir, 6) as conn:
        conn.executemany(
            "INSERT INTO holders (job_id, node, state, submit_s, started_s, ended_s, reason,"
            " limit_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                ("9", "node2", "running", 20.0, 21.0, None, "", None),
                ("10", "node1", "ended", 10.0, 11.0, 15.0, "was preempted by a main job", 600.0),
            ],
        )
    with Store.open(state_dir) as store:
        assert store.schema_version == state.SCHEMA_VERSION
        got = [
            (h.job_id, h.node, h.state, h.ended_s, h.limit_s)
            for h in store.holders(live_only=False)
        ]
        assert got == [("10", "node1", "ended", 15.0, 600.0), ("9", "node2", "running", None, None)]
        with pytest.raises(HolderConflictError, match="node2 already has live holder job 9"):
            store.add_holder("11", "node2")
        assert store.add_holder("10", "node1", now_s=30.0).state == "pending"


def test_a_failed_transaction_writes_nothing(store: Store) -> None:
    tid = store.submit("a.py")
    with pytest.raises(RuntimeError), store.transaction():
        store.record_allocation(tid, ["node1"])
        store.set_trainer_state(tid, "running")
        raise RuntimeError("the launcher failed")
    assert store.trainer(tid).state == "queued"
    assert store.current_allocation(tid) == ()


# ---------------------------------------------------------------------- the lock


def test_second_daemon_is_refused_and_status_sees_the_first(state_dir: Path) -> None:
    state.ensure_state_dir(state_dir)
    assert daemon_running(state_dir) is None
    holder = run_python(
        """
        import sys, time
        from pathlib import Path
        from bftrainer.state import DaemonLock
        lock = DaemonLock(Path(sys.argv[1])).acquire()
        print("locked", flush=True)
        time.sleep(60)
        """,
        str(state_dir),
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        assert daemon_running(state_dir) == holder.pid
        with pytest.raises(DaemonRunningError, match=f"pid {holder.pid}") as info:
            DaemonLock(state_dir).acquire()
        assert info.value.pid == holder.pid
    finally:
        holder.kill()  # SIGKILL: the kernel drops the lock
        holder.wait()
    assert daemon_running(state_dir) is None
    with DaemonLock(state_dir) as lock:
        assert lock.held
        assert daemon_running(state_dir) == os.getpid()
        with pytest.raises(DaemonRunningError):
            DaemonLock(state_dir).acquire()  # also within one process
    assert daemon_running(state_dir) is None


# ---------------------------------------------------------------------- crash safety


WRITER = """
import sys, time
from pathlib import Path
from bftrainer.state import Store
store = Store.open(Path(sys.argv[1]))
i = 0
while True:
    i += 1
    with store.transaction():
        tid = store.submit("w.py", [str(i)])
        store.record_allocation(tid, [f"node{i % 8}"])
        store.set_trainer_state(tid, "running")
        store.add_metric(tid, {"i": i, "pad": "x" * 2000})
    print(tid, flush=True)
"""


def test_sigkill_mid_write_loses_nothing_committed(state_dir: Path) -> None:
    Store.open(state_dir).close()
    writer = run_python(WRITER, str(state_dir))
    assert writer.stdout is not None
    committed: list[str] = []
    deadline = time.monotonic() + 30
    while len(committed) < 40 and time.monotonic() < deadline:
        line = writer.stdout.readline()
        if not line:
            break
        committed.append(line.strip())
    os.kill(writer.pid, signal.SIGKILL)  # the writer is in the middle of its next write
    committed += [line.strip() for line in writer.stdout]  # printed just before the kill
    writer.wait()
    assert len(committed) >= 40, writer.stderr.read() if writer.stderr else ""
    with Store.open(state_dir) as s:
        assert s._query("PRAGMA integrity_check")[0][0] == "ok"
        rows = {t.id: t for t in s.trainers()}
        for tid in committed:
            assert rows[tid].state == "running"
            assert s.current_allocation(tid)
            assert len(s.metrics(tid)) == 1
        # A transaction is all or nothing: no trainer without its allocation and metric.
        assert all(s.current_allocation(t) and s.metrics(t) for t in rows)
        assert len(rows) - len(committed) <= 1


# ---------------------------------------------------------------------- concurrency


SUBMITTER = """
import sys
from pathlib import Path
from bftrainer.state import Store
store = Store.open(Path(sys.argv[1]))
for i in range(int(sys.argv[2])):
    print(store.submit("s.py", [sys.argv[3], str(i)]), flush=True)
"""


def test_concurrent_submits_while_the_daemon_reads_and_writes(state_dir: Path) -> None:
    daemon = Store.open(state_dir)
    subs = [run_python(SUBMITTER, str(state_dir), "25", f"p{k}") for k in range(3)]
    seen: set[str] = set()
    # The daemon's loop: read everything, start what is queued, record what it did.
    while any(p.poll() is None for p in subs) or daemon.trainers(["queued"]):
        for t in daemon.trainers(["queued"]):
            with daemon.transaction():
                daemon.set_trainer_state(t.id, "running")
                daemon.record_allocation(t.id, ["node1"])
            seen.add(t.id)
        daemon.add_pool_event(joined=["node1"])
    outs = [p.communicate() for p in subs]
    assert all(p.returncode == 0 for p in subs), [err for _, err in outs]
    printed = [line for out, _ in outs for line in out.split()]
    assert len(printed) == 75 and len(set(printed)) == 75
    assert set(printed) == seen == {t.id for t in daemon.trainers(["running"])}
    # Each submitter's own trainers come out in the order it submitted them.
    for k in range(len(outs)):
        mine = [t for t in daemon.trainers() if t.args[0] == f"p{k}"]
        assert [t.args[1] for t in mine] == [str(i) for i in range(25)]
    daemon.close()


def test_status_does_not_create_a_state_dir(state_dir: Path) -> None:
    with pytest.raises(StateDirError, match="does not exist"):
        Store.open(state_dir, create=False)
    assert not state_dir.exists()
    state_dir.mkdir(mode=0o700)
    with pytest.raises(StateDirError, match="no bftrainer state in"):
        Store.open(state_dir, create=False)
    Store.open(state_dir).close()
    Store.open(state_dir, create=False).close()


def test_trainer_dir_is_under_the_state_dir(store: Store, state_dir: Path) -> None:
    tid = store.submit("a.py")
    d = state.trainer_dir(state_dir, tid)
    assert d == state_dir / "trainers" / tid and d.is_dir()
    assert (d.stat().st_mode & 0o777) == 0o700
    with pytest.raises(ValueError, match="bad trainer id"):
        state.trainer_dir(state_dir, "../etc")


def test_a_writer_holding_the_lock_too_long_is_a_clear_error(state_dir: Path) -> None:
    Store.open(state_dir).close()
    blocker = sqlite3.connect(state_dir / "state.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with Store.open(state_dir, busy_timeout_s=0.2) as s:
            with pytest.raises(state.StateBusyError, match="stayed locked by another process"):
                s.submit("a.py")
            assert s.trainers() == []  # readers are not blocked by the writer (WAL)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
