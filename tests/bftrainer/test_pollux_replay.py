"""The Pollux-profiled replay: hand-checked progress on a tiny profile, then the real data.

The tiny profile ("toy") has step times 1.0 s (1 node, local batch 10), 2.0 s (1 node,
20) and 1.5 s (2 nodes, 10 each); M0 = 10, two epochs of 100 base-batch steps each with
|g|^2 = 1 and variance at M0 of 1, then 3. Pollux's gain (var + sqr) / (var / scale + sqr)
is then 1 at M = 10, 4/3 at M = 20 in epoch 1 and 1.6 in epoch 2.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.trace import Trace
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.pollux.app import PolluxJob, SimApp, sim_app
from bftrainer.replay.pollux.output import completion_summary, write_pollux_outputs
from bftrainer.replay.pollux.sim import PolluxDriverFactory, PolluxSimDriver, PolluxSimOptions
from bftrainer.replay.pollux.workload import (
    APPLICATIONS,
    PolluxWorkloadError,
    generate_pollux_workload,
    make_job,
    read_pollux_workload,
    resolve_data_dir,
    resolve_workload_path,
)
from bftrainer.replay.run import ReplayConfig, ReplayResult, replay
from bftrainer.trainers.efficiency import step_gain
from bftrainer.trainers.pollux_profiles import load_profile
from tests.shared_data import SHARED

POLLUX = SHARED / "pollux-sim"
needs_data = pytest.mark.skipif(
    not (POLLUX / "traces").is_dir(), reason=f"Pollux data not found at {POLLUX}"
)
EXACT = PolluxSimOptions(batch_adapt=False, noise=0.0)


# --------------------------------------------------------------------------- fixtures
def write_toy(root: Path, apps: tuple[str, ...] = ("toy",), epoch: int = 100) -> Path:
    """The tiny profile of the module docstring, under ``root/traces/<app>/``, with
    epochs of ``epoch`` base-batch steps."""
    for name in apps:
        d = root / "traces" / name
        d.mkdir(parents=True)
        (d / "placements.csv").write_text(
            "placement,local_bsz,step_time,sync_time\n"
            "1,10,1.0,0.0\n1,20,2.0,0.0\n"
            "11,10,1.5,0.5\n11,20,2.5,0.5\n"
            "2,10,1.2,0.2\n2,20,2.2,0.2\n"
        )
        (d / "scalability.csv").write_text(
            "num_nodes,num_replicas,local_bsz,step_time,sync_time\n"
            "4,4,10,2.0,1.0\n4,4,20,3.0,1.0\n4,8,10,3.0,2.0\n4,8,20,4.0,2.0\n"
        )
        for batch in (10, 40):
            (d / f"validation-{batch}.csv").write_text(
                "progress,iteration,metric,grad_sqr,grad_var\n"
                f"{epoch},{epoch},0.5,1.0,1.0\n{2 * epoch},{2 * epoch},0.6,1.0,3.0\n"
            )
    return root


def pool_trace(nodes: int, end_s: float = 2000.0, events: tuple[PoolEvent, ...] = ()) -> Trace:
    names = tuple(f"n{i}" for i in range(8))
    return Trace(
        nodes=names,
        initial_idle=frozenset(names[:nodes]),
        start_s=0.0,
        end_s=end_s,
        events=events,
    )


def toy_job(
    data: Path, local_bsz: int, *, jid: str = "j", submit_s: float = 0.0, up_s: float = 0.0
) -> tuple[JobSpec, PolluxJob]:
    return make_job(
        jid,
        sim_app("toy", data),
        submit_s,
        local_bsz,
        rescale_up_s=up_s,
        rescale_down_s=0.0,
    )


def run(
    data: Path,
    trace: Trace,
    jobs: list[tuple[JobSpec, PolluxJob]],
    options: PolluxSimOptions = EXACT,
    config: ReplayConfig | None = None,
) -> tuple[ReplayResult, PolluxSimDriver]:
    driver = PolluxSimDriver({s.id: j for s, j in jobs}, data, options)
    result = replay(
        trace, [s for s, _ in jobs], config or ReplayConfig(policy="equal"), driver=driver
    )
    return result, driver


# --------------------------------------------------------------------------- the truth
def test_the_toy_profile_gains_are_pollux_formula(tmp_path: Path) -> None:
    app = sim_app("toy", write_toy(tmp_path))
    assert app.limits.base_batch_size == 10 and app.limits.max_batch_size == 40
    assert app.target_progress == 200.0
    assert app.stats(10, app.segment(0.0)).gain == pytest.approx(1.0)
    assert app.stats(20, app.segment(50.0)).gain == pytest.approx(4 / 3)
    assert app.stats(20, app.segment(150.0)).gain == pytest.approx(1.6)
    assert app.stats(40, app.segment(150.0)).gain == pytest.approx(16 / 7)
    # steps to the target at M = 20 from progress 50: 50 / (4/3) + 100 / 1.6
    assert app.steps_to_target(20, 50.0) == pytest.approx(37.5 + 62.5)


def test_a_pass_over_the_data_is_counted_in_samples_as_the_live_sampler_counts(
    tmp_path: Path,
) -> None:
    """The re-tune cadence's epoch is a pass over the data set's samples (the base
    batch's first epoch: 100 steps of 10), which a large batch ends in less progress
    than an epoch of the profile's."""
    app = sim_app("toy", write_toy(tmp_path))
    assert app.samples_per_pass == 1000
    assert [app.passes(s) for s in (0, 999, 1000, 2500)] == [0, 0, 1, 2]
    progress_of_a_pass_at_40 = 25 * app.stats(40, app.segment(0.0)).gain
    assert app.segment(progress_of_a_pass_at_40) == 0  # the profile's epoch is not over


def test_a_fixed_local_batch_scales_weakly_and_accumulates_to_m0(tmp_path: Path) -> None:
    app = sim_app("toy", write_toy(tmp_path))
    c = app.config(2, 10)
    assert (c.nodes, c.replicas, c.local_bsz, c.accum_steps, c.batch_size) == (2, 2, 10, 0, 20)
    assert app.step_time(c) == (1.5, False)
    # below the smallest local batch measured: raised to it
    c = app.config(1, 5)
    assert (c.local_bsz, c.accum_steps, c.batch_size) == (10, 0, 10)
    # 30 per replica exceeds max_local_bsz 20: two micro-steps of 15
    c = app.config(1, 30)
    assert (c.local_bsz, c.accum_steps, c.batch_size) == (15, 1, 30)
    # step time with accumulation: one more compute pass (Pollux: step + s (step - sync))
    c = app.config(1, 40)
    assert (c.local_bsz, c.accum_steps, c.batch_size) == (20, 1, 40)
    assert app.step_time(c)[0] == pytest.approx(2.0 + 1 * (2.0 - 0.0))
    # 2 x 40 = 80 > M_max 40: no accumulation first
    c = app.config(2, 40)
    assert (c.local_bsz, c.accum_steps, c.batch_size) == (20, 0, 40)
    # 4 nodes x 20 = 80 > M_max 40: the local batch shrinks to 10
    c = app.config(4, 20)
    assert (c.local_bsz, c.batch_size) == (10, 40)


def test_the_prior_curve_is_the_true_throughput_at_the_base_batch(tmp_path: Path) -> None:
    spec, job = toy_job(write_toy(tmp_path), 20)
    assert spec.n_max == 4  # measured up to 4 nodes; 4 x 10 = M_max
    assert spec.curve[0] == (1.0, 10.0)  # M0 = 10 samples in 1.0 s
    assert spec.curve[1] == (2.0, pytest.approx(20 / 1.5))  # 10 per replica on 2 nodes
    assert spec.work_samples == 200 * 10  # target progress x M0
    assert job == PolluxJob("toy", 20, 1)


def test_with_two_replicas_per_node_a_node_is_valued_on_the_packed_placement(
    tmp_path: Path,
) -> None:
    """Two replicas on one node sync within it (placement "2": 1.2 s a step), faster
    than on two nodes ("11": 1.5 s); the prior curve is per node count."""
    data = write_toy(tmp_path)
    spec, job = make_job("j", sim_app("toy", data, 2), 0.0, 10)
    assert spec.n_max == 2  # 2 nodes x 2 replicas x 10 = M_max 40
    assert spec.curve[0] == (1.0, pytest.approx(20 / 1.2))
    assert job.replicas_per_node == 2


# --------------------------------------------------------------------------- progress
def test_one_node_base_batch_completes_at_the_target_by_hand(tmp_path: Path) -> None:
    data = write_toy(tmp_path)
    result, driver = run(data, pool_trace(1), [toy_job(data, 10)])
    t = result.trainers[0]
    assert t.finished_s == pytest.approx(200.0)  # one base step per second, 200 to go
    assert t.processed_samples == pytest.approx(2000.0)
    report = driver.report()
    assert report.trainers["j"]["efficiency"] == pytest.approx(1.0)
    assert report.summary["statistical_efficiency"] == pytest.approx(1.0)


def test_a_larger_batch_completes_per_epoch_statistics_by_hand(tmp_path: Path) -> None:
    data = write_toy(tmp_path)
    result, driver = run(data, pool_trace(1), [toy_job(data, 20)])
    # epoch 1: 100 / (4/3 per 2 s) = 150 s; epoch 2: 100 / (1.6 per 2 s) = 125 s
    assert result.trainers[0].finished_s == pytest.approx(275.0)
    row = driver.report().trainers["j"]
    # efficiency gain * M0 / M: 2/3 for 150 s, 0.8 for 125 s
    assert row["efficiency"] == pytest.approx((150 * 2 / 3 + 125 * 0.8) / 275)
    assert row["statistical_samples"] == pytest.approx(200 * 10)
    assert row["samples_processed"] == pytest.approx(275 * 10)


def test_a_rescale_costs_r_up_seconds_of_progress_and_samples(tmp_path: Path) -> None:
    data = write_toy(tmp_path)
    trace = pool_trace(1, events=(PoolEvent(50.0, joined=frozenset({"n1"})),))
    result, _ = run(data, trace, [toy_job(data, 10, up_s=5.0)])
    t = result.trainers[0]
    # at 50 s: progress 50, minus 5 s x 1 base step/s = 45; then 2 nodes (M = 20, 1.5 s):
    # 55 / (4/3 / 1.5) = 61.875 s, then 100 / (1.6 / 1.5) = 93.75 s
    assert t.rescale_cost_samples == pytest.approx(5.0 * 10.0)
    assert t.finished_s == pytest.approx(50 + 61.875 + 93.75)


def test_a_preempted_trainer_pays_r_down_and_pauses_without_nodes(tmp_path: Path) -> None:
    data = write_toy(tmp_path)
    trace = pool_trace(
        1,
        events=(
            PoolEvent(40.0, left=frozenset({"n0"})),
            PoolEvent(100.0, joined=frozenset({"n0"})),
        ),
    )
    spec, job = make_job("j", sim_app("toy", data), 0.0, 10, rescale_down_s=4.0)
    result, _ = run(data, trace, [(spec, job)])
    t = result.trainers[0]
    assert t.preemption_cost_samples == pytest.approx(4.0 * 10.0)
    # 40 base steps done, 4 lost, idle 40..100, then 164 to go at 1 per second
    assert t.finished_s == pytest.approx(100 + 164)


def test_completion_times_land_between_events_and_jobs_queue(tmp_path: Path) -> None:
    data = write_toy(tmp_path)
    jobs = [toy_job(data, 10, jid="a"), toy_job(data, 10, jid="b", submit_s=10.0)]
    result, _ = run(data, pool_trace(1), jobs, config=ReplayConfig(policy="equal", max_trainers=1))
    done = {t.id: t.finished_s for t in result.trainers}
    assert done == {"a": pytest.approx(200.0), "b": pytest.approx(400.0)}
    s = completion_summary(result.trainers, 400.0)
    assert s["jobs_completed"] == 2
    assert s["mean_jct_s"] == pytest.approx((200 + 390) / 2)
    assert s["max_jct_s"] == pytest.approx(390.0)


# --------------------------------------------------------------------------- the trainer's model
def test_the_trainer_reports_curves_from_its_own_fit(tmp_path: Path) -> None:
    data = write_toy(tmp_path)
    spec, job = toy_job(data, 10)
    driver = PolluxSimDriver({"j": job}, data, EXACT)
    result = replay(pool_trace(2, end_s=60.0), [spec], ReplayConfig(policy="equal"), driver=driver)
    t = result.trainers[0]
    goodput, throughput = t.reported_curves["goodput"], t.reported_curves["throughput"]
    assert goodput[-1][0] == throughput[-1][0] == spec.n_max
    # it ran 2 nodes x 10 (M = 20, 1.5 s), observed exactly (noise 0): its throughput there
    assert dict(throughput)[2.0] == pytest.approx(20 / 1.5, rel=1e-3)
    # goodput = throughput x efficiency with its measured noise scale, phi = 1 x 10 / 1
    assert dict(goodput)[2.0] == pytest.approx(20 / 1.5 * (10 + 10) / (10 + 20), rel=1e-3)
    # exploration cap: twice the 2 nodes seen, flat beyond
    assert goodput[-1][1] == pytest.approx(dict(goodput)[4.0])
    assert driver.report().trainers["j"]["refits"] == 1
    # What it saw is the real agent's: its steps, its means, its record's curve.
    agent = driver._trainers["j"].agent
    [seen] = agent.observations()
    assert (seen.nodes, seen.local_bsz, seen.step_time_s) == (2, 10, pytest.approx(1.5))
    assert agent.steps == pytest.approx(driver.report().trainers["j"]["steps"])
    assert agent.metrics(refit=False).goodput_model().curve(1, spec.n_max)[1][1] == (
        pytest.approx(dict(goodput)[2.0])
    )


def test_batch_adaptation_explores_then_settles_on_the_truly_best_batch(tmp_path: Path) -> None:
    """Epochs of 5,000 steps, so the smoothed noise scale follows epoch 2's (phi 10 -> 30)."""
    data = write_toy(tmp_path, epoch=5000)
    spec, job = toy_job(data, 10)
    driver = PolluxSimDriver({"j": job}, data, PolluxSimOptions(batch_adapt=True, noise=0.0))
    result = replay(
        pool_trace(1, end_s=20000.0), [spec], ReplayConfig(policy="equal"), driver=driver
    )
    row = driver.report().trainers["j"]
    # Fitted on local batch 10 alone, the model thinks larger batches cost less per sample
    # than they do (Pollux's prior, alpha_grad = half the step), so once phi grows in
    # epoch 2 it tries one; having run it, it learns the step is linear in the batch
    # (no fixed cost) and goes back to 10, the truly best here.
    assert row["configs_run"] == 2
    assert row["refits"] == 2
    assert row["reports"] > 10  # on its timer (60 s), not only at the few events
    assert len(result.metrics.steps) > 10  # the loop woke it up to re-pick
    tr = driver._trainers["j"]
    assert tr.config is not None and tr.config.local_bsz == 10
    assert tr.agent.model is not None
    assert float(tr.agent.model.step_time_s(1, 1, 20)) == pytest.approx(2.0, rel=1e-2)


def test_the_simulated_trainer_retunes_on_the_live_cadence_and_pays_for_it(
    tmp_path: Path,
) -> None:
    """The live runtime's cadence (trainers/retune_cadence.py), imported: in one long
    epoch a decision every minute at first, twice as far apart after each decision to
    stay, far fewer than the reports; each one charged ``retune_cost_s`` of training."""
    data = write_toy(tmp_path, epoch=5000)
    spec, job = toy_job(data, 10)
    options = PolluxSimOptions(batch_adapt=True, noise=0.0, retune_cost_s=0.5)
    _, driver = run(data, pool_trace(1, end_s=4000.0), [(spec, job)], options)
    row = driver.report().trainers["j"]
    assert 3 <= row["retune_decisions"] < row["reports"] / 2, row
    # 10 samples/s at either local batch of the toy (1 s per 10, 2 s per 20)
    assert row["retune_cost_samples"] == pytest.approx(row["retune_decisions"] * 0.5 * 10)
    assert driver.report().summary["retune_decisions"] == row["retune_decisions"]
    fixed = PolluxSimOptions(batch_adapt=False, noise=0.0)
    _, driver = run(data, pool_trace(1, end_s=4000.0), [toy_job(data, 10)], fixed)
    assert driver.report().trainers["j"]["retune_decisions"] == 0


@pytest.mark.parametrize(("start", "local_bsz"), [("user", 20), ("pollux", 10)])
def test_an_adapting_trainer_starts_at_the_users_batch_or_pollux_rule(
    tmp_path: Path, start: str, local_bsz: int
) -> None:
    """Before its first fit (60 s) it runs the user's batch per replica, what it would
    keep without adaptation; Pollux's rule is the smallest batch >= M0 (10 here)."""
    data = write_toy(tmp_path)
    spec, job = toy_job(data, 20)
    options = PolluxSimOptions(batch_adapt=True, noise=0.0, start_batch=start)
    _, driver = run(data, pool_trace(1, end_s=30.0), [(spec, job)], options)
    config = driver._trainers["j"].config
    assert config is not None and config.local_bsz == local_bsz
    with pytest.raises(ValueError, match="start_batch"):
        PolluxSimOptions(start_batch="largest")


def test_the_simulated_agent_sees_the_noise_scale_of_the_epoch_under_way(
    tmp_path: Path,
) -> None:
    """The toy's noise scale triples at epoch 2 (100 base-batch steps). Fed exact
    statistics, the agent follows at once; the library's smoothing for noisy real
    estimates (0.999 per base-batch step) would still be near epoch 1's value."""
    data = write_toy(tmp_path)
    spec, job = toy_job(data, 10)
    pgns = {}
    for smoothing in (0.0, 0.999):
        options = PolluxSimOptions(batch_adapt=False, noise=0.0, gns_smoothing=smoothing)
        _, driver = run(data, pool_trace(1, end_s=150.0), [(spec, job)], options)
        pgns[smoothing] = driver._trainers["j"].agent.pgns
    truth = load_profile("toy", data).grad_stats(10, 150.0).pgns
    assert pgns[0.0] == pytest.approx(truth)
    assert pgns[0.999] < 0.6 * truth


def test_same_seed_same_replay_other_seed_other_noise(tmp_path: Path) -> None:
    data = write_toy(tmp_path)
    jobs = [toy_job(data, 10, jid=f"j{i}", submit_s=5.0 * i) for i in range(3)]
    trace = pool_trace(
        4, events=(PoolEvent(30.0, left=frozenset({"n3"})), PoolEvent(90.0, joined={"n3"}))
    )
    opts = PolluxSimOptions(batch_adapt=True, noise=0.1, seed=1)
    config = ReplayConfig(policy="milp", objective="goodput", solver="dp")
    a = run(data, trace, jobs, opts, config)[1].report()
    b = run(data, trace, jobs, opts, config)[1].report()
    c = run(data, trace, jobs, PolluxSimOptions(batch_adapt=True, noise=0.1, seed=2), config)
    assert a == b
    assert a.trainers != c[1].report().trainers


def test_the_efficiency_series_adds_up_to_the_trainers(tmp_path: Path) -> None:
    data = write_toy(tmp_path)
    jobs = [toy_job(data, 20, jid="a"), toy_job(data, 10, jid="b", submit_s=100.0)]
    options = PolluxSimOptions(batch_adapt=False, noise=0.0, series_bin_s=60.0)
    result, driver = run(data, pool_trace(2), jobs, options)
    rep = driver.report()
    assert sum(r["samples_processed"] for r in rep.series) == pytest.approx(
        sum(t.processed_samples for t in result.trainers)
    )
    assert sum(r["statistical_samples"] for r in rep.series) == pytest.approx(2 * 200 * 10)
    assert [r["hours"] for r in rep.series[:2]] == [0.0, pytest.approx(60 / 3600)]
    assert all(0 < r["efficiency_mean"] <= 1 for r in rep.series if r["efficiency_mean"])
    write_pollux_outputs(result.trainers, rep, tmp_path / "out")
    with (tmp_path / "out" / "efficiency.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(rep.series) and rows[0]["efficiency_samples"]
    with (tmp_path / "out" / "pollux_trainers.csv").open() as f:
        trainers = {r["id"]: r for r in csv.DictReader(f)}
    assert float(trainers["a"]["jct_s"]) == pytest.approx(result.trainers[0].finished_s)
    assert (tmp_path / "out" / "efficiency.png").read_bytes().startswith(b"\x89PNG")


def test_the_factory_makes_independent_drivers(tmp_path: Path) -> None:
    data = write_toy(tmp_path)
    spec, job = toy_job(data, 10)
    factory = PolluxDriverFactory((("j", job),), data, EXACT)
    r1 = replay(pool_trace(1), [spec], ReplayConfig(policy="equal"), driver=factory())
    r2 = replay(pool_trace(1), [spec], ReplayConfig(policy="equal"), driver=factory())
    assert r1.trainers[0].finished_s == r2.trainers[0].finished_s == pytest.approx(200.0)


# --------------------------------------------------------------------------- workloads
def test_a_pollux_workload_file_sets_batch_per_replica_and_times(tmp_path: Path) -> None:
    data = write_toy(tmp_path / "data", APPLICATIONS)
    path = tmp_path / "w.csv"
    path.write_text(
        "name,time,application,num_replicas,batch_size\n"
        "b-1,30,bert,2,40\ncifar10-0,10,cifar10,1,10\n"
    )
    w = read_pollux_workload(path, resolve_data_dir(data), 1000.0)
    assert [j.id for j in w.jobs] == ["cifar10-0", "b-1"]
    assert [j.submit_s for j in w.jobs] == [1010.0, 1030.0]
    assert w.apps["b-1"] == PolluxJob("bert", 20, 1)
    assert w.jobs[1].model == "bert"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("name,time\nx,1\n", "w.csv:1: missing column 'application'"),
        ("name,time,application,num_replicas,batch_size\nx,1,gpt,1,8\n", "w.csv:2: application"),
        ("name,time,application,num_replicas,batch_size\nx,soon,ncf,1,8\n", "w.csv:2: time"),
        ("name,time,application,num_replicas,batch_size\nx,1,ncf,0,8\n", "num_replicas is '0'"),
        (
            "name,time,application,num_replicas,batch_size\nx,1,ncf,1,8\nx,2,ncf,1,8\n",
            "w.csv:3: job 'x' appears twice",
        ),
        ("name,time,application,num_replicas,batch_size\n", "w.csv: no jobs"),
    ],
)
def test_bad_workload_files_name_file_line_and_value(
    tmp_path: Path, body: str, message: str
) -> None:
    data = write_toy(tmp_path / "data", APPLICATIONS)
    path = tmp_path / "w.csv"
    path.write_text(body)
    with pytest.raises(PolluxWorkloadError, match=message.replace("(", r"\(")):
        read_pollux_workload(path, data, 0.0)


