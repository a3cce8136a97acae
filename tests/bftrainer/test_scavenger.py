"""The scavenger baseline: rigid jobs, first come first served, killed and requeued on
any departure of one of their nodes, losing the training since their last checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.idle_monitor.trace import Trace, load_trace
from bftrainer.loop import PolicyInputs, TrainerState
from bftrainer.loop.churn import Churn
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.registry import ScavengerPolicy, rigid_size
from bftrainer.replay.rigid import CheckpointRestartDriver, RigidJobError
from bftrainer.replay.run import ReplayConfig, ReplayError, replay
from bftrainer.replay.simulator import SimulatedDriver
from bftrainer.replay.workload import hpo_workload, read_paper_jobs
from tests.conftest import bftrainer
from tests.shared_data import SHARED

RATE_PER_NODE = 10.0
LINEAR = ((1.0, RATE_PER_NODE), (4.0, 4 * RATE_PER_NODE))


def job(jid: str = "j", n_max: int = 2, submit_s: float = 0.0, work: float = 1e12) -> JobSpec:
    return JobSpec(jid, "m", submit_s, 1, n_max, 30.0, 2.0, work, LINEAR)


def state(j: JobSpec, nodes: tuple[str, ...] = ()) -> TrainerState:
    return TrainerState(j, nodes=nodes)


def decide(pool: str, trainers: list[TrainerState], size: int | None = None) -> dict[str, str]:
    """The policy's node sets, each as one string of one-letter node names."""
    decision = ScavengerPolicy(size).decide(PolicyInputs(tuple(pool), trainers, Churn()))
    return {tid: "".join(nodes) for tid, nodes in decision.nodes.items()}


# ---- the policy -------------------------------------------------------------------------
def test_jobs_start_first_come_first_served_at_their_rigid_size() -> None:
    trainers = [state(job("a", 4)), state(job("b", 4)), state(job("c", 4))]
    assert decide("abcdefghij", trainers) == {"a": "abcd", "b": "efgh", "c": ""}


def test_the_head_of_the_queue_blocks_smaller_jobs_behind_it() -> None:
    trainers = [state(job("big", 4)), state(job("small", 1))]
    assert decide("abc", trainers) == {"big": "", "small": ""}


def test_a_running_job_keeps_its_nodes_and_never_grows() -> None:
    trainers = [state(job("a", 2), ("c", "d")), state(job("b", 4))]
    assert decide("abcdefgh", trainers) == {"a": "cd", "b": "abef"}


def test_a_job_that_lost_a_node_is_killed_and_requeued_at_its_place() -> None:
    # "a" held (c, d); d left. It goes first again: it restarts at its full size if the
    # pool has room, before "b", which arrived later.
    trainers = [state(job("a", 2), ("c",)), state(job("b", 2))]
    assert decide("abc", trainers) == {"a": "ab", "b": ""}
    assert decide("c", trainers) == {"a": "", "b": ""}


def test_the_scavenger_size_is_kept_within_each_jobs_limits() -> None:
    narrow = JobSpec("n", "m", 0.0, 2, 3, 1.0, 1.0, 1.0, LINEAR)
    assert [rigid_size(narrow, s) for s in (None, 1, 2, 3, 8)] == [3, 2, 2, 3, 3]
    assert decide("abcdef", [state(job("a", 4)), state(job("b", 4))], size=2) == {
        "a": "ab",
        "b": "cd",
    }


# ---- the driver: what a kill loses ------------------------------------------------------
def running(
    driver: CheckpointRestartDriver, j: JobSpec, nodes: tuple[str, ...], now_s: float
) -> TrainerState:
    """``j`` started on ``nodes`` at ``now_s``, as the loop would start it."""
    t = state(j)
    driver.advance([], now_s)
    driver.rescale(t, nodes)
    t.nodes = nodes
    return t


def test_a_kill_loses_exactly_the_training_since_the_last_checkpoint() -> None:
    driver = CheckpointRestartDriver(checkpoint_every_s=600.0, restart_s=50.0)
    t = running(driver, job(), ("a", "b"), 0.0)
    driver.advance([t], 1500.0)  # checkpoints at 600 and 1200 s
    assert t.progress_samples == pytest.approx(1500 * 20.0)
    t.nodes = ("a",)  # b left
    lost = driver.preempt(t, 2)
    assert lost == pytest.approx(300 * 20.0)
    assert t.progress_samples == pytest.approx(1200 * 20.0), "back to the last checkpoint"
    assert driver.preempt(t, 1) == 0.0, "a job is killed once"
    # Requeued, it restarts at 2000 s: 50 s of restart, then it trains again.
    driver.advance([], 2000.0)
    driver.rescale(t, ("c", "d"))
    t.nodes = ("c", "d")
    driver.advance([t], 2650.0)
    assert t.progress_samples == pytest.approx((1200 + 600) * 20.0)
    assert t.rescales == 1
    # A kill 100 s after the first checkpoint of the new run (at 2050 + 600 s).
    driver.advance([t], 2750.0)
    t.nodes = ("c",)
    assert driver.preempt(t, 2) == pytest.approx(100 * 20.0)
    w = driver.waste
    assert w.kills == 2
    assert w.lost_node_s == pytest.approx(2 * (300 + 100))
    assert w.restart_node_s == pytest.approx(2 * 50)


