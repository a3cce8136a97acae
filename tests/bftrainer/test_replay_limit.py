"""The replay's limit U_max: the zero-cost, clairvoyant policy's U on the same pool."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.synthetic import synthetic_trace
from bftrainer.idle_monitor.trace import Trace, load_trace
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.workload import hpo_workload, read_paper_jobs
from tests.shared_data import SHARED

# Concave: 10, 16, 20, 22 samples/s at 1..4 nodes.
CONCAVE = ((1.0, 10.0), (2.0, 16.0), (3.0, 20.0), (4.0, 22.0))


def job(jid: str) -> JobSpec:
    return JobSpec(
        id=jid,
        model="m",
        submit_s=0.0,
        n_min=1,
        n_max=4,
        rescale_up_s=5.0,
        rescale_down_s=2.0,
        work_samples=1e12,
        curve=CONCAVE,
    )


def fluctuating_trace() -> Trace:
    """2 nodes for 100 s, 5 for 50 s, 1 for 150 s."""
    return Trace(
        nodes=("a", "b", "c", "d", "e"),
        initial_idle=frozenset({"a", "b"}),
        start_s=0.0,
        end_s=300.0,
        events=(
            PoolEvent(100.0, joined=frozenset({"c", "d", "e"})),
            PoolEvent(150.0, left=frozenset({"a", "b", "c", "d"})),
        ),
    )


def brute_force_best(nodes: int, trainers: int) -> float:
    """P_best(N) by trying every split of N whole nodes among the trainers (0..4 each)."""
    rate = {0: 0.0, **{int(n): v for n, v in CONCAVE}}
    return max(
        sum(rate[c] for c in split)
        for split in itertools.product(range(5), repeat=trainers)
        if sum(split) <= nodes
    )


@pytest.mark.parametrize("policy", ["milp", "equal"])
def test_the_limit_of_a_fluctuating_pool_by_hand(policy: str) -> None:
    config = ReplayConfig(policy=policy, solver="dp", t_fwd_s=120.0, max_trainers=2)
    s = replay(fluctuating_trace(), [job("x"), job("y")], config).summary
    # P_best with 2 trainers: 1 -> 10, 2 -> 10+10, 5 -> 20+16; checked by brute force.
    assert [brute_force_best(n, 2) for n in (1, 2, 5)] == [10.0, 20.0, 36.0]
    limit = 20.0 * 100 + 36.0 * 50 + 10.0 * 150  # the integral of P_best(N(t)): 5,300
    # N_eq = (2x100 + 5x50 + 1x150) / 300 = 2 nodes: A_s = 300 s x P_best(2) = 6,000
    assert s["baseline_samples"] == pytest.approx(6000.0)
    assert s["limit_samples"] == pytest.approx(limit)
    assert s["utilization_limit"] == pytest.approx(5300.0 / 6000.0)
    assert s["utilization_share_of_limit"] == pytest.approx(
        s["utilization_efficiency"] / s["utilization_limit"]
    )
    assert s["utilization_efficiency"] < s["utilization_limit"]  # it pays rescales


def test_a_constant_pool_has_the_limit_one() -> None:
    nodes = tuple(f"n{i}" for i in range(100))
    trace = Trace(nodes=nodes, initial_idle=frozenset(nodes), start_s=0.0, end_s=3600.0, events=())
    jobs = hpo_workload(10, 0.0, interval_s=0.0, work_samples=1e15)
    s = replay(trace, jobs, ReplayConfig(policy="equal")).summary
    assert s["utilization_limit"] == pytest.approx(1.0, rel=1e-12)


def test_the_limit_bounds_both_policies_on_the_synthetic_default() -> None:
    trace = synthetic_trace()  # the CLI's default: 512 nodes, 24 h, seed 0
    jobs = hpo_workload(1000, trace.start_s)
    summaries = [
        replay(trace, jobs, ReplayConfig(policy=p, solver="dp", t_fwd_s=120.0)).summary
        for p in ("milp", "equal")
    ]
    for s in summaries:
        assert s["utilization_efficiency"] <= s["utilization_limit"] <= 1.0
        assert 0.0 < s["utilization_share_of_limit"] <= 1.0
    # The same pool over the same span: one limit for both.
    assert summaries[0]["hours"] == summaries[1]["hours"]
    assert summaries[0]["utilization_limit"] == summaries[1]["utilization_limit"]


def test_no_pool_gives_no_limit() -> None:
    trace = Trace(nodes=("a",), initial_idle=frozenset(), start_s=0.0, end_s=100.0, events=())
    s = replay(trace, [job("x")], ReplayConfig(policy="equal")).summary
    assert s["limit_samples"] == 0.0
    assert math.isnan(s["utilization_limit"])  # null in summary.json, as U
    assert math.isnan(s["utilization_share_of_limit"])


def test_the_summary_and_the_table_show_the_limit(tmp_path: Path) -> None:
    args = ["replay", "--synthetic-nodes", "64", "--synthetic-hours", "3", "--jobs-count", "20"]
    args += ["--policy", "milp,equal", "--solver", "dp", "--no-progress", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    runs = json.loads((tmp_path / "summary.json").read_text())["runs"]
    rows = {line.split("  ")[0]: line.split()[-2:] for line in result.output.splitlines()}
    for r, shown_limit, shown_share in zip(
        runs, rows["limit U_max"], rows["U / U_max"], strict=True
    ):
        assert 0.0 < r["utilization_efficiency"] <= r["utilization_limit"] <= 1.0
        assert shown_limit == f"{100 * r['utilization_limit']:.1f}%"
        assert shown_share == f"{100 * r['utilization_share_of_limit']:.1f}%"


TRACES = SHARED / "bftrainer-traces"
WEEK1 = TRACES / "summit_week1_node_events.csv.gz"
JOBS = TRACES / "hps-shufflenet-Jbnd-1000J.csv"


@pytest.mark.skipif(not WEEK1.is_file(), reason=f"Summit trace not found at {WEEK1}")
def test_the_limit_on_summit_week_1() -> None:
    # ../shared/notes/replay-metrics.md: the limit is 0.939 on week 1. The limit does not
    # depend on the policy: the cheapest one measures it.
    trace = load_trace(WEEK1, nodes=slice(0, 1024))
    s = replay(trace, read_paper_jobs(JOBS), ReplayConfig(policy="equal")).summary
    assert s["hours"] == pytest.approx(147.6, abs=0.05)
    assert s["utilization_limit"] == pytest.approx(0.939, abs=0.0005)
    assert s["utilization_efficiency"] < s["utilization_limit"]