def test_the_generator_cycles_the_six_applications(tmp_path: Path) -> None:
    data = write_toy(tmp_path, APPLICATIONS)
    w = generate_pollux_workload(8, 100.0, data, mean_interarrival_s=60.0, seed=3)
    assert [w.apps[j.id].app for j in w.jobs] == [*APPLICATIONS, *APPLICATIONS[:2]]
    assert w.jobs[0].submit_s == 100.0
    assert all(a.submit_s < b.submit_s for a, b in zip(w.jobs, w.jobs[1:], strict=False))
    assert all(w.apps[j.id].local_bsz == 10 for j in w.jobs)  # the base batch per replica


def test_data_folder_and_workload_names_resolve_or_say_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(PolluxWorkloadError, match="no Pollux data there"):
        resolve_data_dir(tmp_path / "nowhere")
    partial = write_toy(tmp_path / "partial", ("cifar10",))
    with pytest.raises(PolluxWorkloadError, match="no profile for imagenet"):
        resolve_data_dir(partial)
    data = write_toy(tmp_path / "data", APPLICATIONS)
    (data / "workloads").mkdir()
    (data / "workloads" / "workload-3.csv").write_text("x")
    assert resolve_workload_path("3", data) == data / "workloads" / "workload-3.csv"
    assert resolve_workload_path("workloads/workload-3.csv", data).is_file()
    with pytest.raises(PolluxWorkloadError, match="no such file"):
        resolve_workload_path("9", data)


