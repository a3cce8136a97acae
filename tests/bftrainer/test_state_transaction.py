"""One step, one transaction: the writes of a ``with store.transaction():`` block land in
one commit or not at all, whether the block raises or its process is killed
(bftrainer/state/database.py). Outside a block every write still commits on its own.

Commits are seen twice over, both from outside the store's own bookkeeping: SQLite's
trace of the statements the store's connection runs (each ``COMMIT``), and
``PRAGMA data_version`` read by a second connection, which changes whenever another
connection commits.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bftrainer.state import StateError, Store

REPO = Path(__file__).resolve().parents[2]
TABLES = ("trainers", "allocations", "holders", "pool_events", "metrics", "settings")
NOW_S = 1000.0
TID = "t0001"


def step_writes(store: Store, trainer_id: str) -> list[Callable[[], object]]:
    """The kinds of write a daemon step makes, one per store method, in a step's order: the
    pool change, a holder that started, the decision, the trainer's launch and state,
    its progress and a setting. Fixed times, so two stores that write it match."""
    return [
        lambda: store.add_pool_event(joined=["n1"], windows_s={"n1": None}, now_s=NOW_S),
        lambda: store.add_holder("j1", "n1", limit_s=600.0, now_s=NOW_S),
        lambda: store.set_holder_state("j1", "running", now_s=NOW_S),
        lambda: store.record_allocation(trainer_id, ["n1"], now_s=NOW_S),
        lambda: store.assign_holder("j1", trainer_id),
        lambda: store.set_trainer_state(trainer_id, "running", now_s=NOW_S),
        lambda: store.set_launch(trainer_id, trainer_dir="trainers/t0001", supervisor="4242"),
        lambda: store.update_progress(trainer_id, samples_done=64, batch_size=32),
        lambda: store.add_metric(trainer_id, {"samples": 64}, now_s=NOW_S),
        lambda: store.decide_restart(trainer_id),
        lambda: store.set_setting("slots_per_node", 1),
    ]


def write_step(store: Store, trainer_id: str) -> None:
    for write in step_writes(store, trainer_id):
        write()


def with_a_trainer(state_dir: Path) -> Path:
    """A new state with one trainer queued, ``TID``."""
    with Store.open(state_dir) as store:
        assert store.submit("train.py", ["--lr", "0.1"], n_max=2, now_s=NOW_S) == TID
    return state_dir


def on_disk(conn: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table, as a connection other than the writer's sees it."""
    return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in TABLES}


