"""A read of the holders never acts: the holders it finds that are not ours (unknown to
the store, or lingering suspended) are ended by the orders of the step that records the
read, after its commit, through the held pool's one cancel path (issue 43).

The holders are the real ``SlurmHolders`` over recorded ``squeue``/``scancel`` replies;
the pool source is a one-view double (the pool is not what is tested here)."""

from __future__ import annotations

from pathlib import Path

from bftrainer.daemon import HeldPool
from bftrainer.idle_monitor.runner import recorded
from bftrainer.idle_monitor.source import PoolView
from bftrainer.loop import Demand
from bftrainer.state import Store, ensure_state_dir
from tests.bftrainer.test_holders import SQUEUE, slurm


class OneView:
    """The main scheduler's pool: nodes 1-6 idle, the same at every read."""

    def poll(self) -> None:
        pass

    def view(self) -> PoolView:
        nodes = frozenset(f"node{i}" for i in range(1, 7))
        return PoolView(0.0, nodes, {}, stale=False, stale_s=0.0, growth_held=False)


def scancels(runner: object) -> list[tuple[str, ...]]:
    return [argv for argv, _ in runner.calls if argv[0] == "scancel"]  # type: ignore[attr-defined]


def test_strays_found_by_a_read_are_ended_after_the_commit_not_during_the_read(
    tmp_path: Path,
) -> None:
    holders, runner = slurm(squeue=[recorded(SQUEUE)], scancel=[recorded()])
    store = Store.open(ensure_state_dir(tmp_path / "state"))
    # The store knows 11 (running on node1) and 16 (suspended on node6: lingering); 13
    # is unknown but ending, 14 unknown and pending: a stray, as 16 is.
    for job_id, node in (("11", "node1"), ("16", "node6")):
        store.add_holder(job_id, node)
        store.set_holder_state(job_id, "running")
    pool = HeldPool(OneView(), holders, store, poll_interval_s=1.0)  # type: ignore[arg-type]
    try:
        pool.read(1.0)
        assert scancels(runner) == [], "the read cancelled"
        with store.transaction():
            pool.poll(1.0)
            # node1 is held for a trainer: the plan neither releases nor acquires.
            hold = pool.plan(1.0, False, Demand(1, frozenset({"node1"}))).plan
        assert scancels(runner) == [], "the step cancelled inside its transaction"
        assert {h.job_id for h in store.holders(live_only=True)} == {"11"}  # 16 recorded ended
        counted = (pool.counts.released, pool.counts.lost)  # 16 lost, as the read recorded
        pool.act(hold)
        assert scancels(runner) == [("scancel", "14", "16")]
        # Ending a stray counts nothing more: 16 was counted when found gone, 14 never held.
        assert (pool.counts.released, pool.counts.lost) == counted
    finally:
        store.close()