def test_a_kill_during_a_restart_loses_nothing_more() -> None:
    driver = CheckpointRestartDriver(checkpoint_every_s=600.0, restart_s=50.0)
    t = running(driver, job(), ("a", "b"), 0.0)
    driver.advance([t], 700.0)
    t.nodes = ("a",)
    driver.preempt(t, 2)  # back to 600 s of training
    driver.rescale(t, ())
    t.nodes = ()
    driver.rescale(t, ("a", "c"))
    t.nodes = ("a", "c")
    driver.advance([t], 730.0)
    t.nodes = ("a",)
    assert driver.preempt(t, 2) == 0.0
    assert t.progress_samples == pytest.approx(600 * 20.0)
    assert driver.waste.restart_node_s == pytest.approx(2 * 30)


def test_a_running_rigid_job_cannot_be_resized_or_moved() -> None:
    driver = CheckpointRestartDriver()
    t = running(driver, job(n_max=4), ("a", "b"), 0.0)
    for nodes in (("a", "b", "c"), ("a",), ("c", "d"), ()):
        with pytest.raises(RigidJobError, match="'j' runs on 2 nodes"):
            driver.rescale(t, nodes)


def test_the_next_completion_waits_for_the_restart() -> None:
    driver = CheckpointRestartDriver(checkpoint_every_s=600.0, restart_s=50.0)
    t = running(driver, job(work=20_000.0), ("a", "b"), 0.0)
    assert driver.next_wakeup_s([t], 0.0) == pytest.approx(1000.0)
    driver.advance([t], 700.0)
    t.nodes = ("a",)
    driver.preempt(t, 2)
    driver.rescale(t, ())
    driver.rescale(t, ("a", "b"))
    t.nodes = ("a", "b")
    # 12,000 samples kept; 8,000 left at 20/s after 50 s of restart.
    assert driver.next_wakeup_s([t], 700.0) == pytest.approx(750.0 + 400.0)


# ---- the replay -------------------------------------------------------------------------
def tiny_trace() -> Trace:
    """Pool {a,b} at 0; c joins at 100; a leaves at 200; ends at 300."""
    return Trace(
        nodes=("a", "b", "c", "d"),
        initial_idle=frozenset({"a", "b"}),
        start_s=0.0,
        end_s=300.0,
        events=(PoolEvent(100.0, joined=frozenset({"c"})), PoolEvent(200.0, left=frozenset({"a"}))),
    )


def test_every_scavenger_figure_of_a_tiny_trace_by_hand() -> None:
    config = ReplayConfig(policy="scavenger", checkpoint_every_s=150.0, restart_s=30.0)
    result = replay(tiny_trace(), [job(n_max=2)], config)
    s = result.summary
    # Runs on (a, b) from 0; a leaves at 200: killed, 50 s since the checkpoint at
    # 150 s lost; restarts at once on (b, c), 30 s of restart, trains 230..300.
    assert s["preemption_cost_samples"] == pytest.approx(50 * 20.0)
    assert s["rescale_cost_samples"] == 0.0
    assert s["samples_processed"] == pytest.approx(150 * 20.0 + 70 * 20.0)
    assert s["kills"] == 1
    assert s["lost_work_node_hours"] == pytest.approx(50 * 2 / 3600)
    assert s["restart_node_hours"] == pytest.approx(30 * 2 / 3600)
    assert s["wasted_node_hours"] == pytest.approx((50 + 30) * 2 / 3600)
    assert s["idle_node_hours"] == pytest.approx(100 / 3600)  # c, 100..200 s
    assert s["utilization_efficiency"] == pytest.approx(4400.0 / 7000.0)
    assert result.trainers[0].rescales == 1


@pytest.mark.parametrize("policy", ["milp", "equal"])
def test_elastic_policies_waste_their_rescale_and_preemption_stalls(policy: str) -> None:
    # The job grows 2 -> 3 at 100 s (R_up 30 s x 2 nodes) and is cut 3 -> 2 at 200 s
    # (R_dw 2 s x 3 nodes); every node of the pool is held throughout.
    config = ReplayConfig(policy=policy, t_fwd_s=1000.0)
    s = replay(tiny_trace(), [job(n_max=4)], config).summary
    assert s["wasted_node_hours"] == pytest.approx((30 * 2 + 2 * 3) / 3600)
    assert s["idle_node_hours"] == 0.0
    assert (s["kills"], s["lost_work_node_hours"], s["restart_node_hours"]) == (0, 0.0, 0.0)


class RecordingDriver(CheckpointRestartDriver):
    """The real driver, recording every start: (time, job, node count)."""

    def __init__(self) -> None:
        super().__init__(checkpoint_every_s=300.0)
        self.starts: list[tuple[float, str, int]] = []

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        if nodes:
            self.starts.append((self._now(), trainer.id, len(nodes)))
        return super().rescale(trainer, nodes)


