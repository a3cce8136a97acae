"""The replay's record of each trainer's node count (bftrainer/replay/allocations.py)."""

from __future__ import annotations

from dataclasses import replace

from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.workload import hpo_workload
from tests.bftrainer.test_replay import job, tiny_trace


def test_a_trainers_life_on_the_tiny_trace() -> None:
    """Starts on {a,b}, grows when c joins, is cut when a leaves (no node to replace it)."""
    r = replay(tiny_trace(), [job()], ReplayConfig(policy="equal"))
    rows = [(a.time_s, a.trainer_id, a.nodes, a.change) for a in r.allocations]
    assert rows == [
        (0.0, "j", 2, "start"),
        (100.0, "j", 3, "rescale"),
        (200.0, "j", 2, "preempt"),
    ]


def test_a_completion_frees_the_nodes() -> None:
    r = replay(tiny_trace(), [job(work=1500.0)], ReplayConfig(policy="equal"))
    # 2 nodes x 10 samples/s: 1500 samples by 75 s
    assert [(a.time_s, a.nodes, a.change) for a in r.allocations] == [
        (0.0, 2, "start"),
        (75.0, 0, "complete"),
    ]


def test_the_changes_add_up_to_every_steps_allocated_nodes() -> None:
    """Replaying the changes in order gives the loop's own count at every recorded step."""
    trace = synthetic_trace(SyntheticConfig(nodes=64, duration_s=6 * 3600, seed=3))
    jobs = [replace(j, work_samples=1e7) for j in hpo_workload(40, trace.start_s, interval_s=300.0)]
    r = replay(trace, jobs, ReplayConfig(policy="milp", solver="dp", t_fwd_s=120.0))
    assert {a.change for a in r.allocations} >= {"start", "rescale", "preempt", "complete"}
    held: dict[str, int] = {}
    changes = iter(r.allocations)
    pending = next(changes, None)
    for step in r.metrics.steps:
        while pending is not None and pending.time_s <= step.time_s:
            held[pending.trainer_id] = pending.nodes
            pending = next(changes, None)
        assert sum(held.values()) == step.allocated_nodes, step
    starts = [a.trainer_id for a in r.allocations if a.change == "start"]
    assert len(starts) == len(set(starts))
