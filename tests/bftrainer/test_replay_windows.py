"""``bftrainer replay --windows``: what the pool source knows of departures, the core
loop's handling of stated windows, and that no windows means no change."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.idle_monitor.trace import Trace, load_trace
from bftrainer.loop import Arrival, Loop, LoopState, PoolChange, TimedSource, VirtualClock
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.config import ConfigError
from bftrainer.policies.registry import make_policy
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.simulator import SimulatedDriver
from bftrainer.replay.windows import WindowKnowledge, events_with_windows
from bftrainer.replay.workload import hpo_workload, read_paper_jobs
from tests.shared_data import SHARED

# a: idle from the start, leaves at 100. b: joins at 50, leaves at 300. c: joins at 60,
# stays. d: joins at 300 (as b leaves), stays.
TRACE = Trace(
    nodes=("a", "b", "c", "d"),
    initial_idle=frozenset({"a"}),
    start_s=0.0,
    end_s=400.0,
    events=(
        PoolEvent(50.0, joined=frozenset({"b"})),
        PoolEvent(60.0, joined=frozenset({"c"}), windows_s={"c": 5.0}),
        PoolEvent(100.0, left=frozenset({"a"})),
        PoolEvent(300.0, joined=frozenset({"d"}), left=frozenset({"b"})),
    ),
)


def windows_at(events: list[PoolEvent]) -> dict[float, dict[str, float | None]]:
    return {e.time_s: dict(e.windows_s) for e in events if e.windows_s}


def test_oracle_states_each_true_departure_when_the_node_joins() -> None:
    events = events_with_windows(TRACE, WindowKnowledge("oracle"))
    assert windows_at(events) == {0.0: {"a": 100.0}, 50.0: {"b": 250.0}}
    # The trace's own events are all there, in order, with their joins and leaves.
    moves = [(e.time_s, e.joined, e.left) for e in events if e.joined or e.left]
    assert moves == [(e.time_s, e.joined, e.left) for e in TRACE.events]


def test_none_drops_the_windows_a_trace_carries() -> None:
    events = events_with_windows(TRACE, WindowKnowledge("none"))
    assert windows_at(events) == {}
    assert [e.time_s for e in events] == [e.time_s for e in TRACE.events]


def test_realistic_states_a_departure_lead_seconds_ahead() -> None:
    events = events_with_windows(TRACE, WindowKnowledge("realistic", lead_s=30.0))
    assert windows_at(events) == {70.0: {"a": 30.0}, 270.0: {"b": 30.0}}
    assert [e.time_s for e in events if not (e.joined or e.left)] == [70.0, 270.0]


def test_realistic_share_and_error_are_drawn_reproducibly() -> None:
    trace = synthetic_trace(SyntheticConfig(nodes=64, duration_s=6 * 3600.0, seed=3))
    knowledge = WindowKnowledge("realistic", known_share=0.5, error_s=60.0, seed=7)
    first = events_with_windows(trace, knowledge)
    assert events_with_windows(trace, knowledge) == first
    instants = {e.time_s for e in trace.events if e.left}
    known = {e.time_s + w for e in first for w in e.windows_s.values()}
    assert 0.35 * len(instants) < len(known) < 0.65 * len(instants)
    # The nodes leaving together are known together, off by one error: a departure
    # stated after its nodes joined is an event of its own, with one window.
    ahead = events_with_windows(trace, WindowKnowledge("realistic", lead_s=300.0, error_s=60.0))
    alone = [e for e in ahead if not (e.joined or e.left)]
    assert alone
    assert any(len(e.windows_s) > 1 for e in alone)
    assert all(len(set(e.windows_s.values())) == 1 for e in alone)
    none_known = WindowKnowledge("realistic", known_share=0.0)
    assert windows_at(events_with_windows(trace, none_known)) == {}
    exact = windows_at(events_with_windows(trace, WindowKnowledge("realistic")))
    assert exact == windows_at(events_with_windows(trace, WindowKnowledge("oracle")))


def job(jid: str, submit_s: float = 0.0) -> JobSpec:
    return JobSpec(
        id=jid,
        model="m",
        submit_s=submit_s,
        n_min=1,
        n_max=8,
        rescale_up_s=18.0,
        rescale_down_s=12.0,
        work_samples=1e12,
        curve=((1.0, 100.0), (8.0, 750.0)),
    )


def run_loop(events: list[PoolEvent]) -> tuple[Loop, list[float]]:
    """The loop over ``events`` with one trainer; the times at which it decided."""
    decided: list[float] = []
    config = ReplayConfig(policy="milp", solver="dp", t_fwd_s=120.0)
    loop = Loop(
        [
            TimedSource((e.time_s, PoolChange(e)) for e in events),
            TimedSource([(0.0, Arrival(job("t")))]),
        ],
        SimulatedDriver(),
        VirtualClock(0.0),
        config,
        policy=make_policy(config),
        state=LoopState(now_s=0.0, pool=("n0", "n1")),
    )
    while loop.now_s < events[-1].time_s:
        step = loop.step(until_s=events[-1].time_s)
        if step is not None and step.decided:
            decided.append(step.time_s)
    return loop, decided


def test_loop_decides_on_a_new_window_not_on_a_restated_one() -> None:
    events = [
        PoolEvent(10.0, windows_s={"n1": 50.0}),  # news: n1 leaves at 60
        PoolEvent(20.0, windows_s={"n1": 40.0}),  # the same departure, restated
        PoolEvent(30.0, windows_s={"n1": 100.0}),  # moved to 130: news
        PoolEvent(40.0, windows_s={"n1": None}),  # open-ended again: news
    ]
    loop, decided = run_loop(events)
    assert decided == [0.0, 10.0, 30.0, 40.0]
    assert loop.leave_by_s == {}


def test_loop_hands_the_policy_windows_ahead_and_forgets_nodes_that_left() -> None:
    events = [
        PoolEvent(10.0, joined=frozenset({"n2"}), windows_s={"n2": 30.0, "n0": 500.0}),
        PoolEvent(40.0, left=frozenset({"n2"})),
    ]
    loop, _ = run_loop(events)
    assert loop.leave_by_s == {"n0": 510.0}


def summary_figures(summary: dict[str, object]) -> dict[str, object]:
    skip = {"wall_s", "events_per_s", "mean_solve_s", "windows"}
    return {k: v for k, v in summary.items() if k not in skip}


def small_replay(**config: object) -> dict[str, object]:
    trace = synthetic_trace(SyntheticConfig(nodes=128, duration_s=6 * 3600.0, seed=0))
    jobs = hpo_workload(100, trace.start_s)
    return replay(trace, jobs, ReplayConfig(policy="milp", solver="dp", **config)).summary


def test_without_windows_every_figure_is_unchanged() -> None:
    """--windows none is the default and gives the replay of before, figure for figure,
    even on a trace that carries windows of its own (they are dropped)."""
    trace = synthetic_trace(SyntheticConfig(nodes=128, duration_s=6 * 3600.0, seed=0))
    jobs = hpo_workload(100, trace.start_s)
    plain = replay(trace, jobs, ReplayConfig(policy="milp", solver="dp")).summary
    assert plain["windows"] == "none"
    with_stated = Trace(
        nodes=trace.nodes,
        initial_idle=trace.initial_idle,
        start_s=trace.start_s,
        end_s=trace.end_s,
        events=tuple(events_with_windows(trace, WindowKnowledge("oracle"))),
    )
    none = replay(with_stated, jobs, ReplayConfig(policy="milp", solver="dp", windows="none"))
    assert summary_figures(none.summary) == summary_figures(plain)


def test_oracle_windows_cut_preemption_and_raise_u_on_the_synthetic_day() -> None:
    """Measured on this trace: U 0.9615 without windows, 0.9662 with the oracle's."""
    none = small_replay(windows="none")
    oracle = small_replay(windows="oracle")
    assert oracle["windows"] == "oracle"
    assert oracle["preemption_cost_samples"] < 0.9 * none["preemption_cost_samples"]
    assert oracle["utilization_efficiency"] > none["utilization_efficiency"] + 0.002