def reader(state_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(state_dir / "state.db", isolation_level=None)


def data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


@pytest.fixture
def step_done(tmp_path: Path) -> dict[str, list[tuple[object, ...]]]:
    """The tables after the step, written the plain way (each write its own commit)."""
    with Store.open(with_a_trainer(tmp_path / "reference")) as store:
        write_step(store, TID)
    conn = reader(tmp_path / "reference")
    try:
        return on_disk(conn)
    finally:
        conn.close()


def traced(store: Store) -> list[str]:
    """The statements the store's own connection runs from now on, as SQLite reports
    them (the store's COMMITs among them)."""
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    return statements


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """The state under test."""
    return with_a_trainer(tmp_path / "state")


@pytest.fixture
def watcher(state_dir: Path) -> Iterator[sqlite3.Connection]:
    """A second connection to the state under test, as another process would read it."""
    conn = reader(state_dir)
    yield conn
    conn.close()


def commits_in(statements: list[str]) -> list[str]:
    return [s for s in statements if s.strip().upper().startswith(("COMMIT", "END"))]


def test_outside_a_block_each_write_commits_on_its_own(
    state_dir: Path, watcher: sqlite3.Connection
) -> None:
    store, tid = Store.open(state_dir), TID
    statements = traced(store)
    writes = step_writes(store, tid)
    for n, write in enumerate(writes, 1):
        version = data_version(watcher)
        write()
        assert data_version(watcher) != version  # visible to others as soon as it returns
        assert len(commits_in(statements)) == n
    store.close()


def test_the_writes_of_one_block_land_in_exactly_one_commit(
    state_dir: Path,
    watcher: sqlite3.Connection,
    step_done: dict[str, list[tuple[object, ...]]],
) -> None:
    store, tid = Store.open(state_dir), TID
    before, version = on_disk(watcher), data_version(watcher)
    statements = traced(store)
    with store.transaction():
        for write in step_writes(store, tid):
            write()
            assert data_version(watcher) == version  # nothing committed yet
            assert on_disk(watcher) == before  # and nothing of it visible
    assert commits_in(statements) == ["COMMIT"]
    assert data_version(watcher) != version
    assert on_disk(watcher) == step_done
    store.close()


def test_an_exception_inside_the_block_leaves_none_of_its_writes(
    state_dir: Path, watcher: sqlite3.Connection, step_done: dict[str, list[tuple[object, ...]]]
) -> None:
    store, tid = Store.open(state_dir), TID
    before = on_disk(watcher)
    with pytest.raises(RuntimeError, match="the step fails"), store.transaction():
        write_step(store, tid)
        raise RuntimeError("the step fails after its writes")
    assert on_disk(watcher) == before
    # The store reads what is on disk, and the same step then goes through whole.
    assert store.trainer(tid).state == "queued"
    assert store.holders(live_only=False) == []
    write_step(store, tid)
    assert on_disk(watcher) == step_done
    store.close()


def test_an_inner_block_that_raises_is_undone_alone(state_dir: Path) -> None:
    """A caller may catch a failed part of a step and go on: that part leaves nothing,
    the rest of the step commits."""
    store, tid = Store.open(state_dir), TID
    with store.transaction():
        store.add_pool_event(joined=["n1"], now_s=NOW_S)
        with pytest.raises(RuntimeError), store.transaction():
            store.add_holder("j1", "n1", now_s=NOW_S)
            store.record_allocation(tid, ["n1"], now_s=NOW_S)
            raise RuntimeError("this holder is refused")
        store.add_holder("j2", "n1", now_s=NOW_S)  # the node is free again in the step
    with Store.open(state_dir) as other:
        assert [h.job_id for h in other.holders()] == ["j2"]
        assert other.allocation_history(tid) == []
        assert len(other.pool_events()) == 1
    store.close()


def test_a_transaction_sqlite_ended_by_itself_commits_nothing_later(
    state_dir: Path, watcher: sqlite3.Connection
) -> None:
    """An interrupted write makes SQLite roll back the whole transaction; a caller that
    catches the error and writes on must not commit those writes one by one."""
    store, tid = Store.open(state_dir), TID
    before = on_disk(watcher)
    with pytest.raises(StateError, match="rolled back this transaction"), store.transaction():
        store.add_pool_event(joined=["n1"], now_s=NOW_S)
        conn = store._conn

        def interrupt_the_insert(statement: str) -> None:
            if statement.startswith("INSERT INTO holders"):
                conn.interrupt()

        conn.set_trace_callback(interrupt_the_insert)
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            store.add_holder("j1", "n1", now_s=NOW_S)
        conn.set_trace_callback(None)
        with pytest.raises(StateError, match="rolled back this transaction"):
            store.record_allocation(tid, ["n1"], now_s=NOW_S)
    assert on_disk(watcher) == before
    store.close()


# A writer in its own process: it writes the step in one block, says so on stdout at the
# chosen point (inside the block, or after it), and waits on stdin until it is killed.
CHILD = """
import sys
from pathlib import Path
from bftrainer.state import Store
from tests.bftrainer.test_state_transaction import write_step
store = Store.open(Path(sys.argv[1]))
with store.transaction():
    write_step(store, sys.argv[2])
    if sys.argv[3] == "inside":
        print("inside", flush=True)
        sys.stdin.readline()
print("after", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("killed", ["inside", "after"])
def test_a_writer_killed_inside_its_block_leaves_nothing_and_after_it_all(
    state_dir: Path,
    watcher: sqlite3.Connection,
    killed: str,
    step_done: dict[str, list[tuple[object, ...]]],
) -> None:
    tid = TID
    before = on_disk(watcher)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(state_dir), tid, killed],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stderr is not None
    said = child.stdout.readline()  # the child has written the step, and waits
    if said != f"{killed}\n":
        child.kill()
        child.wait()
        pytest.fail(f"the writer said {said!r}: {child.stderr.read()}")
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    for pipe in (child.stdin, child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()
    if killed == "inside":
        assert on_disk(watcher) == before
        # The dead writer holds no lock: the next one writes the step whole.
        with Store.open(state_dir) as again:
            write_step(again, tid)
    assert on_disk(watcher) == step_done
    with Store.open(state_dir) as after:
        assert after._query("PRAGMA integrity_check")[0][0] == "ok"