# --------------------------------------------------------------------------- the CLI
def write_trace(path: Path, nodes: int, end_s: int) -> Path:
    rows = ["time,node,idle"] + [f"0,n{i},1" for i in range(nodes)] + [f"{end_s},n0,1"]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cli_pollux_replay_writes_the_efficiency_outputs(tmp_path: Path) -> None:
    data = write_toy(tmp_path / "data", APPLICATIONS)
    trace = write_trace(tmp_path / "trace.csv", 4, 3000)
    out = tmp_path / "out"
    args = ["replay", str(trace), "--workload", "pollux", "--pollux-data", str(data)]
    args += ["--jobs-count", "6", "--interval", "20", "--objective", "goodput", "--solver", "dp"]
    args += ["--policy", "milp,equal", "--no-progress", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "mean JCT" in result.output
    runs = json.loads((out / "summary.json").read_text())["runs"]
    for r in runs:
        assert r["jobs_completed"] == 6
        assert 0 < r["mean_statistical_efficiency"] <= 1
        assert r["mean_jct_s"] > 0 and r["p95_jct_s"] >= r["median_jct_s"]
    for name in ("efficiency.csv", "pollux_trainers.csv", "efficiency.png"):
        assert (out / "milp-tfwdauto" / name).stat().st_size > 0
    assert (out / "efficiency.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "pollux", "--pollux-data", "/nowhere"], "/nowhere (--pollux-data)"),
        (["--pollux-workload", "1"], "--pollux-workload needs --workload pollux"),
        (["--replicas-per-node", "4"], "--replicas-per-node needs --workload pollux"),
        (["--workload", "pollux", "--replicas-per-node", "0"], "--replicas-per-node"),
    ],
)
def test_cli_pollux_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    trace = write_trace(tmp_path / "trace.csv", 2, 100)
    result = CliRunner().invoke(
        cli, ["replay", str(trace), *args, "--no-progress", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_cli_replicas_per_node_runs_each_job_on_r_replicas_per_node(tmp_path: Path) -> None:
    """Two replicas per node: the profile's (n, 2n) configurations, so the same jobs on
    the same two nodes finish sooner than with one replica per node."""
    data = write_toy(tmp_path / "data", APPLICATIONS)
    trace = write_trace(tmp_path / "trace.csv", 2, 20000)
    jct = {}
    for r in (1, 2):
        out = tmp_path / f"out{r}"
        args = ["replay", str(trace), "--workload", "pollux", "--pollux-data", str(data)]
        args += ["--jobs-count", "3", "--interval", "0", "--no-batch-adapt", "--policy", "equal"]
        args += ["--replicas-per-node", str(r), "--no-progress", "--out", str(out)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["jobs_completed"] == 3
        jct[r] = summary["mean_jct_s"]
    assert jct[2] < jct[1]
    w = generate_pollux_workload(2, 0.0, data, replicas_per_node=2)
    assert all(job.replicas_per_node == 2 for job in w.apps.values())


def test_cli_pollux_missing_workload_number_names_the_file(tmp_path: Path) -> None:
    data = write_toy(tmp_path / "data", APPLICATIONS)
    trace = write_trace(tmp_path / "trace.csv", 2, 100)
    args = ["replay", str(trace), "--workload", "pollux", "--pollux-data", str(data)]
    result = CliRunner().invoke(cli, [*args, "--pollux-workload", "7", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "workload-7.csv" in result.output


# --------------------------------------------------------------------------- real profiles
@needs_data
@pytest.mark.data
def test_real_gains_match_pollux_formula_on_the_raw_rows() -> None:
    app = sim_app("cifar10", POLLUX)
    with (POLLUX / "traces" / "cifar10" / "validation-1024.csv").open() as f:
        first = next(csv.DictReader(f))
    sqr, var = float(first["grad_sqr"]), float(first["grad_var"])
    scale = 1024 / 128
    pollux = (var + sqr) / (var / scale + sqr)
    assert app.stats(1024, app.segment(1.0)).gain == pytest.approx(pollux)
    assert step_gain(1024, 128, var * 128 / sqr) == pytest.approx(pollux)


@needs_data
@pytest.mark.data
def test_every_real_application_has_limits_a_node_range_and_a_target() -> None:
    for name in APPLICATIONS:
        app = SimApp(load_profile(name, POLLUX))
        assert app.max_nodes == 16
        assert app.target_progress > 0
        for n in (1, 5, 16):  # measured, interpolated, largest
            config = app.default_config(n)
            step_s, _ = app.step_time(config)
            assert 0 < step_s < 60, (name, n)
    assert sim_app("yolov3", POLLUX).limits.max_local_bsz == 8  # Pollux's memory bound
    # ncf: 32 per replica on one GPU is below M0 = 256: 8 micro-steps reach it
    c = sim_app("ncf", POLLUX).config(1, 32)
    assert (c.local_bsz, c.accum_steps, c.batch_size) == (32, 7, 256)


@needs_data
@pytest.mark.data
def test_real_workload_one_reads_with_its_mix_of_applications() -> None:
    w = read_pollux_workload(POLLUX / "workloads" / "workload-1.csv", POLLUX, 0.0)
    counts = {a: sum(1 for j in w.apps.values() if j.app == a) for a in APPLICATIONS}
    assert counts == {
        "ncf": 68,
        "cifar10": 66,
        "deepspeech2": 12,
        "bert": 7,
        "imagenet": 4,
        "yolov3": 3,
    }
    assert w.apps["cifar10-0"].local_bsz == math.ceil(2048 / 6)


@needs_data
@pytest.mark.data
def test_real_applications_train_to_completion_on_a_steady_pool() -> None:
    """One job of each fast application on 16 steady nodes: all finish, goodput-driven."""
    w = generate_pollux_workload(4, 0.0, POLLUX, mean_interarrival_s=0.0)
    keep = [j for j in w.jobs if j.model in ("cifar10", "ncf")]
    apps = {j.id: w.apps[j.id] for j in keep}
    names = tuple(f"n{i}" for i in range(16))
    trace = Trace(names, frozenset(names), 0.0, 4 * 3600.0, ())
    driver = PolluxSimDriver(apps, POLLUX, PolluxSimOptions(batch_adapt=True))
    config = ReplayConfig(policy="milp", objective="goodput", solver="dp")
    result = replay(trace, keep, config, driver=driver)
    assert all(t.finished_s is not None for t in result.trainers)
    rep = driver.report()
    for row in rep.trainers.values():
        assert row["progress"] == row["target_progress"]
        assert 0 < row["efficiency"] <= 1
        assert row["refits"] >= 1 and row["model_error"] < 0.3
