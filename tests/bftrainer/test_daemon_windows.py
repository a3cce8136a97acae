"""The daemon's pool tells the loop when each held node will be taken back, on the real
local Slurm: a holder's time limit, and the main scheduler's plan for a node we hold
(which moves when the plan does).

Uses all 8 nodes; cancels only the jobs it started, by id.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bftrainer.daemon import HeldPool, leave_by_s
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.runner import LocalRunner, RetryPolicy
from bftrainer.idle_monitor.slurm import SlurmScheduler
from bftrainer.idle_monitor.source import LivePoolSource, PoolConfig
from bftrainer.loop import Demand, PoolChange
from bftrainer.state import HolderRow, Store, ensure_state_dir
from tests.bftrainer.test_holders_slurm import Tracked, holders, idle_nodes, jobs  # noqa: F401
from tests.conftest import SlurmCluster, wait_until
from tests.idle_monitor.test_slurm_live import planned_start

POLL_S = 1.0


def held_pool(cluster: SlurmCluster, tracked: Tracked, store: Store) -> HeldPool:
    runner = LocalRunner(env=cluster.env, timeout_s=20, retry=RetryPolicy(1))
    # A 30 s horizon: nodes claimed minutes ahead are still in the pool, with a window.
    monitor = LivePoolSource(
        SlurmScheduler(bf_partitions=("bf",)), runner, PoolConfig(horizon_s=30.0)
    )
    return HeldPool(monitor, tracked, store, POLL_S)


def every_held_node_used(store: Store) -> Demand:
    """Trainers use every held node: the pool keeps them until the scheduler takes them."""
    return Demand(8, frozenset(h.node for h in store.holders() if h.state == "running"))


@dataclass(frozen=True)
class Planned:
    nodes: list[str]  # all 8, sorted
    first: str  # a main job on nodes[0] for 4 min
    big: str  # an 8-node main job planned at its end


@pytest.fixture
def planned(slurm_cluster: SlurmCluster, jobs: list[str]) -> Planned:  # noqa: F811
    """A main job on one node for 4 min, and an 8-node one planned at its end: every
    other node is claimed about 4 min ahead (both cancelled by ``jobs``)."""
    nodes = idle_nodes(slurm_cluster, 8)
    first = slurm_cluster.sbatch("-p", "main", "-w", nodes[0], "-t", "4", "--wrap", "sleep 600")
    jobs.append(first)
    big = slurm_cluster.sbatch("-p", "main", "-N", "8", "-t", "5", "--wrap", "sleep 10")
    jobs.append(big)
    wait_until(lambda: planned_start(slurm_cluster, big) is not None, 60, "a planned start")
    return Planned(nodes, first, big)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(ensure_state_dir(tmp_path / "state")) as opened:
        yield opened


class Told:
    """Each node's departure (epoch s) as the loop was told it, from the pool's events."""

    def __init__(self, pool: HeldPool) -> None:
        self.pool = pool
        self.leave_by_s: dict[str, float | None] = {}
        self.nodes: set[str] = set()

    def poll(self, now_s: float) -> None:
        """One step of the daemon's pool: its read and poll, then its hold plan
        (``plan``) and the commands it plans (``act``)."""
        self.pool.read(now_s)
        polled = self.pool.poll(now_s).inputs
        plan = self.pool.plan(now_s, False, every_held_node_used(self.pool.store))
        # The nodes it releases leave the loop's pool in the same step (the loop applies them).
        released = [PoolChange(PoolEvent(now_s, left=plan.released))] if plan.released else []
        inputs = [*polled, *released]
        self.pool.learn(self.pool.act(plan.plan))
        for item in inputs:
            assert isinstance(item, PoolChange)
            event: PoolEvent = item.event
            self.nodes = (self.nodes | event.joined) - event.left
            for n in event.left:
                self.leave_by_s.pop(n, None)
            for n, w in event.windows_s.items():
                assert n in self.nodes, f"a window for {n}, not in the pool"
                self.leave_by_s[n] = None if w is None else event.time_s + w


@pytest.mark.slurm
@pytest.mark.slow
def test_the_loop_learns_when_held_nodes_leave(
    slurm_cluster: SlurmCluster,
    holders: Tracked,  # noqa: F811
    planned: Planned,
    store: Store,
) -> None:
    first, big = planned.first, planned.big
    told = Told(held_pool(slurm_cluster, holders, store))
    others = set(planned.nodes[1:])

    def all_held() -> bool:
        told.poll(time.time())
        return told.nodes == others

    try:
        wait_until(all_held, 90, "a holder running on each node the main jobs leave free")
    except AssertionError as exc:
        view = told.pool.monitor.view()
        raise AssertionError(
            f"{exc}; pool {sorted(view.pool)}, claims {dict(view.claims_s)}, "
            f"holders {store.holders()}, told {told.leave_by_s}\n"
            + slurm_cluster.run(["squeue", "-o", "%i|%P|%T|%r|%N|%l|%S|%V"])
        ) from None
    # Each holder asked for its window less the slack, rounded down to whole minutes (2
    # of the ~4 left): the scheduler ends it first, and the loop was told so.
    start = planned_start(slurm_cluster, big)
    assert start is not None
    for h in store.holders():
        assert h.limit_s is not None and h.started_s is not None
        usable = start - h.submit_s - holders.slack_s
        assert h.limit_s % 60 == 0 and usable - 61 < h.limit_s <= usable + 1
        leave_by = told.leave_by_s[h.node]
        assert leave_by is not None
        assert leave_by == pytest.approx(h.started_s - POLL_S + h.limit_s)
        assert leave_by < start

    # The first main job will end sooner: the plan moves earlier than the holders' ends,
    # and the loop is told the scheduler's new time for every held node.
    slurm_cluster.run(["scontrol", "update", f"JobId={first}", "TimeLimit=2"])

    def plan_moved() -> bool:
        told.poll(time.time())
        new = planned_start(slurm_cluster, big)
        return (
            new is not None
            and new < start - 60
            and all(
                (t := told.leave_by_s.get(n)) is not None and abs(t - new) < 3.0 for n in others
            )
        )

    wait_until(plan_moved, 60, "the loop told the main job's new planned start")
    assert told.nodes == others, "no held node was lost on the way"


@pytest.mark.slurm
def test_a_holder_that_cannot_start_before_its_nodes_claim_is_replaced(
    slurm_cluster: SlurmCluster,
    holders: Tracked,  # noqa: F811
    planned: Planned,
    store: Store,
) -> None:
    big, node = planned.big, planned.nodes[1]
    # A holder without a time limit (submitted before the plan, say) never starts now.
    stuck = holders.acquire(node, None)
    store.add_holder(stuck, node, limit_s=None)
    pool = held_pool(slurm_cluster, holders, store)
    one_trainer = Demand(1, frozenset())
    now_s = time.time()
    pool.read(now_s)
    pool.poll(now_s)
    learnt = pool.act(pool.plan(now_s, False, one_trainer).plan)  # the cancel, after the step
    pool.learn(learnt)  # recorded at the next step; here at once
    assert store.holder(stuck).state == "ended"
    assert store.holder(stuck).reason == "cannot start before its node's claim"
    wait_until(lambda: stuck not in holders.held() or holders.held()[stuck].state == "ended",
               30, f"holder {stuck} cancelled")  # fmt: skip

    def one_running() -> bool:
        now_s = time.time()
        pool.read(now_s)
        pool.poll(now_s)
        pool.learn(pool.act(pool.plan(now_s, False, one_trainer).plan))
        return [h.state for h in store.holders()] == ["running"]

    wait_until(one_running, 60, "a new holder, limited to the window, running")
    (new,) = store.holders()
    start = planned_start(slurm_cluster, big)
    assert start is not None and new.limit_s is not None
    assert new.limit_s < start - time.time()


def test_a_held_node_leaves_at_the_earlier_of_its_claim_and_its_holder_end() -> None:
    rows = [
        HolderRow("1", "a", "running", 0.0, started_s=100.0, limit_s=1200.0),  # ends 1295
        HolderRow("2", "b", "running", 0.0, started_s=100.0, limit_s=1200.0),
        HolderRow("3", "c", "running", 0.0, started_s=100.0),  # no limit
        HolderRow("4", "d", "running", 0.0, started_s=100.0),
    ]
    claims = {"a": 60.0, "b": 900.0, "c": 30.0, "elsewhere": 10.0}
    assert leave_by_s(claims, rows, 1000.0, poll_interval_s=5.0) == {
        "a": 1060.0,  # the claim first
        "b": 1295.0,  # the holder's end first (it started up to a poll before it was seen)
        "c": 1030.0,
        "d": None,
    }