def test_realistic_parameters_are_checked() -> None:
    with pytest.raises(ConfigError, match="windows_known_share"):
        ReplayConfig(windows="realistic", windows_known_share=1.5)
    with pytest.raises(ConfigError, match="windows"):
        ReplayConfig(windows="psychic")
    config = ReplayConfig(windows="realistic", windows_lead_s=600.0)
    assert config.window_knowledge == WindowKnowledge("realistic", 1.0, 600.0, 0.0)
    assert math.isinf(ReplayConfig().windows_lead_s)


def test_cli_flags_and_config_file(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('[replay]\nwindows = "realistic"\nwindows_known_share = 0.5\n')
    args = ["replay", "--synthetic-nodes", "64", "--synthetic-hours", "2", "--jobs-count", "20"]
    args += ["--policy", "milp", "--solver", "dp", "--no-progress", "--config", str(toml)]
    result = CliRunner().invoke(cli, [*args, "--windows-lead", "300", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["windows"] == "realistic"
    assert summary["windows_known_share"] == 0.5
    assert summary["windows_lead_s"] == 300.0
    bad = CliRunner().invoke(cli, [*args, "--windows-share", "2", "--out", str(tmp_path / "p")])
    assert bad.exit_code == 2
    assert "--windows-share" in bad.output


TRACES = SHARED / "bftrainer-traces"
WEEK1 = TRACES / "summit_week1_node_events.csv.gz"
JOBS = TRACES / "hps-shufflenet-Jbnd-1000J.csv"


@pytest.mark.skipif(not WEEK1.is_file(), reason=f"Summit trace not found at {WEEK1}")
def test_oracle_windows_on_the_first_6_hours_of_summit_week_1() -> None:
    """Measured: U 0.9163 without windows, 0.9197 with the oracle's; preemption cost
    9.8e7 -> 8.0e7 samples (docs/benchmarks.md, "Windows", has the whole week)."""
    jobs = read_paper_jobs(JOBS)
    trace = load_trace(WEEK1, nodes=slice(0, 1024))
    start = max(trace.start_s, jobs[0].submit_s)
    trace = trace.slice(start_s=start, end_s=start + 6 * 3600)
    runs = {
        mode: replay(
            trace, jobs, ReplayConfig(policy="milp", solver="dp", t_fwd_s=120.0, windows=mode)
        ).summary
        for mode in ("none", "oracle")
    }
    none, oracle = runs["none"], runs["oracle"]
    assert none["utilization_efficiency"] == pytest.approx(0.9163, abs=5e-5)
    assert oracle["utilization_efficiency"] > none["utilization_efficiency"] + 0.002
    assert oracle["preemption_cost_samples"] < 0.9 * none["preemption_cost_samples"]
    assert oracle["utilization_efficiency"] < oracle["utilization_limit"]


# In a fresh interpreter (its own PYTHONHASHSEED): the summaries of windowed replays.
CHILD = r"""
import json
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.workload import hpo_workload
trace = synthetic_trace(SyntheticConfig(nodes=128, duration_s=6 * 3600.0, seed=0))
jobs = hpo_workload(100, trace.start_s)
out = []
for kw in ({"windows": "oracle"}, {"windows": "realistic", "windows_known_share": 0.5,
           "windows_lead_s": 600.0, "windows_error_s": 60.0}):
    s = replay(trace, jobs, ReplayConfig(policy="milp", solver="dp", **kw)).summary
    out.append({k: v for k, v in s.items() if k not in ("wall_s", "events_per_s", "mean_solve_s")})
print(json.dumps(out))
"""


def test_windowed_replays_are_the_same_at_any_hash_seed() -> None:
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "OPENBLAS_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
        outs.append(json.loads(done.stdout))
    assert outs[0] == outs[1]
    assert [s["windows"] for s in outs[0]] == ["oracle", "realistic"]
