"""benchmarks/window_bound.py: an upper bound on U for any policy; it must hold for the
replay's own policies, departures known or not, and charge what it says."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.idle_monitor.trace import Trace
from bftrainer.replay.metrics import best_split_sps, reference_curve
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.workload import hpo_workload


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "window_bound.py"
    spec = importlib.util.spec_from_file_location("window_bound", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


@pytest.mark.parametrize("seed", [0, 1])
def test_no_replayed_policy_beats_the_bound(seed: int) -> None:
    trace = synthetic_trace(SyntheticConfig(nodes=96, duration_s=8 * 3600.0, seed=seed))
    jobs = hpo_workload(300, trace.start_s, work_samples=2e7)
    b = bench.bound(trace, jobs)
    assert b["utilization_bound"] <= b["utilization_limit"]
    assert b["unavoidable_cost_samples"] > 0
    for config in (
        ReplayConfig(policy="milp", solver="dp", t_fwd_s=120.0, windows="oracle"),
        ReplayConfig(policy="milp", solver="dp", t_fwd_s=120.0),
        ReplayConfig(policy="equal"),
    ):
        s = replay(trace, jobs, config).summary
        # The same baseline and limit as the replay's (same span, same P_best).
        assert math.isclose(s["baseline_samples"], b["baseline_samples"], rel_tol=1e-12)
        assert math.isclose(s["utilization_limit"], b["utilization_limit"], rel_tol=1e-12)
        assert s["utilization_efficiency"] <= b["utilization_bound"]
        assert s["trainers_completed"] <= b["completions_at_most"]


def test_a_node_that_leaves_costs_a_removal_or_its_idle_time() -> None:
    start = 1.6e9
    nodes = tuple(f"n{i}" for i in range(6))
    # n0-n3 stay 600 s (a removal is cheaper than idling); n4 stays 5 s (idling is);
    # n5 never leaves (no charge).
    trace = Trace(
        nodes=nodes,
        initial_idle=frozenset(nodes),
        start_s=start,
        end_s=start + 3600,
        events=(
            PoolEvent(start + 5, left=frozenset({"n4"})),
            PoolEvent(start + 600, left=frozenset({"n0", "n1", "n2", "n3"})),
        ),
    )
    job = replace(hpo_workload(1, start)[0], work_samples=1e15)  # no completion
    b = bench.bound(trace, [job])
    c_r = bench.removal_cost_per_node([job])
    assert c_r == pytest.approx(job.rescale_down_s * job.rate_sps(64) / 64)
    # Idle loss of n4: 5 s at the least marginal of P_best up to 6 nodes.
    best = best_split_sps(reference_curve([job]), bench.MAX_TRAINERS, 7)
    least = float(np.diff(best)[:6].min())
    assert b["unavoidable_cost_samples"] == pytest.approx(4 * c_r + 5 * least)
    assert b["completions_at_most"] == 0
    assert b["completion_allowance_samples"] == 0


def test_the_decomposition_adds_up_to_the_distance_from_the_limit() -> None:
    trace = synthetic_trace(SyntheticConfig(nodes=96, duration_s=4 * 3600.0, seed=2))
    jobs = hpo_workload(200, trace.start_s, work_samples=2e7)
    d = bench.decompose(trace, jobs, "oracle")
    parts = [v for k, v in d.items() if k.endswith("_share")]
    assert all(v >= -1e-12 for v in parts)
    gap = d["utilization_limit"] - d["utilization_efficiency"]
    assert sum(parts) == pytest.approx(gap, rel=1e-9)
    assert d["nodes_held_when_leaving"] > 0
