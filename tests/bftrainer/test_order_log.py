"""A step's orders are one kept record (bftrainer/daemon/order_log.py): written in the
step's transaction, marked done once carried out, and done by the next start when a
daemon was killed between its commit and its actions.

No scheduler runs here: the real ``SlurmHolders`` read recorded replies (squeue lines
as captured on the local Slurm 22.05.8, an empty scancel), as in test_daemon_cancel.py.
A kill is the step's actions never running after its commit.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bftrainer.daemon import Daemon, DaemonConfig
from bftrainer.daemon.actuator import OrdersDone
from bftrainer.daemon.hold_orders import Acquire, EndHolders
from bftrainer.daemon.live_orders import EndLeftovers, StartAgain, Stop
from bftrainer.daemon.order_log import OrderRecordError, decode, encode
from bftrainer.holders import SlurmHolders
from bftrainer.holders.base import HolderStatus
from bftrainer.idle_monitor.runner import ReplayRunner, recorded
from bftrainer.idle_monitor.source import PoolView
from bftrainer.loop import NodeChange, Orders
from bftrainer.state import MIGRATIONS, Store, ensure_state_dir
from bftrainer.trainers.launch import remote
from bftrainer.trainers.launch.base import SUPERVISOR_MODULE, Launcher

PARTITION_BF = "PartitionName=bf AllowGroups=ALL Default=NO MaxTime=UNLIMITED State=UP\n"
BOTH_RUN = "11|RUNNING|node1|node1|N/A|None|\n12|RUNNING|node2|node2|N/A|None|\n"
RELEASE_12 = EndHolders(("12",), "no trainer needs it", "release", 200.0, ("node2",))


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return ensure_state_dir(tmp_path / "state")


@pytest.fixture
def store(state_dir: Path) -> Iterator[Store]:
    with Store.open(state_dir) as opened:
        for job, node in (("11", "node1"), ("12", "node2")):
            opened.add_holder(job, node, now_s=100.0)
            opened.set_holder_state(job, "running", now_s=101.0)
        yield opened


def daemon(store: Store, state_dir: Path, squeue: str = BOTH_RUN) -> tuple[Daemon, ReplayRunner]:
    runner = ReplayRunner(
        {
            "scontrol": [recorded(PARTITION_BF)],
            "squeue": [recorded(squeue)],
            "scancel": [recorded()],
        }
    )
    # The pool source is not read by what these tests drive.
    made = Daemon(store, state_dir, None, SlurmHolders(runner), DaemonConfig())  # type: ignore[arg-type]
    return made, runner


def scancels(runner: ReplayRunner) -> list[tuple[str, ...]]:
    return [argv for argv, _ in runner.calls if argv[0] == "scancel"]


def killed_after_commit(made: Daemon, orders: Orders) -> None:
    """A step that commits ``orders`` and dies before it acts on them."""
    with made.store.transaction():
        made.actuator.record(orders)


# ---- the record ------------------------------------------------------------------------
def test_every_kind_of_order_reads_back_as_it_was_kept(tmp_path: Path) -> None:
    view = PoolView(
        1.0,
        frozenset({"a", "b", "c"}),
        {"a": None, "b": 30.0, "c": math.inf},
        False,
        0.0,
        False,
        claims_s={"a": 5.0, "b": 9.0},
        gpus={"a": 4},
        gpu_errors={"b": "gpu:x"},
    )
    stray = HolderStatus("b", "running", "Suspended", "S", lingering=True)
    orders = Orders(
        2.0,
        (NodeChange("t1", ("a", "c"), "decide", 1), NodeChange("t2", (), "cancel", 2)),
        {"t1": ("a", "c")},
        hold=(
            Acquire(("a", "c"), view, 3.0),
            EndHolders(("7",), "lingering", "stray", None, ("b",), (("7", stray),)),
        ),
        driver=(
            EndLeftovers(Launcher(tmp_path / "t3", 4242)),
            StartAgain("t1", ("a",)),
            Stop("t2", Launcher(tmp_path / "t2", 4343)),
        ),
    )
    back = decode(encode(orders))
    assert (back.time_s, back.changes, back.decided, back.exec_plan) == (
        2.0,
        orders.changes,
        {"t1": ("a", "c")},
        None,
    )
    acquire, end = back.hold  # type: ignore[misc]
    # The view of an Acquire is kept on its own nodes: all that submitting them reads.
    assert acquire.view.pool == {"a", "c"} and acquire.view.windows_s == {"a": None, "c": math.inf}
    assert (acquire.view.claims_s, acquire.view.gpus, acquire.view.gpu_errors) == (
        {"a": 5.0},
        {"a": 4},
        {},
    )
    assert end == orders.hold[1]  # type: ignore[index]
    leftovers, again, stop = back.driver
    assert (leftovers.launcher.trainer_dir, leftovers.launcher.pid) == (tmp_path / "t3", 4242)
    assert again == StartAgain("t1", ("a",))
    assert (stop.trainer_id, stop.launcher.pid) == ("t2", 4343)


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ('{"@":"Orders","time_s":1', "not JSON"),
        ('{"@":"Script","time_s":1.0}', "unknown kind 'Script'"),
        ('{"@":"Orders","time_s":1.0,"extra":1}', "Orders order that does not read"),
        ('{"@":"NodeChange","trainer_id":"t1","nodes":[],"why":"decide"}', "not a step's orders"),
        ('{"@":"Orders","time_s":{"@float":"soon"}}', "does not read"),
    ],
)
def test_a_record_that_does_not_read_is_named(record: str, says: str) -> None:
    with pytest.raises(OrderRecordError, match=says):
        decode(record)


# ---- kept, then done ---------------------------------------------------------------------
def test_a_step_keeps_its_orders_and_marks_them_done_once_carried_out(
    store: Store, state_dir: Path
) -> None:
    made, runner = daemon(store, state_dir)
    nothing = Orders(200.0)  # a step that ordered nothing keeps no record
    with store.transaction():
        made.actuator.record(nothing)
    assert store.orders(undone_only=False) == []
    assert made.actuator.act(nothing) == []
    orders = Orders(200.0, hold=(RELEASE_12,))
    killed_after_commit(made, orders)
    assert [decode(r.record) for r in store.orders()] == [orders]
    learnt = made.actuator.act(orders)
    assert scancels(runner) == [("scancel", "12")]
    assert any(isinstance(fact, OrdersDone) for fact in learnt)
    with store.transaction():  # the next step's start
        made.actuator.learn(learnt)
    assert store.orders() == []
    assert store.holder("12").state == "ended"
    kept = store.orders(undone_only=False)
    assert len(kept) == 1 and kept[0].done_s is not None  # kept, for a person reading


def test_only_the_last_steps_orders_are_kept(store: Store) -> None:
    for k in range(5):
        store.add_orders(encode(Orders(float(k), hold=(RELEASE_12,))), now_s=float(k))
        store.orders_done(now_s=float(k), keep=3)
    assert [r.time_s for r in store.orders(undone_only=False)] == [2.0, 3.0, 4.0]


# ---- killed between the commit and the actions -------------------------------------------
def test_a_restart_ends_the_holders_a_killed_step_released(store: Store, state_dir: Path) -> None:
    """A step released node2 (its node left the loop's pool in that step) and was
    killed before its cancel ran: the next start cancels the holder, through the one
    cancel path, before it restores the pool; a second start does nothing more."""
    first, _ = daemon(store, state_dir)
    killed_after_commit(first, Orders(200.0, hold=(RELEASE_12,)))
    restarted, runner = daemon(store, state_dir)
    state = restarted.restore()
    assert state is not None and state.pool == ("node1",)
    assert scancels(runner) == [("scancel", "12")]
    row = store.holder("12")
    assert (row.state, row.reason) == ("ended", "no trainer needs it")
    assert restarted.pool.counts.released == 1
    assert store.orders() == []
    again, runner = daemon(store, state_dir, squeue="11|RUNNING|node1|node1|N/A|None|\n")
    again.restore()
    assert scancels(runner) == []


def test_a_restart_does_not_end_a_holder_the_scheduler_ended_meanwhile(
    store: Store, state_dir: Path
) -> None:
    first, _ = daemon(store, state_dir)
    killed_after_commit(first, Orders(200.0, hold=(RELEASE_12,)))
    restarted, runner = daemon(store, state_dir, squeue="11|RUNNING|node1|node1|N/A|None|\n")
    restarted.restore()
    assert scancels(runner) == []
    assert store.holder("12").state == "ended" and store.orders() == []


def test_a_record_that_does_not_read_is_named_once_and_skipped(
    store: Store, state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store.add_orders('{"@":"Orders"', now_s=200.0)  # cut off
    restarted, runner = daemon(store, state_dir)
    with caplog.at_level(logging.ERROR):
        assert restarted.restore() is not None
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "orders of step 1 do not read, skipped: not JSON" in errors[0]
    assert scancels(runner) == [] and store.orders() == []


def _sleeper(trainer_dir: Path, *argv: str) -> subprocess.Popen[bytes]:
    """A process that counts as ``trainer_dir``'s (its environment names it)."""
    env = {**os.environ, "BFTRAINER_TRAINER_DIR": str(trainer_dir.resolve())}
    code = "import time; time.sleep(120)"
    return subprocess.Popen([sys.executable, "-c", code, *argv], env=env)


@pytest.mark.parametrize("started_again", [False, True])
def test_a_restart_ends_a_dead_supervisors_leftovers_unless_one_runs_there_again(
    store: Store, state_dir: Path, tmp_path: Path, started_again: bool
) -> None:
    """The killed step ordered a dead supervisor's workers ended. If a supervisor runs
    in that directory again, that step got as far as its start, which comes after the
    leftovers' end: nothing is ended."""
    trainer_dir = tmp_path / "t0001"
    trainer_dir.mkdir()
    argv = (SUPERVISOR_MODULE, str(trainer_dir.resolve())) if started_again else ()
    proc = _sleeper(trainer_dir, *argv)
    try:
        if started_again:
            (trainer_dir / "supervisor.pid").write_text(f"{proc.pid}\n")
            assert Launcher.running_in(trainer_dir) is not None
        dead = Launcher(trainer_dir, 2**22 + 1)  # above pid_max's default: no process
        first, _ = daemon(store, state_dir)
        killed_after_commit(first, Orders(200.0, driver=(EndLeftovers(dead),)))
        daemon(store, state_dir)[0].restore()
        if started_again:
            assert proc.poll() is None and remote.alive(proc.pid)
        else:
            assert proc.wait(timeout=10) == -9
        assert store.orders() == []
    finally:
        proc.kill()
        proc.wait()


def test_a_store_of_the_release_before_opens_with_an_empty_order_log(state_dir: Path) -> None:
    conn = sqlite3.connect(state_dir / "state.db")
    for script in MIGRATIONS[:7]:
        conn.executescript(script)
    conn.execute("INSERT INTO settings (key, value) VALUES ('poll', '10')")
    conn.execute("PRAGMA user_version = 7")
    conn.commit()
    conn.close()
    with Store.open(state_dir) as opened:
        assert opened.orders(undone_only=False) == [] and opened.get_setting("poll") == 10
        step = opened.add_orders(encode(Orders(1.0, hold=(RELEASE_12,))), now_s=1.0)
        assert [r.step for r in opened.orders()] == [step]
