"""Holders end through one path (``HeldPool.cancel``): a plan's release, a requeued
holder, the daemon's exit and a holder the store refused are all cancelled with one
command, recorded ended with their reason and counted; a refused cancel is counted,
logged, and leaves the record as it was for a later poll.

No scheduler runs here: the real ``SlurmHolders`` read recorded replies (squeue lines as
captured on the local Slurm 22.05.8, an empty scancel, a scancel that times out).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from bftrainer.daemon import Daemon, DaemonConfig, HeldPool
from bftrainer.daemon.hold_orders import Ended, Submitted
from bftrainer.holders import SlurmHolders
from bftrainer.idle_monitor.runner import (
    CommandError,
    CommandResult,
    CommandTimeoutError,
    ReplayRunner,
    recorded,
)
from bftrainer.idle_monitor.source import PoolView
from bftrainer.loop import WAIT_FOR_HELD_S, Demand
from bftrainer.state import Store, ensure_state_dir

PARTITION_BF = "PartitionName=bf AllowGroups=ALL Default=NO MaxTime=UNLIMITED State=UP\n"
SCANCEL_TIMES_OUT = CommandTimeoutError(["scancel"], "replay", 20)
NO_DEMAND = Demand(0, frozenset())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(ensure_state_dir(tmp_path / "state")) as opened:
        for job, node in (("11", "node1"), ("12", "node2")):
            opened.add_holder(job, node, now_s=100.0)
            opened.set_holder_state(job, "running", now_s=101.0)
        yield opened


def held_pool(
    store: Store, **replies: Sequence[CommandResult | CommandError]
) -> tuple[HeldPool, ReplayRunner]:
    runner = ReplayRunner({"scontrol": [recorded(PARTITION_BF)], **replies})
    holders = SlurmHolders(runner)
    # The pool source is not read by what these tests drive.
    pool = HeldPool(None, holders, store, 10.0)  # type: ignore[arg-type]
    return pool, runner


def scancels(runner: ReplayRunner) -> list[tuple[str, ...]]:
    return [argv for argv, _ in runner.calls if argv[0] == "scancel"]


def test_a_cancel_is_one_command_then_each_holder_recorded_ended_and_counted(
    store: Store,
) -> None:
    pool, runner = held_pool(store, scancel=[recorded()])
    learnt: list[Submitted | Ended] = []  # a step's act: recorded at the next step
    assert pool.cancel(["11", "12"], "no trainer needs it", 200.0, learnt=learnt)
    assert scancels(runner) == [("scancel", "11", "12")]
    pool.learn(learnt)  # recorded at the pool's next record: the next step's start
    for job in ("11", "12"):
        row = store.holder(job)
        assert (row.state, row.reason, row.ended_s) == ("ended", "no trainer needs it", 200.0)
    assert (pool.counts.released, pool.counts.lost) == (2, 0)
    assert not pool.counts.errors


def test_a_refused_cancel_is_counted_and_leaves_the_record_for_a_later_poll(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    pool, _ = held_pool(store, scancel=[SCANCEL_TIMES_OUT])
    with caplog.at_level(logging.WARNING, logger="bftrainer"):
        assert not pool.cancel(["11"], "no trainer needs it", 200.0)
    assert store.holder("11").state == "running"
    assert pool.counts.errors["holder_cancel"] == 1
    assert pool.counts.released == 0
    assert "holders not released (no trainer needs it): cannot cancel holder(s) 11" in caplog.text


def test_a_requeued_holder_is_cancelled_recorded_and_counted_lost(store: Store) -> None:
    # 11 is running in the store but pending in the scheduler: requeued, not ours.
    squeue = "11|PENDING|node1||N/A|BeginTime|\n12|RUNNING|node2|node2|N/A|None|\n"
    pool, runner = held_pool(store, squeue=[recorded(squeue)], scancel=[recorded()])
    pool.sync_holders(300.0)
    assert scancels(runner) == [("scancel", "11")]
    row = store.holder("11")
    assert (row.state, row.reason, row.ended_s) == ("ended", "requeued", 300.0)
    assert store.holder("12").state == "running"
    assert (pool.counts.lost, pool.counts.released) == (1, 0)


def test_a_requeued_holder_whose_cancel_is_refused_is_tried_again_at_the_next_poll(
    store: Store,
) -> None:
    squeue = "11|PENDING|node1||N/A|BeginTime|\n12|RUNNING|node2|node2|N/A|None|\n"
    pool, runner = held_pool(
        store, squeue=[recorded(squeue)], scancel=[SCANCEL_TIMES_OUT, recorded()]
    )
    pool.sync_holders(300.0)
    assert store.holder("11").state == "running"
    assert pool.counts.errors["holder_cancel"] == 1
    pool.sync_holders(310.0)
    assert scancels(runner) == [("scancel", "11"), ("scancel", "11")]
    assert (store.holder("11").state, store.holder("11").reason) == ("ended", "requeued")
    assert pool.counts.lost == 1


def test_the_exit_releases_through_the_same_path_only_what_no_trainer_uses(
    store: Store, tmp_path: Path
) -> None:
    tid = store.submit("train.py", (), backend="torchrun", n_max=1)
    store.set_trainer_state(tid, "running")
    store.record_allocation(tid, ["node1"])
    runner = ReplayRunner({"scontrol": [recorded(PARTITION_BF)], "scancel": [recorded()]})
    daemon = Daemon(store, tmp_path / "state", None, SlurmHolders(runner), DaemonConfig())  # type: ignore[arg-type]
    daemon._shutdown()
    assert scancels(runner) == [("scancel", "12")]
    assert (store.holder("12").state, store.holder("12").reason) == ("ended", "released at exit")
    assert store.holder("11").state == "running"
    assert daemon.pool.counts.released == 1


def test_a_holder_the_store_refuses_is_cancelled_unrecorded(store: Store) -> None:
    # node1 has a live holder (11): the store refuses the new one submitted there.
    pool, runner = held_pool(store, sbatch=[recorded("13\n")], scancel=[recorded()])
    view = PoolView(200.0, frozenset({"node1"}), {"node1": None}, False, 0.0, False)
    learnt: list[Submitted | Ended] = []
    pool._acquire(["node1"], view, 200.0, learnt)
    pool.learn(learnt)  # records the new holder: the store refuses it
    pool.act(pool.plan(201.0, False, NO_DEMAND).plan)  # and that step's orders cancel it
    assert scancels(runner) == [("scancel", "13")]
    assert (pool.counts.acquired, pool.counts.released) == (1, 1)
    assert {h.job_id for h in store.holders()} == {"11", "12"}


def test_a_holder_submitted_in_a_step_is_ours_at_the_next_read(store: Store) -> None:
    # A step's act submits 13; the next step reads the scheduler before it records 13.
    squeue = (
        "11|RUNNING|node1|node1|N/A|None|\n12|RUNNING|node2|node2|N/A|None|\n"
        "13|PENDING|node3||N/A|Resources|\n"
    )
    pool, runner = held_pool(
        store, sbatch=[recorded("13\n")], squeue=[recorded(squeue)], scancel=[recorded()]
    )
    view = PoolView(200.0, frozenset({"node3"}), {"node3": None}, False, 0.0, False)
    learnt: list[Submitted | Ended] = []
    pool._acquire(["node3"], view, 200.0, learnt)
    pool.sync_holders(201.0)
    assert scancels(runner) == []  # not taken for a holder the store does not know
    pool.learn(learnt)  # that step records it
    assert store.holder("13").state == "pending"


def test_a_spare_holder_is_kept_a_few_polls_for_the_next_trainer(store: Store) -> None:
    """A trial's end, then the next trial a poll later: the freed node's holder is kept
    for it (SPARE_KEPT_POLLS), not cancelled and submitted again (the HPO e2e cancelled
    and held node4 again within a second, three times). Past the polls it is released."""
    pool, runner = held_pool(store, scancel=[recorded()])
    pool._view = PoolView(200.0, frozenset({"node1", "node2"}), {}, False, 0.0, False)
    one = Demand(1, frozenset({"node1"}))  # node2's trainer has ended
    plans = [pool.plan(200.0 + dt, True, one).plan for dt in (0.0, 10.0, 20.0)]
    assert all(not p for p in plans), plans  # kept for 3 polls of 10 s: nothing ordered
    two = Demand(2, frozenset({"node1"}))  # the next trial came: node2 is there for it
    assert not pool.plan(225.0, True, two).plan
    assert not pool.plan(260.0, True, Demand(2, frozenset({"node1", "node2"}))).plan
    # Spare again, and for 3 polls: released, through the one cancel path.
    for now_s in (270.0, 280.0, 290.0):
        assert not pool.plan(now_s, True, one).plan
    planned = pool.plan(300.0, True, one)
    assert [(o.nodes, o.kind) for o in planned.plan] == [(("node2",), "release")]
    pool.act(planned.plan)
    assert scancels(runner) == [("scancel", "12")]


def test_a_holder_pending_past_the_wait_is_not_counted_as_coming(store: Store) -> None:
    """A newcomer waits for nodes being held (loop/held_wait.py), but not for a holder
    that has pended longer than that wait: a partition's node cap would keep it pending
    for good, and every arrival would wait in vain."""
    store.add_holder("13", "node3", now_s=100.0)  # pending
    pool, _ = held_pool(store)
    pool._view = PoolView(
        100.0, frozenset({"node1", "node2", "node3", "node4"}), {}, False, 0.0, False
    )
    demand = Demand(4, frozenset({"node1", "node2"}))
    assert pool.plan(100.0 + WAIT_FOR_HELD_S / 2, True, demand).holdable == 4
    assert pool.plan(100.0 + WAIT_FOR_HELD_S, True, demand).holdable == 3
