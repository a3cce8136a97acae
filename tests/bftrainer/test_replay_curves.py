"""--curves known|learned: the policy plans on what trainers measured, never on their
profiles; known curves are the replay of before."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli as cli_main
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.idle_monitor.trace import Trace
from bftrainer.loop import Decision, Policy, PolicyInputs
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.registry import Admission, make_policy
from bftrainer.replay.learning import LearningDriver
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.workload import diverse_workload, hpo_workload, read_paper_jobs
from bftrainer.trainers.learned_curve import (
    MEASURED,
    PRIOR,
    Measurements,
    learned_curve,
    point_sources,
)
from tests.shared_data import SHARED

TIMING = ("wall_s", "events_per_s", "mean_solve_s")


def small() -> tuple[Trace, list[JobSpec]]:
    trace = synthetic_trace(SyntheticConfig(nodes=128, duration_s=4 * 3600, seed=1))
    return trace, hpo_workload(40, trace.start_s, interval_s=300.0)


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in TIMING}


@dataclass(frozen=True)
class Watching(Admission):
    """The real policy, recording every curve it was given."""

    inner: Policy
    seen: list[tuple[str, tuple[tuple[float, float], ...], int]]

    @property
    def name(self) -> str:
        return self.inner.name

    def decide(self, inputs: PolicyInputs) -> Decision:
        decision = self.inner.decide(inputs)
        for t in inputs.trainers:
            self.seen.append((t.id, t.curve("throughput"), len(decision.nodes.get(t.id, ()))))
        return decision


# ---- the rule ---------------------------------------------------------------------------
def test_nothing_measured_is_perfect_scaling_up_to_n_min() -> None:
    c = learned_curve({}, 2, 64, unmeasured_sps=100.0)
    assert c.points == ((2.0, 200.0), (64.0, 200.0))
    assert c.sources() == [PRIOR, PRIOR]


def test_one_point_scales_perfectly_up_to_twice_the_largest_count() -> None:
    c = learned_curve({4: 280.0}, 1, 64, unmeasured_sps=1.0)
    assert c.points == ((1.0, 70.0), (4.0, 280.0), (8.0, 560.0), (64.0, 560.0))
    assert c.sources() == [PRIOR, MEASURED, PRIOR, PRIOR]
    uncapped = learned_curve({4: 280.0}, 1, 64, unmeasured_sps=1.0, growth=math.inf)
    assert uncapped.points[-1] == (64.0, 280.0 * 16)


def test_more_points_extrapolate_what_they_show() -> None:
    # ShuffleNet's profile at 1, 4 and 16 nodes; its truth at 32 and 64 is 74,125 and 145,082.
    c = learned_curve(
        {1: 2831.0, 4: 9988.0, 16: 38895.3}, 1, 64, unmeasured_sps=1.0, growth=math.inf
    )
    assert [n for n, _ in c.points] == [1.0, 4.0, 16.0, 32.0, 64.0]
    assert c.points[3][1] == pytest.approx(74125.1, rel=0.03)
    assert c.points[4][1] == pytest.approx(145081.5, rel=0.03)
    assert c.sources() == [MEASURED, MEASURED, MEASURED, PRIOR, PRIOR]
    # Sub-linear points never extrapolate above perfect scaling from the last one.
    capped = learned_curve({2: 150.0, 4: 280.0}, 1, 64, unmeasured_sps=1.0)
    assert [n for n, _ in capped.points] == [1.0, 2.0, 4.0, 8.0, 64.0]
    assert 280.0 < capped.points[3][1] < 560.0 and capped.points[4] == (64.0, capped.points[3][1])


def test_noisy_close_counts_never_make_a_wild_curve() -> None:
    # 16 and 17 nodes, the second measured low: no growth can be told from them.
    c = learned_curve({16: 40000.0, 17: 38000.0}, 1, 64, unmeasured_sps=1.0, growth=math.inf)
    assert c.points[0] == (1.0, 2500.0)  # perfect scaling below the smallest count
    assert c.points[-1] == (64.0, pytest.approx(38000.0 * 64 / 17))
    # Points whose line would cross zero inside them fall back to a pure log fit.
    odd = learned_curve({2: 100.0, 8: 100.0}, 1, 64, unmeasured_sps=1.0, growth=math.inf)
    assert all(0 <= v <= 100.0 * 64 / 8 for _, v in odd.points)


def test_peers_points_fill_what_a_trainer_has_not_run() -> None:
    c = learned_curve(
        {2: 100.0}, 1, 64, unmeasured_sps=1.0, growth=2, prior_points={2: 90.0, 8: 380.0}
    )
    assert dict(c.points)[2.0] == 100.0 and dict(c.points)[8.0] == 380.0
    assert c.points[-2][0] == 16.0 and c.measured == frozenset({2})


def test_measurements_are_a_geometric_mean() -> None:
    m = Measurements()
    assert m.add(4, 100.0) and not m.add(4, 400.0)
    assert m.means() == {4: pytest.approx(200.0)}
    with pytest.raises(ValueError, match="rate > 0"):
        m.add(4, 0.0)
    assert point_sources([1.0, 2.5, 4.0], {4}) == [PRIOR, PRIOR, MEASURED]


# ---- the replay -------------------------------------------------------------------------
def test_known_is_the_default_and_the_replay_of_before() -> None:
    trace, jobs = small()
    for policy in ("milp", "equal"):
        base = ReplayConfig(policy=policy, solver="dp")
        a = replay(trace, jobs, base).summary
        b = replay(trace, jobs, replace(base, curves="known")).summary
        assert figures(a) == figures(b)
        assert not any(k.startswith("curves") or k == "measurements" for k in a)


TRACES = SHARED / "bftrainer-traces"


@pytest.mark.skipif(not TRACES.exists(), reason="needs ../shared/data/bftrainer-traces")
def test_known_curves_reproduce_the_documented_summit_figure() -> None:
    """docs/benchmarks.md: first 24 h of week 1, 1,024 nodes, milp at T_fwd 120 s: 0.91658
    (0.91641 before a cost could no longer take a trainer's progress below 0)."""
    data = TRACES
    jobs = read_paper_jobs(data / "hps-shufflenet-Jbnd-1000J.csv")
    from bftrainer.idle_monitor.trace import load_trace

    first = min(j.submit_s for j in jobs)
    trace = load_trace(
        data / "summit_week1_node_events.csv.gz", nodes=slice(0, 1024), end_s=first + 24 * 3600
    )
    config = ReplayConfig(policy="milp", solver="dp", t_fwd_s=120.0, curves="known")
    assert round(replay(trace, jobs, config).summary["utilization_efficiency"], 5) == 0.91658


@pytest.mark.parametrize("prior", ["optimistic", "profile", "peers"])
def test_the_policy_sees_measurements_and_priors_never_the_profile(prior: str) -> None:
    trace = synthetic_trace(SyntheticConfig(nodes=128, duration_s=4 * 3600, seed=1))
    jobs = diverse_workload(30, trace.start_s, seed=3)
    truth = {j.id: j for j in jobs}
    seen: list[Any] = []
    config = ReplayConfig(policy="milp", solver="dp", curves="learned", curves_prior=prior)
    result = replay(trace, jobs, config, policy=Watching(make_policy(config), seen))
    assert result.summary["measurements"] > 0 and result.summary["trainers_completed"] > 0
    noise = config.curves_noise
    grew = 0
    for tid, curve, _ in seen:
        assert curve != truth[tid].curve
        for n, v in curve:
            if n.is_integer() and v > 0:
                ratio = v / truth[tid].rate_sps(int(n))
                # A measured count is within 5 sigma of the truth; a prior may be anything.
                if abs(math.log(ratio)) <= 5 * noise:
                    grew += 1
    assert grew > 0
    # What the run reports as done is the truth's work, at the truth's rates.
    done = [t for t in result.trainers if t.finished_s is not None]
    assert all(t.progress_samples >= t.job.work_samples * (1 - 1e-9) for t in done)


def test_optimistic_growth_is_capped_at_twice_the_largest_count_run() -> None:
    trace, jobs = small()
    seen: list[Any] = []
    config = ReplayConfig(
        policy="milp", solver="dp", curves="learned", curves_prior="optimistic", curves_noise=0.0
    )
    replay(trace, jobs, config, policy=Watching(make_policy(config), seen))
    for _, curve, given in seen:
        measured = [n for n, v in curve if n.is_integer()]
        # The curve is flat from its cap on; the milp gives no node beyond a flat curve.
        flat_from = next(
            (curve[i][0] for i in range(1, len(curve)) if curve[i][1] <= curve[i - 1][1]),
            curve[-1][0],
        )
        assert given <= flat_from, (curve, given, measured)


def test_without_noise_a_measured_point_is_the_truth() -> None:
    trace, jobs = small()
    truth = {j.id: j for j in jobs}
    config = ReplayConfig(policy="milp", solver="dp", curves="learned", curves_noise=0.0)
    driver = LearningDriver(truth, config.learning_options)
    result = replay(trace, jobs, config, driver=driver)
    checked = 0
    for t in result.trainers:
        curve = driver.learned(t)
        for n, v in curve.points:
            if int(n) in curve.measured:
                assert v == pytest.approx(truth[t.id].rate_sps(int(n)), rel=1e-12)
                checked += 1
    assert checked > 10


def test_the_profile_probe_is_paid_and_measures_its_sizes() -> None:
    trace, jobs = small()
    truth = {j.id: j for j in jobs}
    config = ReplayConfig(policy="milp", solver="dp", curves="learned", curves_prior="profile")
    driver = LearningDriver(truth, config.learning_options)
    result = replay(trace, jobs, config, driver=driver)
    assert result.summary["probe_cost_samples"] > 0
    optimistic = replay(trace, jobs, replace(config, curves_prior="optimistic")).summary
    assert optimistic["probe_cost_samples"] == 0
    probed = [driver.learned(t).measured for t in result.trainers if t.started_s is not None]
    assert any({1, 4} <= m for m in probed)  # a first allocation of more than 4 probes 1 and 4


def test_peers_is_the_default_prior() -> None:
    """docs/benchmarks.md: peers gave the best U of the priors, so a learned replay
    without --prior uses it, and its summary says so."""
    assert ReplayConfig().curves_prior == "peers"
    trace, jobs = small()
    summary = replay(trace, jobs, ReplayConfig(policy="milp", solver="dp", curves="learned"))
    assert summary.summary["curves_prior"] == "peers"


def test_learned_replays_are_seeded() -> None:
    trace, jobs = small()
    config = ReplayConfig(policy="milp", solver="dp", curves="learned")
    a = figures(replay(trace, jobs, config).summary)
    assert a == figures(replay(trace, jobs, config).summary)
    other = figures(replay(trace, jobs, replace(config, curves_seed=1)).summary)
    assert other["utilization_efficiency"] != a["utilization_efficiency"]


def test_cli_curves_learned_and_bad_combinations(tmp_path: Any) -> None:
    runner = CliRunner()
    args = ["replay", "--synthetic-nodes", "64", "--synthetic-hours", "2", "--jobs-count", "20"]
    ok = runner.invoke(
        cli_main,
        [
            *args,
            "--policy",
            "milp",
            "--solver",
            "dp",
            "--curves",
            "learned",
            "--prior",
            "profile",
            "--out",
            str(tmp_path / "a"),
            "--no-progress",
        ],
    )
    assert ok.exit_code == 0, ok.output
    text = (tmp_path / "a" / "summary.json").read_text()
    assert '"curves_prior": "profile"' in text and '"probe_cost_samples"' in text
    bad = runner.invoke(
        cli_main,
        [*args, "--policy", "scavenger", "--curves", "learned", "--out", str(tmp_path / "b")],
    )
    assert bad.exit_code == 2 and "--curves learned" in bad.output
    assert "Traceback" not in bad.output
    slots = runner.invoke(
        cli_main,
        [*args, "--slots-per-node", "2", "--curves", "learned", "--out", str(tmp_path / "c")],
    )
    assert slots.exit_code == 2 and "whole nodes" in slots.output, slots.output


def test_learning_from_a_configuration_file(tmp_path: Any) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[replay]\ncurves = "learned"\ncurves_prior = "peers"\ncurves_growth = 1e9\n')
    args = ["replay", "--synthetic-nodes", "64", "--synthetic-hours", "2", "--jobs-count", "20"]
    args += ["--policy", "milp", "--solver", "dp", "--no-progress"]
    ok = CliRunner().invoke(cli_main, [*args, "--config", str(good), "--out", str(tmp_path / "a")])
    assert ok.exit_code == 0, ok.output
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert (summary["curves_prior"], summary["curves_growth"]) == ("peers", 1e9)  # no cap
    bad = tmp_path / "bad.toml"
    bad.write_text('[replay]\ncurves = "learned"\ncurves_noise = "a"\n')
    out = CliRunner().invoke(cli_main, [*args, "--config", str(bad), "--out", str(tmp_path / "b")])
    assert out.exit_code == 2 and "curves_noise" in out.output and "Traceback" not in out.output
