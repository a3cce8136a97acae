"""The replay against hand-checked answers, and its guarantees."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.idle_monitor.trace import Trace
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.registry import equal_share_counts
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.workload import hpo_workload

LINEAR = ((1.0, 10.0), (4.0, 40.0))  # 10 samples/s per node


def job(work: float = 1e12, submit_s: float = 0.0, jid: str = "j") -> JobSpec:
    return JobSpec(
        id=jid,
        model="m",
        submit_s=submit_s,
        n_min=1,
        n_max=4,
        rescale_up_s=5.0,
        rescale_down_s=2.0,
        work_samples=work,
        curve=LINEAR,
    )


def tiny_trace() -> Trace:
    """Pool {a,b} at 0; c joins at 100; a leaves at 200; ends at 300."""
    return Trace(
        nodes=("a", "b", "c", "d"),
        initial_idle=frozenset({"a", "b"}),
        start_s=0.0,
        end_s=300.0,
        events=(PoolEvent(100.0, joined=frozenset({"c"})), PoolEvent(200.0, left=frozenset({"a"}))),
    )


@pytest.mark.parametrize("policy", ["milp", "equal"])
def test_every_metric_of_a_tiny_trace_by_hand(policy: str) -> None:
    s = replay(tiny_trace(), [job()], ReplayConfig(policy=policy, t_fwd_s=1000.0)).summary
    # 2 nodes x 100 s, 3 x 100 s, 2 x 100 s at 10 samples/s per node
    assert s["samples_processed"] + s["rescale_cost_samples"] + s["preemption_cost_samples"] == (
        pytest.approx(7000.0)
    )
    assert s["rescale_cost_samples"] == pytest.approx(5.0 * 20.0)  # grow 2->3: R_up x rate(2)
    assert s["preemption_cost_samples"] == pytest.approx(2.0 * 30.0)  # a leaves: R_dw x rate(3)
    assert s["samples_processed"] == pytest.approx(7000.0 - 100.0 - 60.0)
    assert s["resource_integral_node_hours"] == pytest.approx(700.0 / 3600)
    assert s["eq_nodes"] == pytest.approx(700.0 / 300.0)
    assert s["baseline_samples"] == pytest.approx(300.0 * 10.0 * 700.0 / 300.0)
    assert s["utilization_efficiency"] == pytest.approx(6840.0 / 7000.0)
    assert s["events"] == 3
    assert s["trainers_completed"] == 0


def test_a_trainer_completes_mid_interval_and_the_replay_ends_there() -> None:
    result = replay(tiny_trace(), [job(work=1500.0)], ReplayConfig(t_fwd_s=1000.0))
    s = result.summary
    assert s["trainers_completed"] == 1
    assert s["mean_trainer_runtime_s"] == pytest.approx(75.0)  # 1500 samples at 20/s
    assert s["hours"] == pytest.approx(75.0 / 3600)
    assert s["utilization_efficiency"] == pytest.approx(1.0)


def test_a_constant_pool_with_endless_trainers_gives_u_of_one_for_milp() -> None:
    nodes = tuple(f"n{i}" for i in range(100))
    trace = Trace(
        nodes=nodes, initial_idle=frozenset(nodes), start_s=0.0, end_s=36_000.0, events=()
    )
    jobs = hpo_workload(10, 0.0, interval_s=0.0, work_samples=1e15)
    s = replay(trace, jobs, ReplayConfig(policy="milp", solver="dp")).summary
    assert s["utilization_efficiency"] == pytest.approx(1.0, rel=1e-9)
    assert s["rescale_cost_samples"] == 0.0


def test_later_arrivals_cost_rescales_and_lower_u_below_one() -> None:
    nodes = tuple(f"n{i}" for i in range(100))
    trace = Trace(
        nodes=nodes, initial_idle=frozenset(nodes), start_s=0.0, end_s=36_000.0, events=()
    )
    jobs = hpo_workload(10, 0.0, interval_s=600.0, work_samples=1e15)
    s = replay(trace, jobs, ReplayConfig(policy="milp", solver="dp")).summary
    assert s["rescale_cost_samples"] > 0
    assert 0.9 < s["utilization_efficiency"] < 1.0


def test_the_replay_is_deterministic_and_windows_add_up() -> None:
    trace = synthetic_trace(SyntheticConfig(nodes=128, duration_s=8 * 3600, seed=3))
    jobs = hpo_workload(50, trace.start_s, interval_s=300.0, work_samples=2e8)
    config = ReplayConfig(policy="milp", solver="highs", window_s=3600.0)
    a, b = replay(trace, jobs, config), replay(trace, jobs, config)
    timing = {"wall_s", "events_per_s", "mean_solve_s"}
    assert {k: v for k, v in a.summary.items() if k not in timing} == {
        k: v for k, v in b.summary.items() if k not in timing
    }
    assert [s.pool_nodes for s in a.metrics.steps] == [s.pool_nodes for s in b.metrics.steps]
    assert sum(w["samples_processed"] for w in a.windows) == pytest.approx(
        a.summary["samples_processed"]
    )
    eq_node_s = sum(w["eq_nodes"] * w["hours"] * 3600 for w in a.windows)
    assert eq_node_s == pytest.approx(a.summary["resource_integral_node_hours"] * 3600)


def test_milp_beats_equal_share_on_a_synthetic_day() -> None:
    trace = synthetic_trace(SyntheticConfig(nodes=256, duration_s=12 * 3600, seed=1))
    jobs = hpo_workload(200, trace.start_s)
    milp = replay(trace, jobs, ReplayConfig(policy="milp", solver="dp")).summary
    equal = replay(trace, jobs, ReplayConfig(policy="equal")).summary
    assert milp["utilization_efficiency"] > equal["utilization_efficiency"]
    assert milp["rescale_cost_samples"] < equal["rescale_cost_samples"]


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        (10, {"a": 4, "b": 3, "c": 3}),  # 3 each, the leftover to the first
        (2, {"a": 1, "b": 1, "c": 0}),  # the latest arrival drops out
        (30, {"a": 8, "b": 10, "c": 10}),  # capped at n_max; leftovers in arrival order
    ],
)
def test_equal_share_by_hand(pool: int, expected: dict[str, int]) -> None:
    limits = [("a", 1, 8), ("b", 1, 10), ("c", 1, 10)]
    assert equal_share_counts(limits, pool) == expected


def test_cli_replay_writes_every_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "replay",
            "--synthetic-nodes",
            "64",
            "--synthetic-hours",
            "3",
            "--jobs-count",
            "20",
            "--policy",
            "milp,equal",
            "--solver",
            "dp",
            "--no-progress",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "U (A_e / A_s)" in result.output
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert [r["policy"] for r in runs] == ["milp", "equal"]
    required = {
        "policy",
        "t_fwd",
        "events",
        "resource_integral_node_hours",
        "eq_nodes",
        "samples_processed",
        "baseline_samples",
        "utilization_efficiency",
        "rescale_cost_samples",
        "preemption_cost_samples",
        "trainers_completed",
        "mean_trainer_runtime_s",
        "wall_s",
    }
    for r in runs:
        assert required <= set(r)
        assert 0.0 <= r["utilization_efficiency"] <= 1.0
    for name in ("events.csv", "trainers.csv", "allocations.csv", "windows.csv", "summary.json"):
        assert (out / "milp-tfwdauto" / name).stat().st_size > 0
    for png in ("utilization_per_window.png", "costs.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG")


def test_cli_sweep_plots_u_against_tfwd(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "replay",
            "--synthetic-nodes",
            "64",
            "--synthetic-hours",
            "2",
            "--jobs-count",
            "20",
            "--solver",
            "dp",
            "--sweep",
            "tfwd=10,300",
            "--no-progress",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    runs = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert sorted(r["t_fwd"] for r in runs) == [10.0, 300.0]
    assert (tmp_path / "utilization_vs_tfwd.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "abc"], "--nodes 'abc'"),
        (["--policy", "greedy"], "--policy 'greedy'"),
        (["--sweep", "tfwd=a,b"], "--sweep"),
        (["/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
        (["--start", "yesterday"], "--start: bad time 'yesterday'"),
    ],
)
def test_cli_replay_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["replay", *args, "--no-progress", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_nan_free_summary_when_nothing_is_idle(tmp_path: Path) -> None:
    trace = Trace(nodes=("a",), initial_idle=frozenset(), start_s=0.0, end_s=100.0, events=())
    s = replay(trace, [job()], ReplayConfig()).summary
    assert s["resource_integral_node_hours"] == 0.0
    assert math.isnan(s["utilization_efficiency"])  # no baseline: U is undefined, not 0 or 1