@pytest.fixture(scope="module")
def synthetic_day() -> tuple[Trace, list[JobSpec]]:
    trace = synthetic_trace(SyntheticConfig(nodes=128, duration_s=12 * 3600.0, seed=3))
    return trace, hpo_workload(60, trace.start_s, n_max=8, interval_s=300.0)


@pytest.mark.parametrize("size", [None, 2])
def test_a_replayed_job_runs_only_at_its_rigid_size_and_starts_in_arrival_order(
    synthetic_day: tuple[Trace, list[JobSpec]], size: int | None
) -> None:
    trace, jobs = synthetic_day
    driver = RecordingDriver()
    config = ReplayConfig(policy="scavenger", scavenger_size=size, max_trainers=1000)
    result = replay(trace, jobs, config, driver=driver)
    expected = 8 if size is None else size
    assert driver.starts and {n for _, _, n in driver.starts} == {expected}
    # The driver refuses any resize of a running job, so the replay's end proves that
    # none happened; every kill was followed by a restart at the same size.
    assert result.summary["kills"] > 0
    first_start: dict[str, float] = {}
    for t_s, jid, _ in driver.starts:
        first_start.setdefault(jid, t_s)
    arrival_order = [j.id for j in jobs]
    started = [jid for jid in arrival_order if jid in first_start]
    assert started == arrival_order[: len(started)], "no job started before an earlier one"
    times = [first_start[jid] for jid in started]
    assert times == sorted(times), "first come, first served"


def test_scavenger_wastes_more_and_reaches_a_lower_u_than_milp_on_a_fluctuating_pool(
    synthetic_day: tuple[Trace, list[JobSpec]],
) -> None:
    trace, jobs = synthetic_day
    milp = replay(trace, jobs, ReplayConfig(policy="milp", solver="dp")).summary
    scav = replay(trace, jobs, ReplayConfig(policy="scavenger")).summary
    assert milp["utilization_efficiency"] > scav["utilization_efficiency"]
    assert milp["wasted_node_hours"] < scav["wasted_node_hours"]
    assert milp["kills"] == 0 and milp["lost_work_node_hours"] == 0.0
    # Every node-hour of the pool is idle, wasted, or kept training.
    for s in (milp, scav):
        assert 0 <= s["idle_node_hours"] <= s["resource_integral_node_hours"]


def test_the_scavenger_policy_refuses_an_elastic_driver() -> None:
    with pytest.raises(ReplayError, match="checkpoint-restart driver, not SimulatedDriver"):
        replay(tiny_trace(), [job()], ReplayConfig(policy="scavenger"), driver=SimulatedDriver())


# ---- the command line -------------------------------------------------------------------


def test_cli_prints_scavenger_beside_milp_and_equal(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = bftrainer(
        "replay",
        "--synthetic-nodes", "64",
        "--synthetic-hours", "4",
        "--jobs-count", "30",
        "--policy", "milp,equal,scavenger",
        "--solver", "dp",
        "--scavenger-size", "4",
        "--checkpoint-every", "300",
        "--restart-cost", "45",
        "--no-progress",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0]
    assert "milp" in header and "equal" in header and "scavenger size=4" in header
    for row in ("U (A_e / A_s)", "mean JCT, done (h)", "wasted node-hours", "idle node-hours"):
        assert row in done.stdout
    runs = {r["policy"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}
    scav = runs["scavenger"]
    assert (scav["scavenger_size"], scav["checkpoint_every_s"], scav["restart_s"]) == (4, 300, 45)
    assert scav["kills"] > 0 and scav["wasted_node_hours"] > 0
    assert (out / "scavenger" / "trainers.csv").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint-every", "0"], "--checkpoint-every"),
        (["--restart-cost", "-1"], "--restart-cost"),
        (["--scavenger-size", "0"], "--scavenger-size"),
    ],
)
def test_cli_refuses_bad_scavenger_options(tmp_path: Path, args: list[str], message: str) -> None:
    done = bftrainer("replay", "--policy", "scavenger", "--out", str(tmp_path / "o"), *args)
    assert done.returncode == 2
    assert message in done.stderr


# ---- Summit week 1 (evaluation data; skipped when absent) -------------------------------
TRACES = SHARED / "bftrainer-traces"
WEEK = TRACES / "summit_week1_node_events.csv.gz"
JOBS = TRACES / "hps-shufflenet-Jbnd-1000J.csv"


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.skipif(not (WEEK.exists() and JOBS.exists()), reason=f"{TRACES} is absent")
def test_milp_beats_the_scavenger_partition_on_summits_first_day() -> None:
    jobs = read_paper_jobs(JOBS)
    trace = load_trace(WEEK, nodes=slice(0, 1024))
    start = max(trace.start_s, jobs[0].submit_s)
    trace = trace.slice(start_s=start, end_s=start + 24 * 3600)
    milp = replay(trace, jobs, ReplayConfig(policy="milp", solver="dp")).summary
    for size in (None, 8):
        config = ReplayConfig(policy="scavenger", scavenger_size=size)
        scav = replay(trace, jobs, config).summary
        assert scav["utilization_efficiency"] < milp["utilization_efficiency"]
        assert scav["trainers_completed"] < milp["trainers_completed"]
